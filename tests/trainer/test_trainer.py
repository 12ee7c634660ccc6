"""The PPO trainer end to end on a tiny offline model (CPU, one thread)."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from support import free_port, http_get, parse_samples

from tests.trainer import checkpoint_files
from trainer.core import PPOTrainer, TrainingFailed, format_step_line
from warden import journal as ev


def journal(run_dir):
    return [e for e, _ in ev.JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def params(trainer):
    from trainer.models import unwrap

    out = {f"actor.{k}": v.detach().clone() for k, v in unwrap(trainer.actor).state_dict().items()}
    out.update({f"critic.{k}": v.detach().clone() for k, v in unwrap(trainer.critic).state_dict().items()})
    return out


@pytest.mark.slow
def test_reward_rises_on_the_synthetic_task(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 30, "checkpoint": {"every_steps": 0}})
    trainer = PPOTrainer(cfg, str(tmp_path / "run"))
    try:
        results = trainer.train()
    finally:
        trainer.close()
    rewards = [r.metrics["reward_mean"] for r in results]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards


def test_events_of_a_run(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 2})
    run_dir = str(tmp_path / "run")
    trainer = PPOTrainer(cfg, run_dir, config_name="events")
    trainer.train()
    trainer.close()
    events = journal(run_dir)
    types = [e.type for e in events]
    assert types[0] == ev.MODEL_LOADING and ev.RUN_STARTED in types and types[-1] == ev.RUN_FINISHED
    started = events[types.index(ev.RUN_STARTED)]
    assert started.data["config_digest"] == cfg.digest() and started.data["world_size"] == 1
    assert started.run_id.startswith("events-")
    steps = [e for e in events if e.type == ev.STEP_COMPLETED]
    assert [e.step for e in steps] == [1, 2]
    for key in ("reward_mean", "kl", "policy_loss", "value_loss", "entropy", "clip_fraction", "grad_norm"):
        assert isinstance(steps[0].data[key], float)
    snaps = [e for e in events if e.type == ev.REWARD_SNAPSHOT]
    assert len(snaps) == 2 and len(snaps[0].data["samples"]) == 3
    rewards = [s["reward"] for s in snaps[0].data["samples"]]
    assert rewards == sorted(rewards, reverse=True)
    saved = [e for e in events if e.type == ev.CHECKPOINT_SAVED]
    assert [e.step for e in saved] == [2] and os.path.isdir(saved[0].data["path"])
    assert events[-1].data["status"] == "completed"


def test_bit_exact_resume(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 4, "checkpoint": {"every_steps": 2}})
    straight = PPOTrainer(cfg, str(tmp_path / "a"))
    straight.train(4)
    expected = params(straight)
    straight.close()

    first = PPOTrainer(cfg, str(tmp_path / "b"))
    first.train(2)
    first.close()
    resumed = PPOTrainer(cfg, str(tmp_path / "b"), resume="auto")
    assert resumed.step == 2 and resumed.resumed is not None
    resumed.train(4)
    got = params(resumed)
    resumed.close()
    assert got.keys() == expected.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert different == []
    kinds = [e.type for e in journal(tmp_path / "b")]
    assert kinds.count(ev.RUN_STARTED) == 1 and kinds.count(ev.RUN_RESUMED) == 1


def _safetensors_header_ok(path):
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        json.loads(fh.read(size))


def test_checkpoints_hold_no_pickle(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 2})
    trainer = PPOTrainer(cfg, str(tmp_path / "run"))
    trainer.train()
    trainer.close()
    root = tmp_path / "run" / "checkpoints" / "step-000000002"
    files = checkpoint_files.tree_files(str(root))
    assert len(files) >= 8
    for rel in files:
        path = os.path.join(root, rel)
        assert not checkpoint_files.contains_pickle(path), rel
        with open(path, "rb") as fh:
            assert b"\x80\x04\x95" not in fh.read(64), rel  # a protocol-4 pickle frame opcode
        if rel.endswith(".json"):
            with open(path, encoding="utf-8") as fh:
                json.load(fh)
        else:
            assert rel.endswith(".safetensors"), f"unexpected file type {rel}"
            _safetensors_header_ok(path)


def test_resume_skips_a_tampered_checkpoint(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 4, "checkpoint": {"every_steps": 2}})
    run_dir = tmp_path / "run"
    trainer = PPOTrainer(cfg, str(run_dir))
    trainer.train(4)
    trainer.close()
    newest = run_dir / "checkpoints" / "step-000000004" / "critic" / "critic.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 1
    newest.write_bytes(bytes(data))
    resumed = PPOTrainer(cfg, str(run_dir), resume="auto")
    resumed.close()
    assert resumed.step == 2
    rejected = [e for e in journal(run_dir) if e.type == ev.CHECKPOINT_REJECTED]
    assert len(rejected) == 1 and "critic/critic.safetensors: sha256" in rejected[0].data["why"]


def test_metrics_endpoint_exposes_every_listed_metric(make_config, tmp_path):
    port = free_port()
    cfg, _ = make_config({"max_steps": 2, "run": {"metrics_port": port}})
    trainer = PPOTrainer(cfg, str(tmp_path / "run"))
    try:
        trainer.train()
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    finally:
        trainer.close()
    assert status == 200
    names = {name for name, _labels in parse_samples(body)}
    for name in (
        "warden_trainer_steps_total",
        "warden_trainer_step_duration_seconds_bucket",
        "warden_trainer_rollout_duration_seconds_bucket",
        "warden_trainer_generated_tokens_per_second",
        "warden_trainer_reward_mean",
        "warden_trainer_reward_max",
        "warden_trainer_kl",
        "warden_trainer_policy_loss",
        "warden_trainer_value_loss",
        "warden_trainer_entropy",
        "warden_trainer_clip_fraction",
        "warden_trainer_grad_norm",
        "warden_trainer_last_checkpoint_step",
        "warden_trainer_oom_events_total",
        "warden_trainer_run_info",
    ):
        assert name in names, name
    assert "warden_trainer_steps_total 2.0" in body
    assert "warden_trainer_last_checkpoint_step 2.0" in body


def test_oom_is_counted_emitted_and_skipped(make_config, tmp_path):
    cfg, _ = make_config(
        {"max_steps": 3, "oom": {"action": "skip", "raise_at_step": 2}, "checkpoint": {"every_steps": 0}}
    )
    trainer = PPOTrainer(cfg, str(tmp_path / "run"))
    results = trainer.train()
    trainer.close()
    assert [r.step for r in results] == [1, 2, 3]
    assert trainer.metrics.registry.get_sample_value("warden_trainer_oom_events_total", {"phase": "rollout"}) == 1
    ooms = [e for e in journal(tmp_path / "run") if e.type == ev.OOM]
    assert len(ooms) == 1 and ooms[0].step == 2 and ooms[0].data["action"] == "skip"


def test_oom_fail_stops_the_run(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 3, "oom": {"action": "fail", "raise_at_step": 1}})
    trainer = PPOTrainer(cfg, str(tmp_path / "run"))
    with pytest.raises(TrainingFailed, match="out of memory in rollout at step 1"):
        trainer.train()
    trainer.close()
    last = journal(tmp_path / "run")[-1]
    assert last.type == ev.RUN_FINISHED and last.data["status"] == "failed"


def test_console_line_format():
    line = format_step_line(
        12, {"reward_mean": 0.8123, "kl": 0.0041, "policy_loss": 0.3, "value_loss": 0.12, "tokens_per_second": 1900.0}
    )
    assert line == "step 12 | reward 0.81 | kl 0.004 | loss 0.42 | 1.9k tok/s"
