"""LoRA fine-tuning (model.lora, trainer/lora.py) on the tiny model: only adapters train, the reference is the
base with adapters off (no second model), checkpoints hold no base weights, resume is bit-exact and refuses
another base, async and sync saves write the same bytes, GRPO and a separate critic run."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.trainer.checkpoint_files import read_tree
from trainer import checkpoint as ckpt
from warden.errors import ConfigError

LORA = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _config(make_config, lora=None, **sections):
    extra = {"max_steps": 4, "run": {"run_id": "lora-run"}, "model": {"lora": {**LORA, **(lora or {})}}}
    for key, value in sections.items():
        extra[key] = {**extra.get(key, {}), **value} if isinstance(value, dict) else value
    return make_config(extra)[0]


def _trainer(cfg, run_dir, resume="never"):
    from trainer.core import PPOTrainer

    return PPOTrainer(cfg, str(run_dir), resume=resume)


def _base_state(trainer):
    """The frozen base's tensors (every parameter that is not an adapter), cloned."""
    return {n: p.detach().clone() for n, p in trainer.actor.named_parameters() if "lora_" not in n}


def _trained_state(trainer):
    """What the run trains: both optimizers' parameters, cloned, in order."""
    opts = [o for o in (trainer.actor_opt, trainer.critic_opt) if o is not None]
    return [p.detach().clone() for o in opts for g in o.param_groups for p in g["params"]]


# -- config -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lora", "sections", "key"),
    [
        ({"rank": 0}, {}, "model.lora.rank"),
        ({"alpha": 0}, {}, "model.lora.alpha"),
        ({"dropout": 1.0}, {}, "model.lora.dropout"),
        ({"critic": "both"}, {}, "model.lora.critic"),
        ({"target_modules": []}, {}, "model.lora.target_modules"),
        ({"target_modules": ["q_proj", "a b"]}, {}, "model.lora.target_modules[1]"),
        ({}, {"rollout": {"engine": "vllm"}}, "rollout.engine"),
        ({}, {"model": {"critic_path": "/nonexistent"}}, "model.critic_path"),
    ],
)
def test_bad_lora_settings_are_config_errors_naming_the_key(make_config, lora, sections, key):
    extra = {"model": {"lora": {**LORA, **lora}}}
    for name, value in sections.items():
        extra[name] = {**extra.get(name, {}), **value}
    with pytest.raises(ConfigError) as info:
        make_config(extra)
    assert f": {key}: " in str(info.value)


def test_shared_critic_is_refused_for_several_processes(make_config):
    from trainer.config import validate

    cfg = _config(make_config)
    with pytest.raises(ConfigError, match=re.escape("model.lora.critic: shared runs in one process")):
        validate(cfg, "<config>", 2)
    validate(_config(make_config, {"critic": "separate"}), "<config>", 2)


def test_target_modules_missing_from_the_base_is_a_config_error(make_config, tmp_path):
    cfg = _config(make_config, {"target_modules": ["no_such_proj"]})
    with pytest.raises(ConfigError, match=re.escape("model.lora.target_modules: ['no_such_proj'] do not fit the base")):
        _trainer(cfg, tmp_path / "run")


# -- training -----------------------------------------------------------------------------------
def test_lora_ppo_trains_only_adapters_and_the_reference_is_the_base_with_adapters_off(make_config, tmp_path):
    from trainer.algorithm import batched_logprobs, position_ids_from
    from trainer.lora import ReferencePolicy, SharedCritic
    from trainer.models import load_causal_lm

    cfg = _config(make_config, {"dropout": 0.1}, checkpoint={"every_steps": 0})
    trainer = _trainer(cfg, tmp_path / "run")
    try:
        # No reference model: the reference is a view of the actor's module, holding no tensor of its own.
        assert isinstance(trainer.ref, ReferencePolicy) and not isinstance(trainer.ref, torch.nn.Module)
        assert trainer.ref.models.peft is trainer.actor and isinstance(trainer.critic, SharedCritic)
        storages = {p.untyped_storage().data_ptr() for p in trainer.actor.parameters()}
        storages |= {p.untyped_storage().data_ptr() for p in trainer.critic.trained_parameters()}
        base_bytes = sum(p.numel() * p.element_size() for n, p in trainer.actor.named_parameters() if "lora_" not in n)
        held = sum(p.numel() * p.element_size() for n, p in trainer.actor.named_parameters()) + sum(
            p.numel() * p.element_size() for p in trainer.critic.value_head.parameters()
        )
        assert held < 1.5 * base_bytes  # one base (plus adapters), never two
        trained = {id(p) for o in (trainer.actor_opt, trainer.critic_opt) for g in o.param_groups for p in g["params"]}
        names = {id(p): n for n, p in trainer.actor.named_parameters()}
        assert all("lora_" in names[i] for i in trained if i in names)
        assert {id(p) for p in trainer.critic.value_head.parameters()} <= trained
        base_before, trained_before = _base_state(trainer), _trained_state(trainer)
        trainer.train(3)
        base_after, trained_after = _base_state(trainer), _trained_state(trainer)
        assert [n for n in base_before if not torch.equal(base_before[n], base_after[n])] == []
        changed = [
            i for i, (a, b) in enumerate(zip(trained_before, trained_after, strict=True)) if not torch.equal(a, b)
        ]
        assert len(changed) == len(trained_before)  # every adapter matrix and the value head moved

        # The reference's log-probs equal a freshly loaded base's, bit for bit, while the actor's differ.
        base = load_causal_lm(trainer.paths.actor, "float32", torch.device("cpu")).eval()
        ids = torch.randint(3, 300, (4, 12), generator=torch.Generator().manual_seed(5))
        mask = torch.ones_like(ids)
        args = (ids, mask, position_ids_from(mask), ids[:, 6:], 6, 1.0, 2)
        ref_lp, base_lp = batched_logprobs(trainer.ref, *args), batched_logprobs(base, *args)
        assert torch.equal(ref_lp, base_lp)
        assert not torch.equal(batched_logprobs(trainer.actor, *args), base_lp)
        assert all(p.requires_grad for p in _params(trainer))  # the switches left the trained set trainable
    finally:
        trainer.close()


def _params(trainer):
    return [p for o in (trainer.actor_opt, trainer.critic_opt) for g in o.param_groups for p in g["params"]]


def test_grpo_with_lora_has_no_critic_and_trains_the_adapter(make_config, tmp_path):
    cfg = _config(make_config, algorithm={"adv_estimator": "grpo"}, checkpoint={"every_steps": 2})
    trainer = _trainer(cfg, tmp_path / "run")
    try:
        assert trainer.critic is None and trainer.critic_opt is None
        base_before, trained_before = _base_state(trainer), _trained_state(trainer)
        results = trainer.train(2)
        assert "value_loss" not in results[-1].metrics
        base_after = _base_state(trainer)
        assert [n for n in base_before if not torch.equal(base_before[n], base_after[n])] == []
        assert not all(torch.equal(a, b) for a, b in zip(trained_before, _trained_state(trainer), strict=True))
    finally:
        trainer.close()
    files = read_tree(str(tmp_path / "run" / "checkpoints" / ckpt.step_dir_name(2)))
    assert not [f for f in files if f.startswith("critic/")]


def test_separate_critic_is_a_whole_model_trained_beside_the_adapters(make_config, tmp_path):
    from trainer.models import Critic

    cfg = _config(make_config, {"critic": "separate"}, checkpoint={"every_steps": 1})
    trainer = _trainer(cfg, tmp_path / "run")
    try:
        assert isinstance(trainer.critic, Critic)
        before = _trained_state(trainer)
        trainer.train(1)
        assert not all(torch.equal(a, b) for a, b in zip(before, _trained_state(trainer), strict=True))
    finally:
        trainer.close()
    resumed = _trainer(cfg, tmp_path / "run", resume="auto")
    try:
        assert resumed.step == 1
        assert all(torch.equal(a, b) for a, b in zip(_trained_state(trainer), _trained_state(resumed), strict=True))
    finally:
        resumed.close()


# -- checkpoints --------------------------------------------------------------------------------
def _tensor_files(path):
    return {rel: load_file(os.path.join(path, rel)) for rel in read_tree(path) if rel.endswith(".safetensors")}


def test_a_lora_checkpoint_holds_adapters_heads_and_the_base_digest_only(make_config, tmp_path):
    from trainer.lora import BASE_DIGEST_KEY, base_digest
    from trainer.models import load_causal_lm
    from trainer.train_state import ADAM_MOMENTS, estimate_state_bytes

    cfg = _config(make_config, checkpoint={"every_steps": 2})
    trainer = _trainer(cfg, tmp_path / "run")
    try:
        trainer.train(2)
        estimate = estimate_state_bytes(trainer)
        trained_bytes = sum(p.numel() * p.element_size() for p in _params(trainer))
    finally:
        trainer.close()
    path = str(tmp_path / "run" / "checkpoints" / ckpt.step_dir_name(2))
    tensors = _tensor_files(path)
    weights = {rel: t for rel, t in tensors.items() if rel.startswith(("actor/", "critic/"))}
    assert sorted(weights) == [
        "actor/adapter_model.safetensors",
        "critic/adapter_model.safetensors",
        "critic/value_head.safetensors",
    ]
    names = [n for rel in ("actor/adapter_model.safetensors", "critic/adapter_model.safetensors") for n in weights[rel]]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    base = load_causal_lm(trainer.paths.actor, "float32", torch.device("cpu"))
    base_names = set(base.state_dict())
    assert not [n for t in tensors.values() for n in t if n in base_names or n.endswith("embed_tokens.weight")]
    # What is saved is what the staging arena was sized for: the weights plus AdamW's two moments.
    weight_bytes = sum(t.numel() * t.element_size() for ts in weights.values() for t in ts.values())
    assert estimate == weight_bytes + ADAM_MOMENTS * trained_bytes
    base_bytes = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    assert estimate < base_bytes / 4
    state = json.loads(read_tree(path)[ckpt.STATE])
    assert state[BASE_DIGEST_KEY] == base_digest(base)
    adapter = json.loads(read_tree(path)["actor/adapter_config.json"])
    assert adapter["r"] == 4 and adapter["target_modules"] == ["q_proj", "v_proj"]


def _comparable(path):
    files = dict(read_tree(path))
    state = json.loads(files.pop(ckpt.STATE))
    state["config"]["checkpoint"].pop("async_save")
    files.pop(ckpt.MANIFEST)
    files[ckpt.STATE] = {k: v for k, v in state.items() if k not in ("config_digest", "genesis_nonce")}
    return files


def _run(make_config, run_dir, steps, mode="off", resume="never", **extra):
    cfg = _config(make_config, checkpoint={"every_steps": 2, "async_save": mode}, **extra)
    trainer = _trainer(cfg, run_dir, resume=resume)
    try:
        trainer.train(steps)
        return _trained_state(trainer), trainer
    finally:
        trainer.close()


def test_lora_async_and_sync_checkpoints_are_byte_identical_and_resume_is_bit_exact(make_config, tmp_path):
    straight, sync_trainer = _run(make_config, tmp_path / "sync", 4, "off")
    _, async_trainer = _run(make_config, tmp_path / "async", 4, "on")
    assert sync_trainer.saver.asynchronous is False and async_trainer.saver.asynchronous is True
    for step in (2, 4):
        name = ckpt.step_dir_name(step)
        assert _comparable(str(tmp_path / "async" / "checkpoints" / name)) == _comparable(
            str(tmp_path / "sync" / "checkpoints" / name)
        ), name
    _run(make_config, tmp_path / "resumed", 2, "on")
    resumed, trainer = _run(make_config, tmp_path / "resumed", 4, "on", resume="auto")
    assert trainer.resumed is not None and trainer.resumed.step == 2
    assert [i for i, (a, b) in enumerate(zip(straight, resumed, strict=True)) if not torch.equal(a, b)] == []
    assert _comparable(str(tmp_path / "resumed" / "checkpoints" / ckpt.step_dir_name(4))) == _comparable(
        str(tmp_path / "sync" / "checkpoints" / ckpt.step_dir_name(4))
    )


def test_a_resume_onto_another_base_is_refused_naming_both_digests(make_config, tiny_cache, tmp_path):
    """The same config and paths, but the base's weights changed in place since the checkpoint: the
    config guard cannot see it, the base digest does."""
    from trainer.lora import DIGEST_PREFIX

    _, assets = tiny_cache
    base = str(tmp_path / "base")
    shutil.copytree(assets.model_dir, base)
    paths = {"actor_path": base, "tokenizer_path": assets.tokenizer_dir}
    _run(make_config, tmp_path / "run", 2, model=paths)
    weights = os.path.join(base, "model.safetensors")
    tensors = load_file(weights)
    name = sorted(n for n in tensors if n.endswith("mlp.down_proj.weight"))[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1.0  # one weight of one layer
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError) as info:
        _run(make_config, tmp_path / "run", 4, resume="auto", model=paths)
    message = str(info.value)
    assert message.count(DIGEST_PREFIX) == 2 and "trained on the base model" in message and base in message


# -- warden export ------------------------------------------------------------------------------
def test_export_merges_the_adapter_into_its_base_signs_the_result_and_refuses_another_base(
    make_config, tiny_cache, tmp_path, monkeypatch
):
    from click.testing import CliRunner

    from sidecars.cli import cli
    from trainer.algorithm import position_ids_from
    from trainer.models import load_causal_lm
    from warden.signing.keys import generate_keypair, load_trusted_keys
    from warden.signing.verify import verify_checkpoint

    _, assets = tiny_cache
    keys = generate_keypair(tmp_path / "keys")
    monkeypatch.setenv("WARDEN_SIGNING_KEY", keys.private_key)
    cfg = _config(make_config, algorithm={"adv_estimator": "grpo"}, checkpoint={"every_steps": 2})
    trainer = _trainer(cfg, tmp_path / "run")
    ids = torch.randint(3, 300, (3, 10), generator=torch.Generator().manual_seed(9))
    mask = torch.ones_like(ids)
    try:
        trainer.train(2)
        with torch.no_grad():
            adapted = trainer.actor(input_ids=ids, attention_mask=mask, position_ids=position_ids_from(mask)).logits
    finally:
        trainer.close()
    checkpoint = str(tmp_path / "run" / "checkpoints" / ckpt.step_dir_name(2))
    out = str(tmp_path / "merged")
    runner = CliRunner()
    args = ["export", "--checkpoint", checkpoint, "--base", assets.model_dir, "--out", out]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out)) == [
        "config.json",
        "generation_config.json",
        "manifest.sha256.json",
        "model.safetensors",
    ]
    merged = load_causal_lm(out, "float32", torch.device("cpu")).eval()
    assert not [n for n in load_file(os.path.join(out, "model.safetensors")) if "lora_" in n]
    with torch.no_grad():
        logits = merged(input_ids=ids, attention_mask=mask, position_ids=position_ids_from(mask)).logits
    assert torch.allclose(logits, adapted, atol=1e-5, rtol=0)
    base = load_causal_lm(assets.model_dir, "float32", torch.device("cpu")).eval()
    with torch.no_grad():
        base_logits = base(input_ids=ids, attention_mask=mask, position_ids=position_ids_from(mask)).logits
    assert not torch.allclose(base_logits, adapted, atol=1e-5, rtol=0)  # the adapter changed the model
    verified = verify_checkpoint(out, load_trusted_keys(keys.public_key))
    assert verified.ok, verified.summary()
    assert (
        verified.provenance is not None and verified.provenance.run_id == "lora-run" and verified.provenance.step == 2
    )
    # The export of a signed checkpoint verifies it first: with --trust and no signature it is refused.
    again = runner.invoke(cli, [*args[:-1], str(tmp_path / "merged-2"), "--trust", keys.public_key])
    assert again.exit_code == 1 and "no valid signature" in again.output
    assert not os.path.exists(tmp_path / "merged-2")

    other = str(tmp_path / "other-base")
    shutil.copytree(assets.model_dir, other)
    tensors = load_file(os.path.join(other, "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1.0
    save_file(tensors, os.path.join(other, "model.safetensors"), metadata={"format": "pt"})
    refused = runner.invoke(cli, ["export", "--checkpoint", checkpoint, "--base", other, "--out", out + "-other"])
    assert refused.exit_code == 1, refused.output
    assert "trained on the base model sha256:" in refused.output and refused.output.count("sha256:") >= 2
    assert not os.path.exists(out + "-other")


@pytest.mark.slow
def test_lora_under_torchrun_two_processes_match_one(make_config, tmp_path):
    """DDP over the peft model (frozen base, separate critic): the first step matches one process."""
    import subprocess
    import sys

    from support import ROOT

    from warden import journal as ev

    lora = {**LORA, "critic": "separate"}
    _, config = make_config({"max_steps": 1, "checkpoint": {"every_steps": 1}, "model": {"lora": lora}})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = ["-m", "sidecars.cli", "train", "--config", config, "--run-dir"]
    for cmd in (
        [sys.executable, *train, str(tmp_path / "one")],
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            *train,
            str(tmp_path / "two"),
        ],
    ):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = {}
    for name in ("one", "two"):
        events = [e for e, _ in ev.JournalReader(str(tmp_path / name / "events.jsonl")).read_available()]
        first[name] = next(e.data for e in events if e.type == ev.STEP_COMPLETED and e.step == 1)
    for key in ("reward_mean", "kl", "policy_loss", "value_loss", "entropy", "grad_norm", "response_tokens"):
        assert abs(first["one"][key] - first["two"][key]) < 1e-5, (key, first["one"][key], first["two"][key])
    adapters = [
        load_file(str(tmp_path / name / "checkpoints" / ckpt.step_dir_name(1) / "actor" / "adapter_model.safetensors"))
        for name in ("one", "two")
    ]
    assert sorted(adapters[0]) == sorted(adapters[1])
    assert max(float((adapters[0][k] - adapters[1][k]).abs().max()) for k in adapters[0]) < 1e-4


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_lora_ppo_and_grpo_learn_the_digit_reward(make_config, tmp_path, estimator):
    """The tiny model's digit reward is learnt through the output layer: adapting lm_head (with q/v) is enough,
    full fine-tuning's rate is not needed (both reach most of the reward within 15 steps at lr 3e-2)."""
    lora = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "lm_head"]}
    sections = {"ppo": {"actor_lr": 3.0e-2}, "checkpoint": {"every_steps": 0}}
    if estimator == "grpo":
        sections.update(algorithm={"adv_estimator": "grpo"}, rollout={"n": 4})
    trainer = _trainer(_config(make_config, lora, **sections), tmp_path / "run")
    try:
        base = _base_state(trainer)
        rewards = [r.metrics["reward_mean"] for r in trainer.train(15)]
        assert [n for n, t in _base_state(trainer).items() if not torch.equal(t, base[n])] == []
    finally:
        trainer.close()
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.2 and last > 0.5, rewards


def _mutations(rng):
    """Seeded rewrites of a LoRA checkpoint (each leaves a consistent manifest): what integrity-only mode
    cannot tell from a real checkpoint, and the restore must refuse."""

    def tensors(rel, change):
        def apply(path):
            file = os.path.join(path, rel)
            data = load_file(file)
            change(data, sorted(data)[rng.randrange(len(data))])
            save_file(data, file, metadata={"format": "pt"})

        return apply

    def drop(data, name):
        del data[name]

    def extra(data, name):
        data[name + ".extra"] = data[name].clone()

    def grow(data, name):
        data[name] = torch.cat([data[name], data[name]])

    def widen(data, name):
        data[name] = data[name].double()

    def state(change):
        def apply(path):
            file = os.path.join(path, ckpt.STATE)
            with open(file, encoding="utf-8") as fh:
                doc = json.load(fh)
            change(doc)
            with open(file, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)

        return apply

    def remove(rel):
        return lambda path: os.unlink(os.path.join(path, rel))

    rels = ["actor/adapter_model.safetensors", "critic/adapter_model.safetensors", "critic/value_head.safetensors"]
    kinds = [drop, extra, grow, widen]
    out = [(f"{k.__name__} in {rel}", tensors(rel, k)) for rel in rels for k in kinds]
    out += [(f"remove {rel}", remove(rel)) for rel in rels]
    out += [
        ("no base digest", state(lambda d: d.pop("base_model_digest"))),
        ("base digest a number", state(lambda d: d.update(base_model_digest=7))),
    ]
    return out


def test_rewritten_lora_checkpoints_are_refused_never_loaded(make_config, tmp_path):
    """Integrity-only mode (the manifest rewritten too): each seeded rewrite of the adapters, heads or base digest
    ends in a refusal naming the file, never a resume with a partly restored adapter or a traceback.
    WARDEN_LORA_MUTATIONS=all runs every rewrite (default: a seeded sample of 4)."""
    import random

    from tests.trainer.checkpoint_files import write_manifest
    from trainer.resume import ResumeRefused

    rng = random.Random(int(os.environ.get("WARDEN_TAMPER_SEED", "34")))
    _run(make_config, tmp_path / "run", 2)
    path = str(tmp_path / "run" / "checkpoints" / ckpt.step_dir_name(2))
    pristine = str(tmp_path / "pristine")
    shutil.copytree(path, pristine)
    mutations = _mutations(rng)
    if os.environ.get("WARDEN_LORA_MUTATIONS") != "all":
        mutations = rng.sample(mutations, 4)
    loaded = []
    for what, mutate in mutations:
        shutil.rmtree(path)
        shutil.copytree(pristine, path)
        mutate(path)
        write_manifest(path)
        try:
            _run(make_config, tmp_path / "run", 2, resume="auto")
            loaded.append(what)
        except ResumeRefused as exc:
            assert "step-000000002" in str(exc), what
    assert loaded == []
