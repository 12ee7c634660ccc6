"""Config validation: one test per rule; errors exit 2 and name the key."""

from __future__ import annotations

import sys

import pytest
from support import run_warden

from warden.errors import ConfigError


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"ppo": {"train_batch_size": 0}}, "ppo.train_batch_size"),
        ({"ppo": {"mini_batch_size": 64}}, "ppo.mini_batch_size"),
        ({"ppo": {"mini_batch_size": 6}}, "ppo.mini_batch_size"),
        ({"ppo": {"micro_batch_size": 3}}, "ppo.micro_batch_size"),
        ({"ppo": {"clip_ratio_low": 1.5}}, "ppo.clip_ratio_low"),
        ({"ppo": {"clip_ratio_high": -0.1}}, "ppo.clip_ratio_high"),
        ({"ppo": {"clip_ratio_c": 1.0}}, "ppo.clip_ratio_c"),
        ({"ppo": {"loss_agg_mode": "token-sum"}}, "ppo.loss_agg_mode"),
        ({"algorithm": {"adv_estimator": "reinforce"}}, "algorithm.adv_estimator"),
        ({"algorithm": {"kl_kind": "k9"}}, "algorithm.kl_kind"),
        ({"rollout": {"engine": "sglang"}}, "rollout.engine"),
        ({"oom": {"action": "ignore"}}, "oom.action"),
        ({"ppo": {"actor_lrr": 1}}, "ppo.actor_lrr"),
        ({"ppo": {"actor_lr": "fast"}}, "ppo.actor_lr"),
        ({"model": {"actor_path": "relative/model"}}, "model.actor_path"),
        ({"model": {"tokenizer_path": "/does/not/exist"}}, "model.tokenizer_path"),
        ({"data": {"train_files": ["/does/not/exist.jsonl"]}}, "data.train_files[0]"),
        ({"validation": {"every_steps": 2, "files": ["held-out.jsonl"]}}, "validation.files[0]"),
        ({"validation": {"every_steps": 2}}, "validation.files"),
        ({"reward": {"functions": {"model": 1.0}}}, "model.reward_model_path"),
        ({"reward": {"functions": {"../evil:score": 1.0}}}, "reward.functions.../evil:score"),
        ({"data": {"truncation": "middle"}}, "data.truncation"),
        ({"rollout": {"static_cache": "on"}}, "rollout.static_cache"),
        ({"ppo": {"kl_loss_type": "k9"}}, "ppo.kl_loss_type"),
    ],
)
def test_each_rule_names_its_key(make_config, tmp_path, extra, key):
    from trainer.setup import resolve_paths

    with pytest.raises(ConfigError) as info:
        cfg, _ = make_config(extra)
        resolve_paths(cfg, str(tmp_path / "run"))
    assert key in str(info.value)
    assert info.value.exit_code == 2


def test_world_size_divisibility():
    from trainer.config import TrainerConfig, validate

    with pytest.raises(ConfigError, match=r"ppo\.train_batch_size: .* not divisible by the world size 3"):
        validate(TrainerConfig(), world_size=3)


def test_checkpoint_root_must_be_writable(make_config, tmp_path):
    from trainer.setup import resolve_paths

    cfg, _ = make_config({"checkpoint": {"root": "/proc/warden-ckpt"}})
    with pytest.raises(ConfigError, match=r"checkpoint root /proc: .*probe file"):
        resolve_paths(cfg, str(tmp_path))


def test_required_env_names_each_variable():
    from trainer.config import PreflightConfig
    from trainer.setup import check_environment

    cfg = PreflightConfig(required_env={"NCCL_SOCKET_IFNAME": "eth.*", "NCCL_IB_HCA": ""})
    with pytest.raises(ConfigError) as info:
        check_environment(cfg, {"NCCL_SOCKET_IFNAME": "lo"})
    assert "NCCL_SOCKET_IFNAME='lo' does not match" in str(info.value) and "NCCL_IB_HCA is not set" in str(info.value)
    ok = check_environment(cfg, {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5", "PATH": "/bin"})
    assert ok == {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth0"}


def test_cli_exits_2_before_loading_any_model(make_config, tmp_path):
    _, path = make_config()
    run_dir = tmp_path / "run"
    result = run_warden("train", "--config", path, "--run-dir", str(run_dir), "--set", "ppo.mini_batch_size=5")
    assert result.returncode == 2, result.stderr
    assert "ppo.mini_batch_size" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "events.jsonl").exists()
    bad_set = run_warden("train", "--config", path, "--run-dir", str(run_dir), "--set", "novalue")
    assert bad_set.returncode == 2 and "expected KEY=VALUE" in bad_set.stderr


def test_preflight_names_a_read_only_checkpoint_root(make_config, tmp_path):
    """The trainer's path preflight (child-process probes) refuses a read-only mount."""
    import shutil
    import subprocess

    from support import IN_CI

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        if IN_CI:
            pytest.fail("unshare -m is needed for this test")
        pytest.skip("unshare -m not available")
    _, path = make_config()
    ro = tmp_path / "ro"
    (ro / "checkpoints").mkdir(parents=True)
    script = (
        f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
        f"exec {sys.executable} -m sidecars.cli train --config {path} --run-dir {tmp_path / 'run'} "
        f"--set checkpoint.root={ro / 'checkpoints'}"
    )
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "checkpoint root" in result.stderr and "read-only file system (EROFS)" in result.stderr


# -- issue 20: every numeric key has a range; YAML 1.2 numbers; torchrun-aware batch rules ------------
def _every_key_config():
    """A config in which every optional numeric key is present (tiny model, stop ids, reward weights)."""
    import dataclasses

    from trainer.config import LoraConfig, RewardConfig, RolloutConfig, TinyAssets, TrainerConfig

    cfg = TrainerConfig()
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, tiny=TinyAssets(), lora=LoraConfig()),
        rollout=RolloutConfig(stop_token_ids=(7,), devices=(2,)),
        reward=RewardConfig(functions={"digits": 1.0}),
        snapshot=dataclasses.replace(cfg.snapshot, min_reward=0.5),
    )


def test_every_numeric_key_has_a_range():
    from trainer.config import RANGES, numeric_values

    keys = {key for key, _, _ in numeric_values(_every_key_config())}
    assert keys - set(RANGES) == set()
    assert set(RANGES) - keys == set(), "a range for a key that does not exist"


def _outside(rng):
    if rng.lo is not None:
        return rng.lo if rng.lo_open else rng.lo - 1
    if rng.hi is not None:
        return rng.hi if rng.hi_open else rng.hi + 1
    return float("nan")


def _with(cfg, key, value):
    import dataclasses

    head, _, rest = key.partition(".")
    node = getattr(cfg, head)
    if not rest:
        if isinstance(node, tuple):
            value = (value,)
        elif hasattr(node, "items"):
            value = {k: value for k in node}
        elif isinstance(node, int) and float(value).is_integer():
            value = int(value)
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _with(node, rest, value)})


def _range_cases():
    from trainer.config import RANGES

    return sorted(RANGES.items())


@pytest.mark.parametrize(("key", "rng"), _range_cases(), ids=[k for k, _ in _range_cases()])
def test_each_range_rule_exits_2_naming_the_key(key, rng):
    from trainer.config import validate

    bad = _with(_every_key_config(), key, _outside(rng))
    with pytest.raises(ConfigError) as info:
        validate(bad)
    assert key in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("ppo.actor_lr=-1", "ppo.actor_lr"),
        ("algorithm.kl_coef=-1", "algorithm.kl_coef"),
        ("rollout.top_p=2", "rollout.top_p"),
        ("ppo.value_clip=-1", "ppo.value_clip"),
        ("ppo.warmup_steps=-5", "ppo.warmup_steps"),
        ("rollout.top_k=-3", "rollout.top_k"),
        ("data.max_prompt_tokens=0", "data.max_prompt_tokens"),
        ("ppo.grad_clip=0", "ppo.grad_clip"),
        ("ppo.grad_clip=-1", "ppo.grad_clip"),
        ("ppo.actor_lr=.nan", "ppo.actor_lr"),
    ],
)
def test_the_reported_gaps_are_config_errors(make_config, override, key):
    from trainer.config import load_config

    _, path = make_config()
    with pytest.raises(ConfigError) as info:
        load_config(path, [override])
    assert key in str(info.value) and info.value.exit_code == 2


def test_set_parses_yaml_1_2_numbers(make_config):
    from trainer.config import load_config

    _, path = make_config()
    cfg = load_config(path, ["ppo.actor_lr=1e-5", "ppo.critic_lr=3E-4", "algorithm.kl_coef=+2.5e-2"])
    assert (cfg.ppo.actor_lr, cfg.ppo.critic_lr, cfg.algorithm.kl_coef) == (1e-5, 3e-4, 0.025)
    assert isinstance(cfg.ppo.actor_lr, float)


def test_config_file_numbers_in_exponent_form(tmp_path):
    from trainer.config import yaml_load

    assert yaml_load("a: 1e-5\nb: 10\nc: 1.5\nd: '1e-5'\n") == {"a": 1e-5, "b": 10, "c": 1.5, "d": "1e-5"}


def test_cli_negative_lr_exits_2_without_traceback(make_config, tmp_path):
    _, path = make_config()
    result = run_warden("train", "--config", path, "--run-dir", str(tmp_path / "run"), "--set", "ppo.actor_lr=-1")
    assert result.returncode == 2, result.stderr
    assert "ppo.actor_lr" in result.stderr and "Traceback" not in result.stderr


def test_minibatch_must_split_over_torchrun_ranks(make_config, monkeypatch):
    """mini_batch_size=1 under two processes passed validation, then crashed rank 1."""
    import dataclasses

    from trainer.config import TrainerConfig, load_config, validate

    cfg = TrainerConfig()
    one = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, mini_batch_size=1, micro_batch_size=1))
    validate(one, world_size=1)
    with pytest.raises(ConfigError, match=r"ppo\.mini_batch_size: must be divisible by the world size 2"):
        validate(one, world_size=2)
    _, path = make_config({"ppo": {"mini_batch_size": 1, "micro_batch_size": 1}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"ppo\.mini_batch_size"):
        load_config(path)  # before any rank starts work: load_config reads torchrun's WORLD_SIZE


def test_a_config_with_reward_functions_has_a_digest(tmp_path):
    """reward.functions is a read-only mapping after loading; to_dict/digest once failed on it at start."""
    path = tmp_path / "train.yaml"
    path.write_text("version: 1\nreward:\n  functions: {'my_rewards:score': 0.5, digits: 2.0}\n")
    from trainer.config import load_config

    cfg = load_config(str(path))
    assert cfg.to_dict()["reward"]["functions"] == {"my_rewards:score": 0.5, "digits": 2.0}
    assert len(cfg.digest()) == 64
