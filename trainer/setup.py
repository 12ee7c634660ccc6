"""Start-up checks that run before any model is loaded: paths and environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from trainer.config import PreflightConfig, TrainerConfig
from warden.errors import ConfigError


@dataclass(frozen=True)
class ResolvedPaths:
    """Absolute, checked paths the run uses."""

    actor: str
    critic: str
    tokenizer: str
    reward_model: str
    train_files: tuple[str, ...]
    checkpoint_root: str


def _readable_dir(key: str, path: str) -> None:
    if not os.path.isabs(path):
        raise ConfigError(f"{key}: {path!r} must be an absolute path")
    if not os.path.isdir(path):
        raise ConfigError(f"{key}: {path} does not exist or is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not readable by this user")


def _writable_root(key: str, path: str) -> None:
    """Creates ``path`` if needed and writes and removes a probe file (root ignores mode bits)."""
    if not os.path.isabs(path):
        raise ConfigError(f"{key}: {path!r} must be an absolute path")
    probe = os.path.join(path, f".warden-write-probe-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{key}: {path} is not writable ({exc.strerror}); fix the mount or pick another root"
        ) from None


def resolve_paths(cfg: TrainerConfig, run_dir: str) -> ResolvedPaths:
    """Fills in defaults (tiny offline assets, checkpoint root) and validates every path."""
    m = cfg.model
    actor, tokenizer, files = m.actor_path, m.tokenizer_path, cfg.data.train_files
    if m.tiny is not None:
        from trainer.assets import ensure_tiny_assets

        built = ensure_tiny_assets(m.tiny, seed=0)
        actor = actor or built.model_dir
        tokenizer = tokenizer or built.tokenizer_dir
        files = files or ((built.arithmetic_file,) if cfg.reward.rule == "arithmetic" else (built.prompts_file,))
    if not actor:
        raise ConfigError("model.actor_path: required (or set model.tiny to build a tiny offline model)")
    tokenizer = tokenizer or actor
    critic = m.critic_path or actor
    for key, path in (("model.actor_path", actor), ("model.critic_path", critic), ("model.tokenizer_path", tokenizer)):
        _readable_dir(key, path)
    uses_model = "model" in cfg.reward.functions if cfg.reward.functions else cfg.reward.kind == "model"
    if uses_model:
        _readable_dir("model.reward_model_path", m.reward_model_path)
        if cfg.reward.model_tokenizer_path:
            _readable_dir("reward.model_tokenizer_path", cfg.reward.model_tokenizer_path)
    if not files:
        raise ConfigError("data.train_files: at least one prompt file is required")
    from trainer.data import check_readable_files

    check_readable_files(tuple(files))
    check_readable_files(cfg.validation.files, "validation.files")
    root = cfg.checkpoint.root or os.path.join(run_dir, "checkpoints")
    resolved = ResolvedPaths(actor, critic, tokenizer, m.reward_model_path, tuple(files), root)
    if cfg.preflight.check_paths:
        # Child-process probes with a deadline first: a hung mount cannot hang the start.
        probe_paths(resolved, cfg.preflight.deadline_seconds)
    _writable_root("checkpoint.root", root)
    return resolved


def probe_paths(paths: ResolvedPaths, deadline: float) -> None:
    """Probes every path in a child process with a deadline (a hung NFS mount cannot hang
    the trainer's start); raises ConfigError naming each unhealthy path and the reason."""
    from warden.paths import preflight

    root = paths.checkpoint_root
    while not os.path.isdir(root) and os.path.dirname(root) != root:
        root = os.path.dirname(root)  # not created yet: its parent must take the write
    targets: dict[str, tuple[str, bool]] = {
        "model": (paths.actor, False),
        "tokenizer": (paths.tokenizer, False),
        "checkpoint root": (root, True),
    }
    if paths.critic != paths.actor:
        targets["critic"] = (paths.critic, False)
    for i, file in enumerate(paths.train_files):
        targets[f"data {i}"] = (os.path.dirname(file), False)
    problems = preflight(targets, deadline=deadline)
    if problems:
        raise ConfigError("preflight: " + "; ".join(str(p) for p in problems))


def check_environment(cfg: PreflightConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Checks required variables; returns the effective ``NCCL_*`` settings for run.started.

    Raises ConfigError naming every missing or wrong variable at once.
    """
    env = dict(os.environ if environ is None else environ)
    problems = []
    for name, pattern in cfg.required_env.items():
        value = env.get(name)
        if not value:
            problems.append(f"{name} is not set")
        elif pattern and not re.fullmatch(pattern, value):
            problems.append(f"{name}={value!r} does not match {pattern!r}")
    if problems:
        raise ConfigError("preflight.required_env: " + "; ".join(problems) + " (set them in the job script)")
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}
