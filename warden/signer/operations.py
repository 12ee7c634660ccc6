"""Signing and verifying one checkpoint on behalf of the signer's services, and what a failure counts.

Signatures lie beside each directory (``step-N.sig``) and carry run id, step, trainer
version and the previous signed checkpoint's root digest. A checkpoint deleted while it
is hashed (retention) is logged and counted (``warden_signer_errors_total{kind=
"checkpoint_vanished"}``), never fatal; a signature written just as its directory
vanished or changed is removed again. Every hash feeds ``warden_signer_hashed_bytes_total``
as it goes and, once complete, ``warden_signer_hash_duration_seconds``; each stops within
one read when :attr:`SignerState.stop <warden.signer.state.SignerState.stop>` is set.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from typing import Any, TypeVar

import warden.layouts as verl_layout
from warden.errors import ExitCode, error_kind
from warden.logs import log_fields
from warden.safeio import open_root
from warden.signer.announcements import Record
from warden.signer.state import SignerState, Unsigned
from warden.signer.watch import Candidate, signed_steps_before, tree_state
from warden.signing.dsse import SignResult, sign_checkpoint
from warden.signing.errors import CheckpointChanged, CheckpointVanished, SignerError
from warden.signing.manifest import Announced, Provenance
from warden.signing.verify import VerifyResult, read_signed_statement, verify_checkpoint

T = TypeVar("T")


def gone_before_signing(candidate: Candidate) -> str | None:
    """Why there is nothing left to sign at ``candidate.path`` (removed by retention); None when there is.

    Gone: not a real directory any more; for verl also a directory without ``actor/``
    (verl's retention removes ``actor/`` and ``critic/`` and keeps the directory).
    """
    try:
        st = os.lstat(candidate.path)
    except OSError:
        return "deleted"
    if not stat.S_ISDIR(st.st_mode):
        return "deleted (not a directory any more)"
    if candidate.layout == "verl" and verl_layout.ACTOR not in verl_layout.observe(candidate.path).roles:
        return f"{verl_layout.ACTOR}/ removed by retention"
    return None


def timed(state: SignerState, operation: str, call: Callable[[Any], T]) -> T:
    """Runs ``call(progress)``, feeding the bytes counter and, on success, the duration histogram."""
    start = time.monotonic()
    result = call(state.metrics.progress(operation))
    state.metrics.hash_seconds.labels(operation).observe(time.monotonic() - start)
    return result


def verify(state: SignerState, candidate: Candidate) -> VerifyResult:
    """Verifies ``candidate`` against its ``.sig`` with the signer's trust set."""
    return timed(
        state,
        "verify",
        lambda progress: verify_checkpoint(
            candidate.path,
            state.trusted,
            max_workers=state.policy.hash_workers,
            progress=progress,
            cancel=state.stop,
        ),
    )


def sign(
    state: SignerState,
    candidate: Candidate,
    run_id: str | None,
    trainer_version: str | None,
    before: Unsigned | None = None,
    expected: Announced | None = None,
) -> SignResult:
    """Signs ``candidate`` (only if it hashes to ``expected``, when given: AnnouncementMismatch
    otherwise); removes the new ``.sig`` again if the directory vanished or changed meanwhile."""
    provenance = Provenance(
        run_id=run_id,
        step=candidate.step,
        trainer_version=trainer_version,
        parent_root_digest=_parent_digest(state, candidate, run_id),
    )
    started = time.monotonic()
    result = timed(
        state,
        "sign",
        lambda progress: sign_checkpoint(
            candidate.path,
            state.key,
            provenance,
            max_workers=state.policy.hash_workers,
            progress=progress,
            cancel=state.stop,
            expected=expected,
            serialization=state.policy.signing_serialization(),
            before_write=state.fence,
        ),
    )
    _check_unchanged(candidate, result, before)
    state.metrics.signed.labels(candidate.layout).inc()
    state.metrics.last_signed.set(state.clock())
    state.unsigned.pop(candidate.path, None)
    state.failed.pop(candidate.path, None)
    state.log.info(
        "signed checkpoint",
        extra=fields(
            state,
            candidate,
            root_digest=result.root_digest,
            bytes=result.total_bytes,
            seconds=round(time.monotonic() - started, 3),
            parent=provenance.parent_root_digest,
            signature=result.signature_path,
        ),
    )
    return result


def _check_unchanged(candidate: Candidate, result: SignResult, before: Unsigned | None) -> None:
    """Raises (after deleting the fresh ``.sig``) if the directory vanished or changed while hashed."""
    extras = before.root.extras() if before is not None else []
    after = tree_state(candidate.path, extras) if before is not None else None
    if not os.path.isdir(candidate.path) or (before is not None and after is None):
        _discard(result.signature_path)
        raise CheckpointVanished(f"{candidate.path}: deleted while it was being signed", candidate.path)
    if before is not None and after is not None and after.fingerprint != before.state.fingerprint:
        _discard(result.signature_path)
        raise CheckpointChanged(f"{candidate.path}: changed while it was being signed; it will be signed again")


def _discard(signature_path: str) -> None:
    """Removes the ``.sig`` just written (its checkpoint vanished or changed meanwhile), by name
    relative to its root: only that entry goes, whatever is linked where."""
    with contextlib.suppress(OSError):
        root_fd = open_root(os.path.dirname(signature_path))
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.basename(signature_path), dir_fd=root_fd)
        finally:
            os.close(root_fd)


def _parent_digest(state: SignerState, candidate: Candidate, run_id: str | None) -> str | None:
    """The signed root digest of the newest earlier checkpoint of the same run in the same root.

    Provenance comes only from verified statements, never from a name: first the signer's own record
    of what it signed (announced checkpoints whose directory is still there); else the newest earlier
    ``.sig`` that verifies under the trusted keys, sits beside a real checkpoint directory and signs
    exactly that directory and step (a lone or renamed ``.sig`` is not a link of the chain)."""
    own = [
        record
        for path, record in state.announced.under(candidate.root)
        if record.step < candidate.step
        and record.signed_digest is not None
        and (run_id is None or record.run_id in (None, run_id))
        and _is_real_dir(path)
    ]
    if own:
        return max(own, key=lambda r: r.step).signed_digest
    for step, signature in signed_steps_before(candidate.root, candidate.layout, candidate.step):
        directory = signature[: -len(".sig")]
        if not _is_real_dir(directory):
            continue
        try:
            _key, statement = read_signed_statement(signature, state.trusted)
        except SignerError as exc:
            state.log.warning(f"previous signature skipped for the chain: {exc}", extra=fields(state, candidate))
            continue
        if statement.manifest.name != os.path.basename(directory) or statement.provenance.step not in (None, step):
            continue
        previous_run = statement.provenance.run_id
        if previous_run is not None and run_id is not None and previous_run != run_id:
            return None
        return statement.subject_digest
    return None


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def refuse(
    state: SignerState, candidate: Candidate, record: Record, reason: str, expected: str, actual: str
) -> ExitCode:
    """Signs nothing; counts, logs (path, expected, actual) and remembers the refusal."""
    state.metrics.refused.labels(reason).inc()
    state.announced.mark_refused(candidate.path, record, reason)
    state.log.error(
        f"refused to sign {candidate.path}: {reason}: expected {expected}, found {actual}",
        extra=fields(state, candidate, reason=reason, expected=expected, actual=actual),
    )
    return ExitCode.VIOLATION


def count(state: SignerState, exc: SignerError, path: str) -> None:
    """Counts and logs a failure of one checkpoint; a vanished one is a warning, not an error."""
    kind = error_kind(exc)
    state.metrics.errors.labels(kind).inc()
    extra = log_fields(sidecar=state.name, path=path, kind=kind)
    if isinstance(exc, CheckpointVanished):
        state.log.warning(f"{exc} (deleted by retention?); skipped", extra=extra)
    else:
        state.log.error(str(exc), extra=extra)


def fields(state: SignerState, candidate: Candidate, **more: object) -> dict[str, Any]:
    """The log fields naming ``candidate`` (path, step, layout) and ``more``."""
    return log_fields(sidecar=state.name, path=candidate.path, step=candidate.step, layout=candidate.layout, **more)
