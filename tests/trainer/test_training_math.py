"""Issue 20: KL in GRPO and as a loss, GRPO without a critic, fp32 master weights, non-finite steps."""

from __future__ import annotations

import os

import pytest
import torch

from trainer import ppo
from trainer.core import PPOTrainer, format_step_line
from trainer.models import unwrap
from warden import journal as ev


def journal(run_dir):
    return [e for e, _ in ev.JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def actor_params(trainer):
    return {k: v.detach().clone() for k, v in unwrap(trainer.actor).state_dict().items()}


def _run(make_config, tmp_path, name, extra, steps):
    cfg, _ = make_config(extra, name=f"{name}.yaml")
    trainer = PPOTrainer(cfg, str(tmp_path / name), resume="never")
    try:
        results = trainer.train(steps)
        return trainer, results, actor_params(trainer)
    finally:
        trainer.close()


GRPO = {"algorithm": {"adv_estimator": "grpo", "kl_kind": "k1"}, "rollout": {"n": 4}, "checkpoint": {"every_steps": 0}}


def test_grpo_kl_coef_reaches_the_update(make_config, tmp_path):
    """kl_coef 0 and 1 gave identical GRPO runs: the penalty never reached the advantages."""
    runs = {}
    for coef in (0.0, 1.0):
        extra = {**GRPO, "algorithm": {**GRPO["algorithm"], "kl_coef": coef}}
        _, results, params = _run(make_config, tmp_path, f"coef{int(coef)}", extra, 2)
        runs[coef] = (results, params)
    # step 1: the actor is the reference, KL is 0, so both runs take the same first update
    assert runs[0.0][0][0].metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert runs[1.0][0][1].metrics["kl"] != 0.0
    moved = [k for k in runs[0.0][1] if not torch.equal(runs[0.0][1][k], runs[1.0][1][k])]
    assert moved, "kl_coef 0 and 1 gave the same weights after a step with non-zero KL"


def test_grpo_trains_no_critic_and_kl_loss_is_reported(make_config, tmp_path):
    extra = {**GRPO, "ppo": {"use_kl_loss": True, "kl_loss_coef": 0.5}, "checkpoint": {"every_steps": 2}}
    trainer, results, _ = _run(make_config, tmp_path, "grpo", extra, 2)
    assert trainer.critic is None and trainer.critic_opt is None
    events = journal(tmp_path / "grpo")
    assert [e.data["kind"] for e in events if e.type == ev.MODEL_LOADING] == ["tokenizer", "actor", "reference"]
    m = results[1].metrics
    assert "value_loss" not in m and "critic/vf_loss" not in m
    assert m["actor/kl_loss"] == m["kl_loss"] and m["kl_loss"] > 0
    assert format_step_line(2, m).split(" | ")[3] == f"loss {m['policy_loss']:.2f}"
    checkpoint = tmp_path / "grpo" / "checkpoints" / "step-000000002"
    assert not (checkpoint / "critic").exists() and not (checkpoint / "optim_critic.json").exists()
    resumed = PPOTrainer(trainer.cfg, str(tmp_path / "grpo"), resume="auto")
    resumed.close()
    assert resumed.step == 2 and resumed.critic is None


def test_kl_loss_hand_values_and_gradient():
    logprob = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -1.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss = ppo.kl_loss(logprob, ref, mask, "k1")
    assert float(loss.detach()) == pytest.approx((0.5 + 0.0) / 2)
    k3 = ppo.kl_loss(logprob, ref, mask, "low-var-kl")
    d = torch.tensor(-0.5)  # ref - logprob of the first token
    assert float(k3) == pytest.approx(float((torch.exp(d) - 1 - d) / 2))
    k3.backward()
    assert logprob.grad[0, 0] > 0 and logprob.grad[0, 2] == 0  # descending the loss lowers logprob toward ref


def test_bf16_keeps_fp32_master_weights_so_small_updates_land(make_config, tmp_path):
    """Pure bf16 weights moved 2% of elements at lr 1e-6; fp32 masters move (nearly) all that get gradient."""
    extra = {"model": {"dtype": "bfloat16"}, "ppo": {"actor_lr": 1e-6, "epochs": 1}, "checkpoint": {"every_steps": 0}}
    cfg, _ = make_config(extra)
    trainer = PPOTrainer(cfg, str(tmp_path / "bf16"), resume="never")
    try:
        before = actor_params(trainer)
        trainer.train(1)
        after = actor_params(trainer)
        assert all(p.dtype == torch.float32 for p in trainer.actor.parameters())
        assert trainer.precision.dtype == torch.bfloat16
        assert next(trainer.rollout.model.parameters()).dtype == torch.bfloat16
        layers = [k for k in before if ".layers." in k and k.endswith("proj.weight")]
        moved = sum(int((before[k] != after[k]).sum()) for k in layers)
        total = sum(before[k].numel() for k in layers)
        assert moved / total > 0.9, moved / total
        synced = dict(trainer.rollout.model.named_parameters())
        name = layers[0]
        assert torch.equal(synced[name], after[name].to(torch.bfloat16))  # the rollout copy follows
    finally:
        trainer.close()


def test_non_finite_gradients_skip_the_step(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 2, "checkpoint": {"every_steps": 0}})
    trainer = PPOTrainer(cfg, str(tmp_path / "nan"), resume="never")
    try:
        before = actor_params(trainer)
        first = next(unwrap(trainer.actor).parameters())
        handle = first.register_hook(lambda grad: grad * float("nan"))
        result = trainer.train_step()
        handle.remove()
        assert all(torch.equal(before[k], v) for k, v in actor_params(trainer).items()), "a NaN step was applied"
        updates = cfg.ppo.epochs * (cfg.ppo.train_batch_size * cfg.rollout.n // cfg.ppo.mini_batch_size)
        assert result.metrics["skipped_updates"] == updates
        skipped = trainer.metrics.registry.get_sample_value("warden_trainer_skipped_updates_total")
        assert skipped == updates and trainer.skipped_updates == updates
        trainer.train_step()
        after = actor_params(trainer)
        assert all(torch.isfinite(v).all() for v in after.values())
        assert any(not torch.equal(before[k], after[k]) for k in before), "the next finite step must update"
    finally:
        trainer.close()
    events = journal(tmp_path / "nan")
    assert [(e.step, e.data["skipped"]) for e in events if e.type == ev.UPDATE_SKIPPED] == [(1, updates)]
