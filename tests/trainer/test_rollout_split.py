"""Rollout on its own devices (trainer/rollout_split.py): config rules, typed messages, weight buckets,
the version check, and a trainer process and a rollout process (HF engine) joined over gloo."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import subprocess
import sys

import pytest
import torch
from support import ROOT

from trainer import rollout_split as rs
from trainer.config import split_device_problem, validate
from warden.errors import ConfigError

UUID_A = "GPU-0123abcd-0000-1111-2222-333344445555"
UUID_B = "GPU-0123abcd-0000-1111-2222-333344446666"


def _with(cfg, run=None, **rollout):
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, **rollout))
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, **run)) if run else cfg


@pytest.mark.parametrize(
    ("devices", "uuids", "world", "ok"),
    [
        (["cpu"], (), 1, True),
        ([2, 3], (), 2, True),
        (["2"], (), 2, True),
        ([1], (), 2, False),  # a trainer rank's device
        ([2, 2], (), 1, False),  # duplicate
        ([UUID_B], (UUID_A,), 1, True),
        ([UUID_A], (UUID_A,), 1, False),  # shared with the trainer
        ([UUID_A], (), 1, False),  # UUIDs without the trainer's
        ([2], (UUID_A,), 1, False),  # indices with trainer UUIDs
        ([2, UUID_B], (UUID_A,), 1, False),  # mixed
        (["GPU-xyz"], (), 1, False),  # malformed UUID
        ([-1], (), 1, False),
        ([256], (), 1, False),
        (["cpu", 2], (), 1, False),
        ([True], (), 1, False),
        (["\u0663"], (), 1, False),  # an Arabic-Indic digit is no GPU index
    ],
)
def test_device_rules(devices, uuids, world, ok):
    assert (split_device_problem(tuple(devices), uuids, world) is None) == ok


def test_generated_index_sets_are_disjoint_from_trainer_ranks():
    rng = random.Random(34)
    for _ in range(300):
        world = rng.randint(1, 8)
        devices = tuple(rng.sample(range(12), rng.randint(1, 4)))
        problem = split_device_problem(devices, (), world)
        assert (problem is None) == (min(devices) >= world), (devices, world, problem)


def test_config_rules_name_their_key(make_config):
    cfg, _ = make_config()
    validate(_with(cfg, devices=("cpu",)))
    validate(_with(cfg, devices=(1, 2), engine="vllm", tensor_parallel_size=2, run={"device": "cuda"}))
    cases = [
        (dict(devices=(0,), run={"device": "cuda"}), "rollout.devices"),  # trainer rank 0's device
        (dict(devices=(1,)), "rollout.devices"),  # GPU devices with run.device cpu
        (dict(devices=("cpu",), run={"device": "cuda"}), "rollout.devices"),
        (dict(devices=(1, 2), run={"device": "cuda"}), "rollout.devices"),  # hf runs on one device
        (dict(devices=(1,), engine="vllm", tensor_parallel_size=2, run={"device": "cuda"}), "rollout.devices"),
        (dict(tensor_parallel_size=2), "rollout.tensor_parallel_size"),  # colocated
        (dict(devices=("cpu",), max_num_seqs=3), "rollout.max_num_seqs"),
        (dict(devices=("cpu",), tensor_parallel_size=0), "rollout.tensor_parallel_size"),
    ]
    for changes, key in cases:
        run = changes.pop("run", None)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate(_with(cfg, run, **changes))
    # micro batch divides batch: the trainer world's rule holds in the split layout too
    bad = dataclasses.replace(_with(cfg, devices=("cpu",)), ppo=dataclasses.replace(cfg.ppo, micro_batch_size=3))
    with pytest.raises(ConfigError, match=r"ppo\.micro_batch_size"):
        validate(bad)


def test_messages_round_trip_and_reject_malformed():
    req = rs.GenerateRequest(((1, 2, 3), (4,)), seed=7, offset=0, total=2, temperature=1.0, version=3)
    assert rs.GenerateRequest.from_data(req.to_data()) == req
    res = rs.GenerateResult(((5, 6),), ((1, 0),), ((-0.5, 0.0),), version=3)
    assert rs.GenerateResult.from_data(res.to_data()) == res
    with pytest.raises(rs.SplitError, match="prompts"):
        rs.GenerateRequest.from_data({**req.to_data(), "prompts": [["x"]]})
    with pytest.raises(rs.SplitError, match="mask"):
        rs.GenerateResult.from_data({**res.to_data(), "mask": [[1]]})


def test_buckets_round_trip_bit_exact():
    gen = torch.Generator().manual_seed(1)
    named = [(f"w{i}", torch.randn(*shape, generator=gen)) for i, shape in enumerate([(3, 5), (700,), (2, 2), (40, 9)])]
    named.append(("h", torch.randn(4, generator=gen).to(torch.bfloat16)))
    plan = rs.plan_buckets(named, bucket_bytes=1024, version=1)
    assert all(n <= 1024 or len([s for s in plan.slots if s.bucket == b]) == 1 for b, n in enumerate(plan.bucket_bytes))
    plan = rs.WeightPush.from_data(plan.to_data())
    out = rs.unpack(rs.pack_buckets(named, plan), plan)
    for name, tensor in named:
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_engine_refuses_stale_weights():
    weights = rs.EngineWeights()
    req = rs.GenerateRequest(((1,),), 0, 0, 1, 1.0, version=1)
    with pytest.raises(rs.StaleWeights):
        weights.check(req)  # nothing pushed yet: the weights on disk are never sampled from
    push = rs.WeightPush(2, (), ())
    weights.accept(push)
    weights.installed(push)
    with pytest.raises(rs.StaleWeights, match="version 1"):
        weights.check(req)  # the trainer expected an older version than the engine holds
    weights.check(dataclasses.replace(req, version=2))
    with pytest.raises(rs.StaleWeights):
        weights.accept(rs.WeightPush(2, (), ()))  # a push must be newer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_trainer_and_rollout_process_match_colocated(make_config, tiny_cache):
    """Rank 0 here (the trainer), rank 1 the rollout process: tokens equal the in-process HF engine's
    exactly, before and after a weight push; a request for an older version is refused."""
    import torch.distributed as dist

    from trainer.data import left_pad
    from trainer.models import load_causal_lm
    from trainer.rollout import HFRollout, SamplingPlan

    cfg, config_path = make_config({"rollout": {"devices": ["cpu"]}})
    _, assets = tiny_cache
    model_dir = assets.model_dir
    actor = load_causal_lm(model_dir, "float32", torch.device("cpu"))
    pad, stops = 0, [1]
    address = f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "trainer.rollout_split", "--model-dir", model_dir, "--config", config_path]
    cmd += ["--store", address, "--pad-id", str(pad), "--stop-ids", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        client = rs.SplitClient(rs.Link(address, 0, torch.device("cpu")), bucket_bytes=64 << 10)
        assert not dist.is_initialized()  # the link is a group of its own: the default group is untouched
        local = HFRollout(actor, cfg.rollout, stops, pad, None)
        prompts = [[5, 9, 12, 40], [7, 8], [33, 34, 35], [2, 100, 101, 102, 103]]
        ids, mask = left_pad(prompts, pad, None)
        for round_ in range(2):
            version = client.push(actor)  # after each update the engine gets the new weights
            req = rs.GenerateRequest(tuple(map(tuple, prompts)), 11 + round_, 0, len(prompts), 1.0, version)
            got = client.generate(req)
            want, want_mask = local.generate(ids, mask, SamplingPlan(11 + round_, 0, len(prompts), 1.0))
            assert got.tensors()[0].tolist() == want.tolist() and got.tensors()[1].tolist() == want_mask.tolist()
            with torch.no_grad():  # a stand-in for an optimizer update: every weight moves
                for p in actor.parameters():
                    p.add_(0.05 * torch.randn_like(p))
        with pytest.raises(rs.StaleWeights):
            client.generate(dataclasses.replace(req, version=version - 1))
        client.stop()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_split_trainer_equals_colocated(make_config, tmp_path):
    """PPOTrainer with rollout.devices: ["cpu"] (a rollout process, weights pushed after each update)
    equals the colocated run on the first steps' metrics within 1e-5 and on the token ids exactly."""
    from trainer.core import PPOTrainer

    runs = {}
    for name, devices in (("colocated", []), ("split", ["cpu"])):
        cfg, _ = make_config({"rollout": {"devices": devices}, "checkpoint": {"every_steps": 0}}, name=f"{name}.yaml")
        trainer = PPOTrainer(cfg, str(tmp_path / name), serve_metrics=False)
        tokens = []
        generate = trainer._generate

        def recording(ids, seed, temperature, generate=generate, tokens=tokens):
            rollout = generate(ids, seed, temperature)
            tokens.append(rollout.responses.tolist())
            return rollout

        trainer._generate = recording
        try:
            runs[name] = ([r.metrics for r in trainer.train(max_steps=3)], tokens)
        finally:
            trainer.close()
    from warden import journal as ev
    from warden.payloads import RunStarted

    events = [e for e, _ in ev.JournalReader(str(tmp_path / "split" / "events.jsonl")).read_available()]
    started = RunStarted.from_data(next(e.data for e in events if e.type == ev.RUN_STARTED))
    assert started.rollout_layout is not None and started.rollout_layout.mode == "split"
    (a, tok_a), (b, tok_b) = runs["colocated"], runs["split"]
    assert tok_a == tok_b and len(tok_a) == 3
    keys = ("reward_mean", "policy_loss", "value_loss", "kl", "entropy", "grad_norm")
    worst = {key: max(abs(ma[key] - mb[key]) for ma, mb in zip(a, b, strict=True)) for key in keys}
    print("split vs colocated, worst |difference| over 3 steps:", worst)
    assert all(value < 1e-5 for value in worst.values()), worst


def _first_steps(run_dir) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    from warden import journal as ev

    events = [e for e, _ in ev.JournalReader(str(run_dir / "events.jsonl")).read_available()]
    return [e.data for e in events if e.type == ev.STEP_COMPLETED]


@pytest.mark.slow
def test_two_trainer_ranks_and_a_rollout_process_equal_two_colocated_ranks(make_config, tmp_path):
    """torchrun with 2 trainer ranks and rollout.devices ["cpu"] (one rollout process for the whole
    batch, weights pushed by rank 0 after each update) equals the 2-rank colocated run within 1e-5."""
    for name, devices in (("colocated", []), ("split", ["cpu"])):
        _, config = make_config({"rollout": {"devices": devices}, "max_steps": 2}, name=f"{name}.yaml")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        cmd += ["-m", "sidecars.cli", "train", "--config", config, "--run-dir", str(tmp_path / name)]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    a, b = _first_steps(tmp_path / "colocated"), _first_steps(tmp_path / "split")
    assert len(a) == len(b) == 2
    from warden import journal as ev
    from warden.payloads import RunStarted

    events = [e for e, _ in ev.JournalReader(str(tmp_path / "split" / "events.jsonl")).read_available()]
    layout = RunStarted.from_data(next(e.data for e in events if e.type == ev.RUN_STARTED)).rollout_layout
    assert layout is not None and layout.mode == "split", layout
    keys = ("reward_mean", "policy_loss", "value_loss", "kl", "entropy", "grad_norm", "response_tokens")
    worst = {key: max(abs(ma[key] - mb[key]) for ma, mb in zip(a, b, strict=True)) for key in keys}
    print("2-rank split vs 2-rank colocated, worst |difference| over 2 steps:", worst)
    assert all(value < 1e-5 for value in worst.values()), worst


def test_layout_in_run_started_and_metrics(make_config, tmp_path):
    from prometheus_client import generate_latest

    from trainer.core import PPOTrainer
    from warden import journal as ev
    from warden.payloads import RolloutLayout, RunStarted

    cfg, _ = make_config()
    layout = rs.rollout_layout(
        _with(cfg, devices=(UUID_B,), engine="vllm", run={"gpu_uuids": (UUID_A,)}), torch.device("cuda", 0), 1
    )
    assert layout == RolloutLayout("split", "vllm", (UUID_B,), (UUID_A,), 1)
    assert RolloutLayout.from_data(layout.to_data()) == layout
    trainer = PPOTrainer(cfg, str(tmp_path / "run"), serve_metrics=False)
    try:
        trainer._serve_metrics()  # metrics_port 0: no server, the families are set
        scrape = generate_latest(trainer.metrics.registry).decode()
    finally:
        trainer.close()
    events = [e for e, _ in ev.JournalReader(str(tmp_path / "run" / "events.jsonl")).read_available()]
    started = RunStarted.from_data(next(e.data for e in events if e.type == ev.RUN_STARTED))
    assert started.rollout_layout == RolloutLayout("colocated", "hf", ("cpu",), ("cpu",), 1)
    assert 'warden_trainer_rollout_layout_info{engine="hf",mode="colocated"' in scrape


def test_vllm_engine_absent_is_a_config_error(make_config, monkeypatch):
    from trainer.rollout_vllm import import_vllm

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # import_vllm sets them; restored afterwards
    try:
        import_vllm()
    except ConfigError:
        pass
    else:
        pytest.skip("vllm is installed here")
    cfg, _ = make_config()
    cfg = _with(cfg, devices=(1, 2), engine="vllm", tensor_parallel_size=2, run={"device": "cuda"})
    validate(cfg)  # the layout itself is valid
    with pytest.raises(ConfigError, match=r"rollout\.engine: vllm cannot be imported"):
        rs.build_engine(cfg, "/nonexistent", torch.device("cpu"), [1], 0)


def test_a_rollout_process_that_dies_or_never_joins_is_an_error_not_a_hang(tmp_path):
    import time

    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    t0 = time.monotonic()
    with pytest.raises(rs.SplitError, match="exited with 3 before joining"):
        rs.join(f"127.0.0.1:{_free_port()}", torch.device("cpu"), dead, timeout_s=120)
    assert time.monotonic() - t0 < 60  # seen when it exits, not at the timeout
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with pytest.raises(rs.SplitError, match=r"did not join within rollout\.join_timeout_s = 1 s"):
            rs.join(f"127.0.0.1:{_free_port()}", torch.device("cpu"), silent, timeout_s=1)
        assert silent.wait(timeout=30) != 0  # killed, not left behind
    finally:
        if silent.poll() is None:
            silent.kill()


@pytest.mark.slow
def test_a_rollout_engine_that_cannot_load_fails_the_trainer_with_its_exit(make_config, tiny_cache):
    from trainer.models import load_causal_lm

    cfg, _ = make_config({"rollout": {"devices": ["cpu"]}})
    actor = load_causal_lm(tiny_cache[1].model_dir, "float32", torch.device("cpu"))
    with pytest.raises(rs.SplitError, match="exited with 1 before joining"):
        rs.SplitRollout(cfg, actor, str(tiny_cache[0] / "no-such-model"), [1], 0)
