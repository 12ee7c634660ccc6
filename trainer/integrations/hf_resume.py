"""Verified resume of HF ``Trainer`` checkpoints (``checkpoint-N`` signed by the signer sidecar).

HF loads a checkpoint's weights inside ``Trainer.train()`` before any callback runs, so the
documented way to resume is to pick the checkpoint first::

    path = warden_resume_checkpoint(args.output_dir, trusted_keys="policies/keys", run_dir="runs/sft-1")
    trainer.train(resume_from_checkpoint=path)   # None: nothing to resume, a fresh start

:func:`warden_resume_checkpoint` tries the ``checkpoint-N`` directories of the output dir newest
first and returns the first one that verifies (:func:`verify_hf_checkpoint`); each refused one is
journalled as ``checkpoint.rejected``. When checkpoints exist but none verifies it raises
:class:`HFResumeRefused` naming them, as Warden's own trainer does (:mod:`trainer.resume`): a fresh
start over them would silently discard the run's progress, or hide an attack.

A checkpoint verifies when (the mechanisms of :mod:`trainer.verified_load`):

- ``checkpoint-N.sig`` is a valid signature by one of the trusted keys, naming ``checkpoint-N``
  (:func:`~trainer.verified_load.signed_anchor`);
- the signed step is N and the signed run id is this run's (the run directory's journal's);
- the directory holds exactly the signed files and every byte matches
  (:func:`~trainer.verified_load.read_verified`: no symlink followed, no extra or missing file).

The bytes are read (once, into memory, then dropped) to check them; HF then reads the files
again from disk to load them, so a writer of the checkpoint storage who swaps a file between the
check and HF's load is not caught here (the WardenCallback's ``on_train_begin`` check has the same
window). The signed-parent chain check of Warden's trainer is not applied to HF checkpoints.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from trainer.resume import ResumeRefused
from trainer.verified_load import CheckpointRejected, read_verified, signed_anchor
from warden import journal as ev
from warden.errors import quote_untrusted
from warden.payloads import CheckpointRejection

log = logging.getLogger("warden.hf")

BUDGET_SLACK_BYTES = 1 << 20
"""Bytes allowed over what the directory held when listed (the reader refuses a file that grows)."""


class HFResumeRefused(ResumeRefused):
    """Checkpoints exist but none can be resumed from (or the one HF resumed from does not verify);
    ``paths`` names the refused checkpoints."""

    def __init__(self, message: str, paths: tuple[str, ...]) -> None:
        super().__init__(message)
        self.paths = paths


@dataclass(frozen=True)
class HFVerified:
    """A checkpoint that verified: its path, step, the run id it was signed for, and how."""

    path: str
    step: int
    run_id: str
    how: str


def load_trusted(trusted_keys: Any) -> Any:
    """A signer ``TrustedKeys`` from a key file or directory of ``*.pub`` (or one already loaded)."""
    from warden.signing import TrustedKeys, load_trusted_keys

    if isinstance(trusted_keys, TrustedKeys):
        return trusted_keys
    return load_trusted_keys(os.fspath(trusted_keys))


def tree_bytes(path: str) -> int:
    """Bytes of the regular files under ``path`` (links not followed): the read budget of a check."""
    total = 0
    for parent, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total


def verify_hf_checkpoint(path: str, trusted: Any, run_id: str | None, max_bytes: int | None = None) -> HFVerified:
    """Checks one ``checkpoint-N`` directory as the module doc says; raises CheckpointRejected.

    ``run_id`` None: no run id to match (the run directory has no journal), always refused.
    ``max_bytes`` caps what is read (default: what the directory holds, plus a little).
    """
    from trainer.integrations.hf import step_of_checkpoint

    path = os.path.abspath(path)
    step = step_of_checkpoint(path)
    if step is None or not os.path.isdir(path):
        raise CheckpointRejected(f"{quote_untrusted(path)}: not an HF checkpoint directory named checkpoint-N")
    anchor = signed_anchor(path, trusted)
    if anchor.step != step:
        raise CheckpointRejected(f"signed step {anchor.step} but the directory is checkpoint-{step} (renamed or moved)")
    if not anchor.run_id:
        raise CheckpointRejected("the signed provenance has no run id")
    if run_id is None:
        raise CheckpointRejected(
            f"signed for run {quote_untrusted(repr(anchor.run_id))}, and this run's id is unknown "
            "(no journal in the run directory; pass run_id=)"
        )
    if anchor.run_id != run_id:
        raise CheckpointRejected(
            f"a checkpoint of run {quote_untrusted(repr(anchor.run_id))}, not of this run {run_id!r}"
        )
    budget = max_bytes if max_bytes is not None else tree_bytes(path) + BUDGET_SLACK_BYTES
    read_verified(path, step, anchor, budget)
    return HFVerified(path, step, anchor.run_id, anchor.how)


def is_main_process() -> bool:
    """Rank 0 of the world (``$RANK``), or a single process: the one that writes the journal."""
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        return True


def journal_rejection(writer: ev.EventWriter | None, path: str, step: int | None, why: str, **extra: Any) -> None:
    """``checkpoint.rejected`` for ``path`` (nothing on ranks other than 0 or without a writer)."""
    if writer is None:
        return
    rejection = CheckpointRejection(path=path, why=why, extra={"source": "hf", **extra})
    try:
        writer.emit(rejection.TYPE, rejection.to_data(), step=step)
    except (OSError, ev.JournalError) as exc:
        log.error("warden: could not journal the rejection of %s: %s", path, exc)


def warden_resume_checkpoint(
    output_dir: str,
    *,
    trusted_keys: Any,
    run_dir: str | None = None,
    run_id: str | None = None,
    max_bytes: int | None = None,
) -> str | None:
    """The newest ``checkpoint-N`` under ``output_dir`` that verifies, to pass as
    ``resume_from_checkpoint``; None when there is no checkpoint at all (a fresh start).

    ``trusted_keys``: a public key file, a directory of ``*.pub`` or a loaded ``TrustedKeys``.
    ``run_dir``: the run directory of the WardenCallback (default ``$WARDEN_RUN_DIR``, else
    ``output_dir``); the run id is ``run_id``, else its journal's. Each refused checkpoint is
    journalled as ``checkpoint.rejected`` (on rank 0). Raises HFResumeRefused when checkpoints
    exist and none verifies; KeyFileError (a ConfigError) for unreadable trusted keys.
    """
    from trainer.integrations.hf import hf_checkpoint_steps, journal_writer, resolve_run_id

    trusted = load_trusted(trusted_keys)
    root = os.path.abspath(output_dir)
    steps = sorted(hf_checkpoint_steps(root), reverse=True)
    if not steps:
        return None
    directory = os.path.abspath(run_dir or os.environ.get("WARDEN_RUN_DIR") or root)
    journal_path = os.path.join(directory, ev.JOURNAL_NAME)
    expected_run = run_id or resolve_run_id(journal_path, directory, mint=False)
    writer = journal_writer(directory, run_id) if is_main_process() else None
    rejected: list[str] = []
    refused: list[str] = []
    try:
        for step in steps:
            path = os.path.join(root, f"checkpoint-{step}")
            try:
                verified = verify_hf_checkpoint(path, trusted, expected_run, max_bytes)
            except CheckpointRejected as exc:
                log.warning("warden: checkpoint %s rejected: %s", path, quote_untrusted(exc.reason, 400))
                journal_rejection(writer, path, step, exc.reason)
                rejected.append(f"{path} ({exc.reason})")
                refused.append(path)
                continue
            log.info("warden: resuming from %s: %s", path, verified.how)
            return path
    finally:
        if writer is not None:
            writer.close()
    raise HFResumeRefused(
        f"no checkpoint under {root} can be trusted, refusing to start fresh over them: "
        + "; ".join(rejected[:5])
        + (f" (+{len(rejected) - 5} more)" if len(rejected) > 5 else "")
        + ". Restore a good checkpoint, or start over in a new output_dir",
        tuple(refused),
    )
