"""Trusted resume: pick the newest checkpoint that verifies, load it bit-exactly.

Verification is the signer library's signature check when ``checkpoint.trusted_keys`` is
set (an unsigned checkpoint passes only with ``allow_unsigned``), else the trainer's own
SHA-256 manifest. Each checkpoint skipped emits ``checkpoint.rejected``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from safetensors.torch import load_file

from sidecars.errors import ConfigError
from trainer import checkpoint as ckpt
from trainer import events as ev
from trainer.models import CRITIC_WEIGHTS, unwrap

log = logging.getLogger("warden.trainer")


@dataclass(frozen=True)
class ResumeResult:
    step: int
    path: str
    verification: str


def verify_checkpoint(path: str, trusted_keys: str, allow_unsigned: bool) -> tuple[bool, str]:
    """(ok, how or why). Uses signatures when ``trusted_keys`` is set."""
    if trusted_keys:
        sig = path + ".sig"
        if os.path.exists(sig):
            return _verify_signature(path, sig, trusted_keys)
        if not allow_unsigned:
            return False, f"no signature {os.path.basename(sig)} and checkpoint.allow_unsigned is false"
    problems = ckpt.verify_manifest(path)
    if problems:
        return False, "manifest mismatch: " + "; ".join(problems[:5])
    return True, "manifest sha256 verified" + (" (unsigned)" if trusted_keys else "")


def _verify_signature(path: str, sig: str, trusted_keys: str) -> tuple[bool, str]:
    from sidecars.errors import WardenError
    from sidecars.signer import load_trusted_keys
    from sidecars.signer import verify_checkpoint as verify_signed

    try:
        result = verify_signed(path, load_trusted_keys(trusted_keys), signature_path=sig)
    except WardenError as exc:
        return False, f"signature check failed: {exc}"
    if not result.ok:
        return False, "signature: " + "; ".join(p.message for p in result.problems[:5])
    return True, f"signature verified (key {(result.key_id or '')[:16]})"


def find_resume_point(trainer: Any, mode: str) -> ResumeResult | None:
    """Loads the checkpoint to resume from into ``trainer``; None for a fresh start."""
    if mode == "never":
        return None
    root = trainer.paths.checkpoint_root
    if trainer.dist.is_main:
        ckpt.remove_stale_temporaries(root)
    explicit = mode != "auto"
    candidates = [ckpt.CheckpointRef(_step_of(mode), os.path.abspath(mode))] if explicit else ckpt.list_complete(root)
    cfg = trainer.cfg.checkpoint
    for ref in candidates:
        ok, how = verify_checkpoint(ref.path, cfg.trusted_keys, cfg.allow_unsigned)
        if ok:
            load_into(trainer, ref.path)
            return ResumeResult(trainer.step, ref.path, how)
        log.warning("skipping checkpoint %s: %s", ref.path, how)
        trainer.emit(ev.CHECKPOINT_REJECTED, {"path": ref.path, "why": how}, step=ref.step)
        if explicit:
            raise ConfigError(f"--resume {mode}: checkpoint does not verify: {how}")
    return None


def _step_of(path: str) -> int:
    match = ckpt.STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if not match or not os.path.isdir(path):
        raise ConfigError(f"--resume {path}: not a checkpoint directory named step-NNNNNNNNN")
    return int(match.group(1))


def _load_weights(directory: str) -> dict[str, Any]:
    tensors: dict[str, Any] = {}
    for file in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        tensors.update(load_file(file))
    return tensors


def load_into(trainer: Any, path: str) -> None:
    """Restores weights, optimizers, schedulers, data position, KL coefficient and RNG."""
    from trainer.core import restore_rng

    with open(os.path.join(path, ckpt.STATE), encoding="utf-8") as fh:
        state = json.load(fh)
    actor = unwrap(trainer.actor)
    missing, unexpected = actor.load_state_dict(_load_weights(os.path.join(path, "actor")), strict=False)
    tied = bool(getattr(actor.config, "tie_word_embeddings", False))
    if unexpected or (missing and not tied):
        raise ckpt.CheckpointError(
            f"{path}/actor: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    unwrap(trainer.critic).load_state_dict(load_file(os.path.join(path, "critic", CRITIC_WEIGHTS)))
    trainer.actor_opt.load_state_dict(ckpt.load_state(path, "optim_actor"))
    trainer.critic_opt.load_state_dict(ckpt.load_state(path, "optim_critic"))
    trainer.actor_sched.load_state_dict(state["scheduler_actor"])
    trainer.critic_sched.load_state_dict(state["scheduler_critic"])
    trainer.sampler.load_state(state["data_position"])
    trainer.kl_ctl.value = float(state["kl_coef"])
    trainer.step = int(state["step"])
    trainer.metrics.last_checkpoint_step.set(trainer.step)
    restore_rng(ckpt.load_state(path, "rng"))
