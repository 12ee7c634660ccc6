"""Everything a checkpoint holds of a run, in one place: what is saved, what is restored, RNG.

:func:`fill_checkpoint` writes the trainer's state into a checkpoint directory (weights with
safetensors, optimizer and RNG state through :func:`trainer.checkpoint.save_state`, the
rest as JSON in ``trainer_state.json``); :func:`load_into` restores it from bytes
:mod:`trainer.verified_load` has checked; :func:`capture_rng` / :func:`restore_rng` carry
the Python, NumPy and torch generators without pickle.

The resume guard: ``trainer_state.json`` records the config (and its digest). A resume
whose config differs in a key that shapes training (:func:`config_changes`; operational
keys such as ports, ``max_steps`` or checkpoint cadence do not count) is refused with
exit 2 listing the changed keys, unless the trainer was built with
``resume_with_changes``: then the new values apply (learning rates, KL coefficient, seed,
batch shapes, estimator) and ``run.resumed`` carries the new digest and the changed keys.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer import checkpoint as ckpt
from trainer import fsdp, lora
from trainer.models import CRITIC_WEIGHTS, save_critic, save_pretrained_files, unwrap, write_critic_config
from trainer.verified_load import CheckpointRejected, VerifiedCheckpoint
from warden.errors import ConfigError, quote_untrusted
from warden.runid import valid_genesis_nonce

RESUME_NEUTRAL = (
    "run.metrics_port",
    "run.metrics_listen",
    "run.console",
    "run.torch_threads",
    "run.gpu_uuids",
    "run.device",
    "run.run_id",
    "model.tiny.cache_dir",
    "rollout.progress",
    "rollout.static_cache",
    "snapshot.",
    "checkpoint.",
    "oom.",
    "preflight.",
    "validation.",
    "max_steps",
    "log_every",
    "parallel.",
)
"""Keys (or prefixes ending in ``.``) that a resume may change freely: they do not shape training."""


# -- RNG ----------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    py = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {
            "key": str(np_state[0]),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
            "state": torch.from_numpy(np_state[1].astype(np.int64)),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        (n["key"], n["state"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -- the resume guard (pure) ------------------------------------------------------------------
def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values. Pure."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _neutral(key: str) -> bool:
    return any(key == n or (n.endswith(".") and key.startswith(n)) for n in RESUME_NEUTRAL)


def config_changes(saved: Any, saved_digest: Any, current: dict[str, Any], current_digest: str) -> list[str]:
    """The training keys that differ between a checkpoint's config and ``current``, sorted. Pure.

    ``saved`` None (a checkpoint that recorded only the digest): ``["<config digest>"]`` when
    the digests differ, since the keys cannot be named.
    """
    if not isinstance(saved, dict):
        return [] if saved_digest in (None, current_digest) else ["<config digest>"]
    old, new = flatten(saved), flatten(current)
    keys = (set(old) | set(new)) - {k for k in set(old) | set(new) if _neutral(k)}
    return sorted(k for k in keys if old.get(k) != new.get(k))


def describe_changes(saved: Any, current: dict[str, Any], keys: list[str]) -> str:
    if not isinstance(saved, dict):
        return "the config digest (the checkpoint predates per-key recording, so the keys cannot be named)"
    old, new = flatten(saved), flatten(current)
    return ", ".join(f"{k} {quote_untrusted(old.get(k), 40)} -> {new.get(k, '?')}" for k in keys)


# -- save -------------------------------------------------------------------------------------
def fill_checkpoint(trainer: Any, writer: ckpt.CheckpointSink, tiles: Callable[[Any], None] | None = None) -> None:
    """Serialises ``trainer``'s state into the checkpoint being written (every byte hashed in memory).

    ``tiles`` set (an fsdp2 run, :mod:`trainer.fsdp`): the weights and optimizer moments are the
    ranks' tile files, which ``tiles(writer)`` writes and links in; here only the models' configs and
    the optimizers' JSON skeletons."""
    lora_models = getattr(trainer, "lora", None)
    if tiles is not None:
        fsdp.write_configs(writer, "actor", unwrap(trainer.actor))
    elif lora_models is None:
        save_pretrained_files(writer, "actor", unwrap(trainer.actor))
    else:  # the adapters only: the base is named by its digest
        lora.save_adapter(writer, "actor", lora_models, lora.ACTOR_ADAPTER)
    ckpt.save_state(writer, "optim_actor", _optimizer_state(trainer.actor_opt, tiles is not None))
    state: dict[str, Any] = {
        "step": trainer.step,
        "run_id": trainer.run_id,
        "config_digest": trainer.cfg.digest(),
        "config": trainer.cfg.to_dict(),
        "data_position": trainer.sampler.state(),
        "kl_coef": float(trainer.kl_ctl.value),
        "scheduler_actor": trainer.actor_sched.state_dict(),
        "world_size": trainer.dist.world_size,
        "skipped_updates": int(trainer.skipped_updates),
        "genesis_nonce": trainer.genesis_nonce,
    }
    if lora_models is not None:
        state[lora.BASE_DIGEST_KEY] = lora_models.base_digest
    if trainer.critic is not None:
        if isinstance(trainer.critic, lora.SharedCritic):
            lora.save_shared_critic(writer, trainer.critic)
        elif tiles is not None:
            write_critic_config(writer, "critic", trainer.paths.critic)
        else:
            save_critic(unwrap(trainer.critic), writer, "critic", trainer.paths.critic)
        ckpt.save_state(writer, "optim_critic", _optimizer_state(trainer.critic_opt, tiles is not None))
        state["scheduler_critic"] = trainer.critic_sched.state_dict()
    ckpt.save_state(writer, "rng", capture_rng())
    if tiles is not None:
        tiles(writer)
    writer.json(ckpt.STATE, state)


def _optimizer_state(optimizer: Any, tiled: bool) -> Any:
    return fsdp.optimizer_skeleton(optimizer) if tiled else optimizer.state_dict()


ADAM_MOMENTS = 2
"""Tensors of optimizer state per trainable parameter (AdamW's two moments, in the parameter's dtype)."""


def estimate_state_bytes(trainer: Any) -> int:
    """Bytes of tensors :func:`fill_checkpoint` will save, known before the optimizer has state:
    every model's parameters and buffers (a LoRA run: the adapters and heads, never the base),
    plus AdamW's moments of each parameter the optimizers train."""
    from trainer.staging import state_bytes

    lora_models = getattr(trainer, "lora", None)
    if lora_models is not None:
        critic = None if trainer.critic is None else unwrap(trainer.critic)
        optimizers = [o for o in (trainer.actor_opt, trainer.critic_opt) if o is not None]
        trained = [p for o in optimizers for group in o.param_groups for p in group["params"]]
        return state_bytes(lora.saved_weights(lora_models, critic)) + ADAM_MOMENTS * state_bytes(trained)
    models = [unwrap(m) for m in (trainer.actor, trainer.critic) if m is not None]
    weights = state_bytes(t for m in models for t in m.state_dict().values())
    moments = state_bytes(p for m in models for p in m.parameters() if p.requires_grad)
    return weights + ADAM_MOMENTS * moments


# -- load -------------------------------------------------------------------------------------
def _check_weights(where: str, model: Any, tensors: dict[str, Any], may_miss: bool) -> None:
    """Same names and shapes as the model's state (missing ones only for tied weights)."""
    own = model.state_dict()
    unexpected = sorted(set(tensors) - set(own))
    missing = sorted(set(own) - set(tensors))
    wrong = sorted(k for k in set(own) & set(tensors) if tuple(own[k].shape) != tuple(tensors[k].shape))
    if unexpected or wrong or (missing and not may_miss):
        raise CheckpointRejected(
            f"{where}: weights do not match the model (missing {missing[:3]}, "
            f"unexpected {quote_untrusted(unexpected[:3])}, wrong shape {wrong[:3]})"
        )


def _check_optimizer_state(where: str, optimizer: Any, saved: Any) -> None:
    """Each saved moment has its parameter's shape (0-dim entries, the step counters, excepted):
    a wrongly shaped state would be accepted and fail only at the next optimizer step."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    entries = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(entries, dict):
        raise CheckpointRejected(f"{where}: the optimizer state has no 'state' mapping")
    for index, values in entries.items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(values, dict):
            raise CheckpointRejected(f"{where}: optimizer state for parameter {quote_untrusted(index)}")
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != tuple(params[index].shape):
                raise CheckpointRejected(
                    f"{where}: {quote_untrusted(name)} of parameter {index} has shape {list(value.shape)}, "
                    f"the parameter {list(params[index].shape)}"
                )


RESTORE_ERRORS = (
    KeyError,
    TypeError,
    ValueError,
    RuntimeError,
    AttributeError,
    IndexError,
    OverflowError,
    RecursionError,
)
"""What restoring hostile-but-verified state can raise (integrity-only mode: the manifest is writable too)."""


def guard_config(trainer: Any, state: dict[str, Any]) -> list[str]:
    """The changed training keys; ConfigError (exit 2) listing them unless changes are allowed."""
    current = trainer.cfg.to_dict()
    changed = config_changes(state.get("config"), state.get("config_digest"), current, trainer.cfg.digest())
    if changed and not getattr(trainer, "resume_with_changes", False):
        raise ConfigError(
            f"resume: the config differs from the checkpoint's in {len(changed)} key(s): "
            f"{describe_changes(state.get('config'), current, changed)}. Resume with the checkpoint's config, "
            "start over with --resume never, or pass --resume-with-changes to apply the new values"
        )
    return changed


def _critic_state(
    checkpoint: VerifiedCheckpoint, trainer: Any, state: dict[str, Any], tiles: dict[str, Any] | None
) -> tuple[Any, Any] | None:
    """(critic weights, critic optimizer state), None when this run has no critic or the checkpoint none.

    A checkpoint whose state says it saved a critic (``scheduler_critic``) but whose files hold none is
    rejected, never resumed with a fresh critic. ``tiles``: the checkpoint's whole tensors from its tile
    files (an fsdp2 checkpoint, :func:`trainer.fsdp.read_tiles`)."""
    if trainer.critic is None:
        return None
    if isinstance(trainer.critic, lora.SharedCritic):
        return lora.read_shared_critic(checkpoint, trainer.critic), checkpoint.state("optim_critic")
    if tiles is not None:
        weights = fsdp.group(tiles, "critic")
        if not weights:
            if "scheduler_critic" in state:
                raise CheckpointRejected(f"{fsdp.SHARDS_DIR}/: no critic tiles, but {ckpt.STATE} says one was saved")
            return None
        moments = fsdp.group(tiles, "optim_critic")
        optim = fsdp.with_moments(checkpoint.state("optim_critic"), moments, "optim_critic")
    elif f"critic/{CRITIC_WEIGHTS}" not in checkpoint.files:
        if "scheduler_critic" in state:
            raise CheckpointRejected(f"critic/{CRITIC_WEIGHTS}: missing, but {ckpt.STATE} says a critic was saved")
        return None
    else:
        weights = checkpoint.tensors(f"critic/{CRITIC_WEIGHTS}")
        optim = checkpoint.state("optim_critic")
    _check_weights("critic", unwrap(trainer.critic), weights, False)
    return weights, optim


def _actor_weights(checkpoint: VerifiedCheckpoint, actor: Any, tiles: dict[str, Any] | None) -> dict[str, Any]:
    """The actor's whole weights: from the tiles (fsdp2) or ``actor/*.safetensors``; checked."""
    weights: dict[str, Any] = {}
    if tiles is not None:
        weights = fsdp.group(tiles, "actor")
    else:
        for name in checkpoint.names("actor", ".safetensors"):
            weights.update(checkpoint.tensors(name))
    if not weights:
        raise CheckpointRejected("actor/: no weights among the signed files")
    _check_weights("actor", actor, weights, bool(getattr(actor.config, "tie_word_embeddings", False)))
    return weights


def _restore_model(model: Any, weights: dict[str, Any], may_miss: bool) -> None:
    """Whole weights into a model: its local rows when sharded, else ``load_state_dict``."""
    if fsdp.is_sharded(model):
        fsdp.copy_full_into(model, weights, may_miss)
    else:
        model.load_state_dict(weights, strict=not may_miss)  # copy_ casts a bf16 checkpoint into fp32 masters


def load_into(trainer: Any, checkpoint: VerifiedCheckpoint) -> None:
    """Restores weights, optimizers, schedulers, data position, KL coefficient and RNG from
    the verified bytes. Everything is decoded, and weights and optimizer moments checked against
    the models, before the trainer is touched; a value that fails while being restored (hostile
    bytes in integrity-only mode) is a CheckpointRejected, and the next candidate restores every
    part again. Either checkpoint format (whole files, or an fsdp2 run's tiles) restores into either
    strategy at any world size: whole tensors are rebuilt, then each rank keeps its rows."""
    state = checkpoint.json(ckpt.STATE)
    if not isinstance(state, dict):
        raise CheckpointRejected(f"{ckpt.STATE}: not a JSON object")
    changed = guard_config(trainer, state)
    lora_models = getattr(trainer, "lora", None)
    actor = unwrap(trainer.actor)
    tiles = fsdp.read_tiles(checkpoint) if lora_models is None and fsdp.has_tiles(checkpoint) else None
    weights: dict[str, Any] = {}
    adapters: list[Any] = []
    if lora_models is not None:
        lora.check_base(lora_models, state, trainer.paths.actor)
        adapters = lora.read_actor(checkpoint, lora_models)
    else:
        weights = _actor_weights(checkpoint, actor, tiles)
    critic = _critic_state(checkpoint, trainer, state, tiles)
    optim_actor, rng = checkpoint.state("optim_actor"), checkpoint.state("rng")
    if tiles is not None:
        optim_actor = fsdp.with_moments(optim_actor, fsdp.group(tiles, "optim_actor"), "optim_actor")
    _check_optimizer_state("optim_actor", trainer.actor_opt, optim_actor)
    if critic is not None:
        _check_optimizer_state("optim_critic", trainer.critic_opt, critic[1])
    try:
        if lora_models is not None:
            lora.copy_pairs(adapters)
        else:
            _restore_model(actor, weights, True)
        trainer.actor_opt.load_state_dict(fsdp.localize_optimizer_state(trainer.actor_opt, optim_actor))
        trainer.actor_sched.load_state_dict(state["scheduler_actor"])
        if critic is not None and isinstance(trainer.critic, lora.SharedCritic):
            lora.copy_pairs(critic[0])
            trainer.critic_opt.load_state_dict(critic[1])
            trainer.critic_sched.load_state_dict(state["scheduler_critic"])
        elif critic is not None:
            _restore_model(unwrap(trainer.critic), critic[0], False)
            trainer.critic_opt.load_state_dict(fsdp.localize_optimizer_state(trainer.critic_opt, critic[1]))
            trainer.critic_sched.load_state_dict(state["scheduler_critic"])
        trainer.sampler.load_state(state["data_position"])
        trainer.kl_ctl.value = float(state["kl_coef"])
        trainer.skipped_updates = int(state.get("skipped_updates", 0))
        nonce = state.get("genesis_nonce")
        trainer.genesis_nonce = nonce if valid_genesis_nonce(nonce) else None
        restore_rng(rng)
    except RESTORE_ERRORS as exc:
        raise CheckpointRejected(f"cannot restore the training state: {quote_untrusted(exc)}") from None
    if checkpoint.lent:
        own_host_state(trainer)
    trainer.step = checkpoint.step
    # Not part of the config guard: a resume at another world size (an elastic restart after a
    # node loss) is allowed; the global batch stays and each rank's share follows WORLD_SIZE.
    saved_world = state.get("world_size")
    trainer.checkpoint_world_size = saved_world if isinstance(saved_world, int) and saved_world > 0 else None
    trainer.config_changes = changed
    apply_changes(trainer, changed)
    if not fsdp.is_sharded(trainer.actor):  # sharded: gathered by every rank once all have loaded (core)
        trainer.rollout.sync_weights(unwrap(trainer.actor))
    trainer.metrics.last_checkpoint_step.set(trainer.step)


def own_host_state(trainer: Any) -> None:
    """Copies every host-resident optimizer state tensor (AdamW's ``step`` counters on CUDA; all of it on a
    host-only run) out of the buffers the checkpoint was read into. torch's ``load_state_dict`` copies
    weights into the parameters and moves moments to the parameters' device, but keeps a tensor that
    is already where it belongs as it is: a view of lent memory that the next capture overwrites."""
    for optimizer in (trainer.actor_opt, getattr(trainer, "critic_opt", None)):
        if optimizer is None:
            continue
        for per_param in optimizer.state.values():
            for key, value in list(per_param.items()):
                if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                    per_param[key] = value.clone()


def _set_lr(optimizer: Any, scheduler: Any, lr: float) -> None:
    """A new base learning rate, keeping the scheduler's current factor (warm-up position)."""
    for group in optimizer.param_groups:
        factor = group["lr"] / group["initial_lr"] if group.get("initial_lr") else 1.0
        group["initial_lr"] = lr
        group["lr"] = lr * factor
    scheduler.base_lrs = [lr for _ in optimizer.param_groups]


def apply_changes(trainer: Any, changed: list[str]) -> None:
    """Makes the new config's values win over the restored ones, where the checkpoint holds them."""
    cfg = trainer.cfg
    if "ppo.actor_lr" in changed:
        _set_lr(trainer.actor_opt, trainer.actor_sched, cfg.ppo.actor_lr)
    if "ppo.critic_lr" in changed and trainer.critic is not None:
        _set_lr(trainer.critic_opt, trainer.critic_sched, cfg.ppo.critic_lr)
    if "algorithm.kl_coef" in changed or "algorithm.kl_controller" in changed:
        trainer.kl_ctl.value = float(cfg.algorithm.kl_coef)
    if "run.seed" in changed:
        seed_everything(cfg.run.seed + trainer.step)
