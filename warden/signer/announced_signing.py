"""Signing what the journal announces: ``checkpoint.saved`` (and ``run.started``'s version).

When the event carries ``root_digest`` and ``file_count`` (the Warden trainer always does;
the HF callback does), the directory is hashed once and signed only if that hash is the
announced one; otherwise nothing is signed: ``warden_signer_refused_total{reason}``, an
error log naming path, expected and actual digest, and a violation. A ``step-N/`` of the
run's own root announced without a digest is refused too (``no_digest``). If a valid
``.sig`` of the announced digest already exists (a replay after a crash) nothing is
written; one that no longer matches (the same step saved again after a resume) is
replaced. Announcements and what was signed are kept in ``<state_dir>/announced.json``
(:mod:`warden.signer.announcements`). On SIGTERM the current hash is abandoned within one
read: :class:`~warden.errors.TryAgainLater`, which the sidecar turns into the runtime's
RetryLater (the event's cursor is not advanced, so it is handled again on the next start).
"""

from __future__ import annotations

import os

from warden.errors import ExitCode, IncompleteError, TryAgainLater
from warden.journal import Event
from warden.payloads import CheckpointSaved, PayloadError, RunStarted
from warden.signer.announcements import NO_DIGEST, Record
from warden.signer.operations import count, fields, gone_before_signing, refuse, sign, verify
from warden.signer.state import RUN_CHECKPOINTS, SignerState
from warden.signer.watch import Candidate, layout_of
from warden.signing.errors import (
    AnnouncementMismatch,
    CheckpointVanished,
    HashingCancelled,
    SignatureMissing,
    SignerError,
    UnsupportedSignature,
)
from warden.signing.manifest import Announced
from warden.signing.verify import VerifyResult, read_signed_statement


class BadEvent(IncompleteError):
    """A ``checkpoint.saved`` event without a usable ``data.path`` (logged, counted, skipped)."""


class AnnouncedSigning:
    """Handles ``run.started`` and ``checkpoint.saved``: signs a checkpoint exactly as announced."""

    def __init__(self, state: SignerState) -> None:
        self.state = state
        self.catching_up = False
        """Set while a new lease holder replays the journal (sidecars/signer/sidecar.py): a ``.sig``
        whose verified statement names the announced digest counts as signed without hashing the
        checkpoint again (the previous holder hashed it; re-verification checks the bytes)."""

    def run_started(self, event: Event) -> ExitCode:
        """Remembers the run and the trainer version it announces, for its checkpoints' provenance."""
        try:
            version = RunStarted.from_data(event.data).warden_version
        except PayloadError:
            version = None
        self.state.runs.record(event.run_id, version)
        return ExitCode.OK

    def checkpoint_saved(self, event: Event) -> ExitCode:
        """Signs the checkpoint the event names if its bytes are the announced ones (see the module)."""
        raw = event.data.get("path")
        if not isinstance(raw, str) or not raw:
            raise BadEvent(f"checkpoint.saved seq {event.seq} (step {event.step}) has no data.path; skipped")
        candidate = event_candidate(self.state, raw, event.step)
        self.state.runs.record(event.run_id, None)
        try:
            saved = CheckpointSaved.from_data(event.data)
        except PayloadError as exc:
            raise BadEvent(f"checkpoint.saved seq {event.seq} ({candidate.path}): {exc}; skipped") from None
        trainer_version = saved.trainer_version or self.state.runs.version(event.run_id)
        announced = saved.announced
        own = self._is_own(candidate)
        if not own and saved.complete is False:
            # the trainer side gave up waiting for the checkpoint (an HF rank's files never came): no
            # announcement to sign against; a watched root signs it once complete and stable
            self.state.log.warning(
                f"{candidate.path}: announced as incomplete ({str(list(saved.waiting_for or ()))[:200]}); "
                "not signed from this event",
                extra=fields(self.state, candidate),
            )
            return ExitCode.OK
        record = None
        if own or announced is not None:
            record = self.state.announced.announce(candidate.path, candidate.step, event.run_id, announced)
        if own and announced is None:
            assert record is not None
            return refuse(self.state, candidate, record, NO_DIGEST, "a root_digest and file_count", "none announced")
        return self._sign(candidate, event.run_id, trainer_version, announced, record)

    def _sign(
        self,
        candidate: Candidate,
        run_id: str | None,
        trainer_version: str | None,
        announced: Announced | None,
        record: Record | None,
    ) -> ExitCode:
        """Signs ``candidate`` unless a valid ``.sig`` covers it; refuses bytes other than announced."""
        try:
            signed_root = self._already_signed(candidate, announced)
            if signed_root is not None:
                if record is not None:
                    self.state.announced.mark_signed(candidate.path, record, signed_root)
                return ExitCode.OK
            result = sign(self.state, candidate, run_id, trainer_version, expected=announced)
            if record is not None:
                self.state.announced.mark_signed(candidate.path, record, result.root_digest)
        except AnnouncementMismatch as exc:
            assert record is not None
            gone = gone_before_signing(candidate)
            if gone is not None:  # retention got there first (verl keeps the directory): nothing to sign
                vanished = CheckpointVanished(f"{candidate.path}: {gone} while it was hashed", candidate.path)
                count(self.state, vanished, candidate.path)
                return ExitCode.OK
            return refuse(self.state, candidate, record, exc.reason, exc.expected, exc.actual)
        except HashingCancelled:
            raise TryAgainLater(f"{candidate.path}: hashing abandoned on stop; the event will be retried") from None
        except CheckpointVanished as exc:
            count(self.state, exc, candidate.path)
        except SignerError as exc:
            count(self.state, exc, candidate.path)
            raise
        return ExitCode.OK

    def _is_own(self, candidate: Candidate) -> bool:
        """True for a ``step-N/`` of the run's own root (``<run_dir>/checkpoints``)."""
        roots = self.state.roots
        return any(r.announced_only and r.path == candidate.root for r in roots) and candidate.layout == "warden"

    def _already_signed(self, candidate: Candidate, announced: Announced | None = None) -> str | None:
        """The signed root digest when a ``.sig`` exists, verifies and (if announced) covers the
        announced digest; None otherwise. A mismatching one is about to be replaced (the same
        step saved again after a resume)."""
        if not os.path.lexists(candidate.signature_path):
            gone = gone_before_signing(candidate)
            if gone is not None:
                raise CheckpointVanished(f"{candidate.path}: {gone} before it could be signed", candidate.path)
            return None
        if self.catching_up and announced is not None:
            signed = self._signed_statement_digest(candidate, announced)
            if signed is not None:
                return signed
        try:
            result = verify(self.state, candidate)
        except (SignatureMissing, UnsupportedSignature):
            return None
        if result.ok and (announced is None or announced.root_digest in announcement_digests(result)):
            self.state.log.info("already signed", extra=fields(self.state, candidate))
            self.state.unsigned.pop(candidate.path, None)
            return result.signed_root_digest
        why = result.summary() if not result.ok else f"it signs root {result.signed_root_digest}, not the announced one"
        self.state.log.warning(f"replacing a signature that does not match: {why}", extra=fields(self.state, candidate))
        return None

    def _signed_statement_digest(self, candidate: Candidate, announced: Announced) -> str | None:
        """The signed root digest when the ``.sig`` verifies (signature only, no file hashed), names
        this checkpoint and covers the announced digest; None otherwise (then the full check runs)."""
        try:
            _key, statement = read_signed_statement(candidate.signature_path, self.state.trusted)
        except (SignerError, OSError):
            return None
        digests = {statement.subject_digest, statement.provenance.files_root_digest} - {None}
        if statement.manifest.name != os.path.basename(candidate.path) or announced.root_digest not in digests:
            return None
        self.state.log.info("already signed (by the previous lease holder)", extra=fields(self.state, candidate))
        self.state.unsigned.pop(candidate.path, None)
        return statement.subject_digest


def event_candidate(state: SignerState, raw: str, step: int | None) -> Candidate:
    """The checkpoint an event names (``raw``: its path; ``step``: the event's, for a name no layout
    knows). A relative path is under the run dir; a ``step-N`` of Warden's layout not found where it
    is named is looked for in the run's own root (the trainer may see the run volume at another
    mount point than this container; an HF or verl checkpoint moved into the run's root is not the
    one announced). ``checkpoint.saved`` and ``run.resumed`` both resolve their paths here."""
    run_dir = state.run_dir
    base = run_dir or os.getcwd()
    path = os.path.normpath(raw if os.path.isabs(raw) else os.path.join(base, raw))
    named = layout_of(os.path.basename(path))
    if not os.path.lexists(path) and run_dir and named is not None and named[0] == "warden":
        moved = os.path.join(run_dir, RUN_CHECKPOINTS, os.path.basename(path))
        path = moved if os.path.lexists(moved) else path
    known = layout_of(os.path.basename(path))
    layout, found = known if known else ("warden", step if step is not None else 0)
    return Candidate(path, found, layout)


def announcement_digests(result: VerifyResult) -> set[str | None]:
    """The digests of a verified signature an announcement can equal: the signed root (files
    serialization) and, for shards, the per-file root recorded beside it."""
    files_root = result.provenance.files_root_digest if result.provenance is not None else None
    return {result.signed_root_digest, files_root} - {None}
