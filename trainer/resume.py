"""Trusted resume: pick the newest checkpoint that verifies, load it bit-exactly.

The rule (``checkpoint.trusted_keys``, see :class:`trainer.config.CheckpointConfig`):

- With trusted keys, a checkpoint is accepted only with a valid signature ``<dir>.sig``
  by one of them, unconditionally: no setting lets an unsigned checkpoint through. The
  signed provenance must match: the signed step equals the directory's step, the signed
  run id equals this run's id (``run.run_id``, else the run id in the run directory's
  journal), and the signed parent digest equals the root digest of the newest earlier
  signed checkpoint of the same run in the same root, where one is present (so a
  checkpoint of an abandoned branch of the run is refused).
- Without trusted keys, ``manifest.sha256.json`` is checked: integrity against accidents
  only, not authenticity (whoever can write a file can rewrite the manifest). Step and
  run id then come from the checked ``trainer_state.json``.
- Bytes are verified and deserialized from the same in-memory copy
  (:mod:`trainer.verified_load`); only the files the anchor names are loaded.

Before anything is loaded, ``--resume auto`` reconciles the checkpoints on disk with the journal
(:mod:`warden.ledger`): a checkpoint announced by ``checkpoint.saved`` and gone without its
``checkpoint.pruned`` is a violation, and the resume is refused naming it (``--resume-past-missing``
is the explicit way on). ``--resume auto`` then tries the checkpoints newest first; each refused one emits
``checkpoint.rejected`` (path, short why). When checkpoints exist but every one was
refused, the resume fails with :class:`ResumeRefused` (exit 1) naming them instead of
starting fresh: a fresh start would silently discard the run's progress, or hide an
attack, and ``--resume never`` says so explicitly. ``--resume PATH`` accepts a
checkpoint of another run (a cross-run resume, logged and recorded in ``run.resumed``)
but otherwise checks the same; a refused PATH is exit 1 too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer import checkpoint as ckpt
from trainer.distributed import broadcast_object
from trainer.models import unwrap
from trainer.verified_load import (
    Anchor,
    BufferSource,
    CheckpointRejected,
    Pieces,
    VerifiedCheckpoint,
    integrity_anchor,
    read_verified,
    signed_anchor,
)
from warden import journal as ev
from warden.errors import ConfigError, ViolationError, quote_untrusted
from warden.ledger import Ledger, describe_missing, read_ledger, reconcile

log = logging.getLogger("warden.trainer")

BUDGET_BYTES_PER_PARAMETER = 16
"""Weights (at most 4 bytes) plus AdamW's two float32 moments per parameter, with room."""
BUDGET_SLACK_BYTES = 64 * 1024 * 1024
"""JSON state, RNG state, model configs."""


class ResumeRefused(ViolationError):
    """No checkpoint could be accepted although some exist, or ``--resume PATH`` was refused (exit 1)."""


@dataclass(frozen=True)
class ResumeResult:
    step: int
    path: str
    verification: str
    source_run_id: str | None = None
    cross_run: bool = False
    seconds: Mapping[str, float] | None = None
    """Where the accepted candidate's time went: ``read_verified`` (read, hash, check) and ``restore``."""

    def event_fields(self) -> dict[str, Any]:
        """Extra ``run.resumed`` fields: where the checkpoint came from, and how long loading it took."""
        fields: dict[str, Any] = {"source_run_id": self.source_run_id, "cross_run": self.cross_run}
        if self.seconds is not None:
            fields["load_seconds"] = {k: round(v, 3) for k, v in self.seconds.items()}
        return fields


def find_resume_point(trainer: Any, mode: str, ledger: Ledger | None = None) -> ResumeResult | None:
    """Loads the checkpoint to resume from into ``trainer``; None for a fresh start.

    Under torchrun rank 0 chooses (as the module doc says) and every other rank loads
    exactly that checkpoint, checked the same way: ranks checking on their own could
    disagree when the signer signs the newest checkpoint between their looks (an elastic
    restart right after a save does that). Raises ResumeRefused (exit 1) as the module doc
    says, or when a rank refuses rank 0's choice; ConfigError for a bad ``--resume`` value
    or unreadable trusted keys.
    """
    if mode == "never":
        return None
    root = trainer.paths.checkpoint_root
    explicit = mode != "auto"
    # Every rank checks what can fail as a config error, so no rank is left waiting for rank 0.
    trusted = _trusted_keys(trainer.cfg.checkpoint.trusted_keys)
    explicit_ref = ckpt.CheckpointRef(_step_of(mode), os.path.abspath(mode)) if explicit else None
    result: ResumeResult | None = None
    rejected: list[str] = []
    unaccounted: str | None = None
    if trainer.dist.is_main:
        ckpt.remove_stale_temporaries(root)
        candidates = [explicit_ref] if explicit_ref is not None else ckpt.list_complete(root)
        if not explicit and not getattr(trainer, "resume_past_missing", False):
            unaccounted = _unaccounted(trainer, root, candidates, ledger)
        if unaccounted is None:
            result, rejected = _first_accepted(trainer, candidates, trusted, explicit)
    choice = broadcast_object(("refused", unaccounted) if unaccounted else _choice(result, rejected), trainer.dist)
    if unaccounted is not None:
        raise ResumeRefused(unaccounted)
    if not trainer.dist.is_main:
        result, rejected = _follow(trainer, choice, trusted, explicit)
    if result is None and rejected:
        raise ResumeRefused(_refusal(mode, root, rejected))
    return result


def _unaccounted(
    trainer: Any, root: str, on_disk: list[ckpt.CheckpointRef], ledger: Ledger | None = None
) -> str | None:
    """Why ``--resume auto`` must not start: checkpoints the journal announced and never retired
    that are not on disk (warden.ledger's rule); None when every one is accounted for.

    Resuming past them would silently roll the run back (or start it over) to whatever a storage
    writer left; ``--resume-past-missing`` (or ``--resume PATH`` / ``never``) says so explicitly.
    """
    if ledger is None:
        ledger = read_ledger(os.path.join(trainer.run_dir, ev.JOURNAL_NAME), trainer.run_id)
    found = reconcile(ledger, (ref.step for ref in on_disk))
    if found.ok:
        return None
    for gone in found.missing:
        trainer.emit(
            ev.CHECKPOINT_REJECTED,
            {"path": gone.path, "why": "announced in the journal, gone without a checkpoint.pruned event"},
            step=gone.step,
        )
    return (
        f"the journal of run {trainer.run_id} announced checkpoints that are gone from {root} without a "
        f"retention event: {describe_missing(found.missing)}. Restore them, or resume past them explicitly "
        "with --resume-past-missing (or --resume PATH, or --resume never to start over)"
    )


def _choice(result: ResumeResult | None, rejected: list[str]) -> tuple[Any, ...]:
    """What rank 0 tells the others: ("resume", step, path), ("refused", first reason) or ("fresh",). Pure."""
    if result is not None:
        return ("resume", result.step, result.path)
    if rejected:
        return ("refused", rejected[0])
    return ("fresh",)


def _follow(trainer: Any, choice: Any, trusted: Any, explicit: bool) -> tuple[ResumeResult | None, list[str]]:
    """A rank other than 0 loads rank 0's choice (checked again here) or starts as rank 0 does."""
    if choice[0] == "fresh":
        return None, []
    if choice[0] == "refused":
        return None, [f"rank 0: {choice[1]}"]
    ref = ckpt.CheckpointRef(int(choice[1]), str(choice[2]))
    result, rejected = _first_accepted(trainer, [ref], trusted, explicit)
    return result, [f"rank {trainer.dist.rank}: {r}" for r in rejected]


def _first_accepted(
    trainer: Any, candidates: list[ckpt.CheckpointRef], trusted: Any, explicit: bool
) -> tuple[ResumeResult | None, list[str]]:
    """Loads the first candidate that is accepted: (its result, the refusals before it)."""
    budget = checkpoint_budget(trainer)
    rejected: list[str] = []
    for ref in candidates:
        try:
            started = time.monotonic()
            verified, source_run = accept(ref, trusted, trainer.run_id, explicit, budget, lender(trainer))
            read = time.monotonic()
            load_into(trainer, verified)
            seconds = {"read_verified": read - started, "restore": time.monotonic() - read}
        except CheckpointRejected as exc:
            log.warning("checkpoint %s rejected: %s", quote_untrusted(ref.path), quote_untrusted(exc.reason, 400))
            trainer.emit(ev.CHECKPOINT_REJECTED, {"path": ref.path, "why": exc.reason}, step=ref.step)
            rejected.append(f"{ref.path} ({exc.reason})")
            continue
        log.info("resuming from %s at step %d: %s", ref.path, trainer.step, verified.anchor.how)
        cross = source_run != trainer.run_id
        if cross:
            log.warning(
                "cross-run resume: %s belongs to run %s, continuing as run %s",
                ref.path,
                quote_untrusted(source_run),
                trainer.run_id,
            )
        return ResumeResult(trainer.step, ref.path, verified.anchor.how, source_run, cross, seconds), rejected
    return None, rejected


def lender(trainer: Any) -> BufferSource | None:
    """Where a candidate is read into: the staging arena of asynchronous saves when it is pinned (CUDA;
    started over for each candidate), else None (fresh buffers). The arena is allocated and populated
    at start either way, so reading into it costs no fresh pages, and the load into the device copies
    from pinned memory; on the host, the loaded tensors would alias memory the next capture overwrites."""
    arena = getattr(getattr(trainer, "saver", None), "arena", None)
    if arena is None or not arena.pinned:
        return None
    arena.reset()
    lend: BufferSource = arena.lend
    return lend


def _refusal(mode: str, root: str, rejected: list[str]) -> str:
    if mode != "auto":
        return f"--resume {mode}: checkpoint refused: {rejected[0]}"
    return (
        f"no checkpoint under {root} can be trusted, refusing to start fresh over them: "
        + "; ".join(rejected[:5])
        + (f" (+{len(rejected) - 5} more)" if len(rejected) > 5 else "")
        + ". Restore a good checkpoint, resume one explicitly with --resume PATH, or start over with --resume never"
    )


def _trusted_keys(path: str) -> Any:
    if not path:
        return None
    from warden.signing import load_trusted_keys

    return load_trusted_keys(path)


def checkpoint_budget(trainer: Any) -> int:
    """Bytes a checkpoint of this trainer's models may take: the cap on what is read into memory."""
    models = [m for m in (trainer.actor, trainer.critic) if m is not None]
    params = sum(p.numel() for model in models for p in unwrap(model).parameters())
    return BUDGET_BYTES_PER_PARAMETER * int(params) + BUDGET_SLACK_BYTES


def accept(
    ref: ckpt.CheckpointRef,
    trusted: Any,
    run_id: str,
    explicit: bool,
    budget: int,
    buffers: BufferSource | None = None,
) -> tuple[VerifiedCheckpoint, str | None]:
    """(verified checkpoint, the run id it belongs to) or CheckpointRejected.

    ``trusted`` None: integrity only. Another run's checkpoint passes only when ``explicit``.
    ``buffers``: see :func:`trainer.verified_load.read_verified`.
    """
    if trusted is None:
        anchor = integrity_anchor(ref.path)
    else:
        anchor = signed_anchor(ref.path, trusted)
        check_provenance(anchor.run_id, anchor.step, ref.step, run_id, explicit, "signed")
        check_chain(ref, anchor, trusted)
    verified = read_verified(ref.path, ref.step, anchor, budget, buffers=buffers)
    if anchor.signed:
        check_own_manifest(verified)
    state = verified.json(ckpt.STATE)
    if not isinstance(state, dict):
        raise CheckpointRejected(f"{ckpt.STATE}: not a JSON object")
    state_run, state_step = state.get("run_id"), state.get("step")
    if anchor.signed:
        if (state_run, state_step) != (anchor.run_id, anchor.step):
            raise CheckpointRejected(
                f"{ckpt.STATE} says run {quote_untrusted(state_run)} step {quote_untrusted(state_step)}, "
                f"the signature run {quote_untrusted(anchor.run_id)} step {anchor.step}"
            )
    else:
        check_provenance(state_run, state_step, ref.step, run_id, explicit, ckpt.STATE)
    return verified, state_run if isinstance(state_run, str) else None


def check_own_manifest(verified: VerifiedCheckpoint) -> None:
    """The signed files are exactly those the trainer's own manifest lists, with its digests: the
    signature binds bytes, the manifest (signed with them) binds the names the trainer gave them, so
    a file renamed, split or added before signing is refused here. Raises CheckpointRejected.

    Nothing is hashed again where the manifest can be matched against the signature as it stands:
    a files signature's per-file sha256 against ``files``, a shards signature's shards against the
    manifest's ``shards`` (written in the shards serialization). Only a file signed in shards that
    the manifest does not list with the same boundaries (a checkpoint written before the manifest
    listed shards, or signed with another shard size) is hashed whole, from the verified buffer."""
    try:
        manifest = verified.json(ckpt.MANIFEST)
        listed = manifest["files"]
    except (CheckpointRejected, KeyError, TypeError):
        raise CheckpointRejected(f"{ckpt.MANIFEST}: missing or unreadable among the signed files") from None
    if not isinstance(listed, dict):
        raise CheckpointRejected(f"{ckpt.MANIFEST}: 'files' is not an object")
    signed, own = _signed_and_own(verified, listed, manifest_shards(manifest))
    if set(signed) != set(listed) or signed != own:
        differing = sorted(set(signed) ^ set(listed)) or sorted(n for n in signed if signed[n] != own[n])
        shown = ", ".join(quote_untrusted(n, 80) for n in differing[:5])
        raise CheckpointRejected(f"the signed files differ from the trainer's {ckpt.MANIFEST}: {shown}")


def _signed_and_own(
    verified: VerifiedCheckpoint, listed: dict[str, Any], own_shards: dict[str, Pieces]
) -> tuple[dict[str, object], dict[str, object]]:
    """Per signed file (the manifest aside): (what the signature says, what the manifest says), in the
    same terms: both shard lists where the manifest lists the signed boundaries, else whole sha256s."""
    signed: dict[str, object] = {}
    own: dict[str, object] = {}
    for name, digest in verified.anchor.digests.items():
        if name == ckpt.MANIFEST:
            continue
        mine = own_shards.get(name)
        if not isinstance(digest, str) and mine is not None and _bounds(mine) == _bounds(digest):
            signed[name], own[name] = digest, mine
        else:
            signed[name] = digest if isinstance(digest, str) else hashlib.sha256(verified.files[name]).hexdigest()
            own[name] = listed.get(name)
    return signed, own


def manifest_shards(manifest: Any) -> dict[str, Pieces]:
    """The manifest's ``shards`` as the anchor spells them, ``{name: ((start, end, hex), ...)}``; empty
    when it has none (files serialization, or an older checkpoint). CheckpointRejected if malformed. Pure."""
    shards = manifest.get("shards", {}) if isinstance(manifest, dict) else {}
    if not isinstance(shards, dict) or not all(isinstance(v, list) for v in shards.values()):
        raise CheckpointRejected(f"{ckpt.MANIFEST}: 'shards' must map names to lists of shards")
    return {name: tuple(_shard_entry(item) for item in items) for name, items in shards.items()}


def _shard_entry(item: object) -> tuple[int, int, str]:
    if isinstance(item, list) and len(item) == 3:
        start, end, digest = item
        if all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)) and isinstance(digest, str):
            return start, end, digest
    raise CheckpointRejected(f"{ckpt.MANIFEST}: a shard must be [start, end, hex]")


def _bounds(shards: Pieces) -> list[tuple[int, int]]:
    return [(start, end) for start, end, _ in shards]


def check_provenance(
    claimed_run: object, claimed_step: object, dir_step: int, run_id: str, explicit: bool, source: str
) -> None:
    """Raises CheckpointRejected unless the claimed step is the directory's and the run is ours
    (or, for an explicitly named checkpoint, any named run). Pure."""
    if not isinstance(claimed_step, int) or isinstance(claimed_step, bool):
        raise CheckpointRejected(f"the {source} provenance has no step")
    if claimed_step != dir_step:
        raise CheckpointRejected(
            f"{source} step {claimed_step} but the directory is {ckpt.step_dir_name(dir_step)} (renamed or moved)"
        )
    if not isinstance(claimed_run, str) or not claimed_run:
        raise CheckpointRejected(f"the {source} provenance has no run id")
    if claimed_run != run_id and not explicit:
        raise CheckpointRejected(
            f"a checkpoint of run {quote_untrusted(repr(claimed_run))}, not of this run {run_id!r}; "
            "resume it only by naming it with --resume PATH"
        )


def check_chain(ref: ckpt.CheckpointRef, anchor: Anchor, trusted: Any) -> None:
    """The signed parent digest must be the root digest of the newest earlier signed checkpoint
    of the same run beside it, where one is present. Raises CheckpointRejected."""
    if anchor.parent_root_digest is None:
        return  # the first signed checkpoint of its run: nothing to chain to
    for earlier in ckpt.list_complete(os.path.dirname(ref.path)):
        if earlier.step >= ref.step:
            continue
        try:
            previous = signed_anchor(earlier.path, trusted)
        except CheckpointRejected:
            continue  # unsigned or not ours: not a link of the chain (as the signer skips it)
        if previous.run_id != anchor.run_id:
            continue
        if previous.root_digest != anchor.parent_root_digest:
            raise CheckpointRejected(
                f"signed parent {quote_untrusted(anchor.parent_root_digest, 80)} is not the earlier "
                f"{os.path.basename(earlier.path)} ({previous.root_digest}): a checkpoint of another branch"
            )
        return


def _step_of(path: str) -> int:
    step = ckpt.step_of_name(os.path.basename(os.path.normpath(path)))
    if step is None or not os.path.isdir(path):
        raise ConfigError(f"--resume {quote_untrusted(path)}: not a checkpoint directory named step-NNNNNNNNN")
    return step


def load_into(trainer: Any, checkpoint: VerifiedCheckpoint) -> None:
    """Restores the trainer from the verified checkpoint (:func:`trainer.train_state.load_into`,
    which also applies the config-digest resume guard)."""
    from trainer.train_state import load_into as restore

    restore(trainer, checkpoint)
