"""Issue 20: a resume with a changed config is refused (exit 2, naming the keys) unless asked for."""

from __future__ import annotations

import os

import pytest

from trainer.core import PPOTrainer
from trainer.train_state import config_changes
from warden import journal as ev
from warden.errors import ConfigError


def journal(run_dir):
    return [e for e, _ in ev.JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def test_changed_keys_ignore_operational_ones():
    old = {"ppo": {"actor_lr": 1e-4, "epochs": 1}, "max_steps": 4, "checkpoint": {"every_steps": 2}}
    new = {"ppo": {"actor_lr": 1e-5, "epochs": 1}, "max_steps": 9, "checkpoint": {"every_steps": 5}}
    assert config_changes(old, "d1", new, "d2") == ["ppo.actor_lr"]
    assert config_changes(old, "d1", old, "d1") == []
    assert config_changes(None, "d1", new, "d2") == ["<config digest>"]  # a checkpoint that kept only the digest
    assert config_changes(None, "d2", new, "d2") == []


@pytest.fixture
def saved_run(make_config, tmp_path):
    cfg, _ = make_config({"max_steps": 2, "checkpoint": {"every_steps": 2}}, name="base.yaml")
    run_dir = str(tmp_path / "run")
    trainer = PPOTrainer(cfg, run_dir)
    trainer.train(2)
    trainer.close()
    return run_dir


CHANGES = {
    "ppo": {"actor_lr": 1e-5, "train_batch_size": 4, "mini_batch_size": 8},
    "algorithm": {"kl_coef": 0.5, "adv_estimator": "grpo"},
    "run": {"seed": 11},
}


def test_resume_with_a_changed_config_is_refused_naming_the_keys(make_config, saved_run):
    cfg, _ = make_config({"max_steps": 2, "checkpoint": {"every_steps": 2}, **CHANGES}, name="changed.yaml")
    with pytest.raises(ConfigError) as info:
        PPOTrainer(cfg, saved_run, resume="auto")
    message = str(info.value)
    assert info.value.exit_code == 2
    for key in ("ppo.actor_lr", "ppo.train_batch_size", "algorithm.kl_coef", "algorithm.adv_estimator", "run.seed"):
        assert key in message, key
    assert "--resume-with-changes" in message
    assert ev.RUN_RESUMED not in [e.type for e in journal(saved_run)]


def test_unchanged_training_keys_resume_without_the_flag(make_config, saved_run):
    cfg, _ = make_config({"max_steps": 8, "checkpoint": {"every_steps": 4}}, name="longer.yaml")
    trainer = PPOTrainer(cfg, saved_run, resume="auto")
    trainer.close()
    resumed = [e for e in journal(saved_run) if e.type == ev.RUN_RESUMED][-1]
    assert trainer.step == 2 and resumed.data["changed_keys"] == []


def test_resume_with_changes_applies_the_new_values(make_config, saved_run):
    extra = {"ppo": {"actor_lr": 1e-5}, "algorithm": {"kl_coef": 0.5}}
    cfg, _ = make_config({"max_steps": 3, "checkpoint": {"every_steps": 2}, **extra}, name="changed.yaml")
    trainer = PPOTrainer(cfg, saved_run, resume="auto", resume_with_changes=True)
    try:
        assert trainer.step == 2
        assert [g["lr"] for g in trainer.actor_opt.param_groups] == [1e-5]
        assert trainer.kl_ctl.value == 0.5
        result = trainer.train(3)[0]
        assert result.metrics["lr"] == 1e-5 and result.metrics["kl_coef"] == 0.5
    finally:
        trainer.close()
    resumed = [e for e in journal(saved_run) if e.type == ev.RUN_RESUMED][-1]
    assert resumed.data["changed_keys"] == ["algorithm.kl_coef", "ppo.actor_lr"]
    assert resumed.data["config_digest"] == cfg.digest()
    assert resumed.data["config"]["ppo"]["actor_lr"] == 1e-5
