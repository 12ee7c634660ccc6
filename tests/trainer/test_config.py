"""Config validation: one test per rule; errors exit 2 and name the key."""

from __future__ import annotations

import sys

import pytest
from support import run_warden

from sidecars.errors import ConfigError


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
