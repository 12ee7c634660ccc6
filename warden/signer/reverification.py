"""Re-verification of signed checkpoints: on an interval, and at once for a resumed checkpoint.

Once per ``reverify_interval_seconds`` (0: never) every checkpoint with a ``.sig`` in a
root, or that this signer signed (also outside the roots, from an event), is queued; the
first check verifies the whole queue, later checks one checkpoint each. The checkpoint a
``run.resumed`` names (:mod:`warden.signer.resume_checking`) goes through the same
:meth:`Reverification.verify_one` at once. A failure is
``warden_signer_verify_failures_total{reason}`` and counts in
``warden_signer_invalid_checkpoints`` (WardenCheckpointVerificationFailed) until it verifies
again; one signed by this signer whose ``.sig`` disappeared while its directory is still there
fails with ``signature_missing``, an entry that is not a real directory (a symlink, a FIFO)
with ``unsafe_path``. A resumed checkpoint that failed is kept in ``<state_dir>/resumed.json``
(:mod:`warden.signer.resumes`): it still counts as invalid after a restart, is verified again on
the first check and in every round, and its log lines name the run and step that resumed from
it. A verl checkpoint whose ``actor/`` and ``critic/`` retention removed as a whole, the rest
unchanged, was pruned (``warden_signer_pruned_total``), not tampered with.
"""

from __future__ import annotations

import os
import stat

import warden.layouts as verl_layout
from warden.errors import ExitCode
from warden.signer.announcements import SIGNATURE_MISSING
from warden.signer.operations import count, fields, verify
from warden.signer.resumes import FAILED, INCOMPLETE, OK, PRUNED, FailedResume, Resumed, ResumedStore
from warden.signer.state import SignerState
from warden.signer.watch import Candidate, layout_of, list_checkpoints
from warden.signing.errors import CheckpointVanished, HashingCancelled, SignatureMissing, SignerError
from warden.signing.hashing import refusal_reason
from warden.signing.verify import FILES_MISMATCH, UNSAFE_PATH, VerifyResult

Verdict = tuple[str, ExitCode]
"""A verification's result (:data:`warden.signer.resumes.RESULTS`: ok, failed, pruned, incomplete) and outcome."""


def pruned_by_retention(candidate: Candidate, result: VerifyResult) -> tuple[str, ...] | None:
    """The role directories verl's retention removed, when that alone explains ``result``'s
    failure (:func:`warden.layouts.pruned_roles`); None for every other failure
    and every other layout."""
    if candidate.layout != "verl" or result.codes != [FILES_MISMATCH]:
        return None
    changed = len(result.modified) + len(result.extra)
    present = verl_layout.observe(candidate.path).roles
    return verl_layout.pruned_roles([d.name for d in result.missing], changed, present)


def not_a_directory(path: str) -> str | None:
    """What ``path`` is when it is there but not a real directory (``a symlink``, ``a FIFO``...);
    None for a directory, a missing path or one that cannot be looked at. Never opens it."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return None
    return refusal_reason(mode) or "a regular file"


class Reverification:
    """Re-verifies signed checkpoints on the policy's interval and on demand; keeps the invalid and pruned sets."""

    def __init__(self, state: SignerState, resumed: ResumedStore | None = None) -> None:
        self.state = state
        self.resumed = resumed if resumed is not None else ResumedStore(None)
        self._queue: list[Candidate] = []
        self._next_round = 0.0
        self._invalid: set[str] = {e.candidate.path for e in self.resumed.entries()}  # verified on the first check
        self._pruned: set[str] = set()
        self._verified: set[str] = set()  # paths verify_one judged in this process
        state.metrics.invalid.set(len(self._invalid))

    def check(self, now: float, first: bool) -> ExitCode:
        """Verifies queued signed checkpoints (all of them on the ``first`` check, else one); refills on time.
        Without an interval, the first check still verifies the resumed checkpoints that failed before."""
        metrics = self.state.metrics
        if not self.state.policy.reverify_interval_seconds:
            outcome = self._recheck_failed_resumes() if first else ExitCode.OK
            metrics.invalid.set(len(self._invalid))
            return outcome
        if not self._queue and now >= self._next_round:
            self._refill(now)
        outcome = ExitCode.OK
        budget = len(self._queue) if first else 1
        while self._queue and budget > 0 and not self.state.stop.is_set():
            budget -= 1
            candidate = self._queue.pop(0)
            try:
                outcome = max(outcome, self.verify_one(candidate)[1])
            except HashingCancelled:
                self._queue.insert(0, candidate)
                break
            if not self._queue:
                metrics.last_reverify.set(self.state.clock())
        metrics.invalid.set(len(self._invalid))
        return outcome

    def _recheck_failed_resumes(self) -> ExitCode:
        """Verifies again the resumed checkpoints a previous process found failed. One this process
        already judged (its ``run.resumed`` was handled before the first check) is not verified
        twice: each verification counts one failure, whatever the order of events and checks."""
        outcome = ExitCode.OK
        for entry in self.resumed.entries():
            if entry.candidate.path in self._verified:
                continue
            if self.state.stop.is_set():
                return max(outcome, ExitCode.INCOMPLETE)
            try:
                outcome = max(outcome, self.verify_one(entry.candidate)[1])
            except HashingCancelled:
                return max(outcome, ExitCode.INCOMPLETE)
        return outcome

    def _refill(self, now: float) -> None:
        """Queues every signed checkpoint (and every resumed one that failed) for the round that starts at ``now``."""
        queue = [
            c
            for root in self.state.roots
            for c in list_checkpoints(root.path, root.layout)
            if os.path.lexists(c.signature_path) or self._was_signed(c)
        ] + self._signed_outside_roots()
        queued = {c.path for c in queue}
        self._queue = queue + [e.candidate for e in self.resumed.entries() if e.candidate.path not in queued]
        self._invalid &= {c.path for c in self._queue}
        self._pruned &= {c.path for c in self._queue}
        self._next_round = now + self.state.policy.reverify_interval_seconds
        if not self._queue:
            self.state.metrics.last_reverify.set(self.state.clock())

    def _signed_outside_roots(self) -> list[Candidate]:
        """Checkpoints signed from an event (the verl bridge's ``checkpoint.saved``) in a directory
        no root watches: re-verified too, so verl's retention there is counted as pruned."""
        watched = {r.path for r in self.state.roots}
        out = []
        for path, _record in self.state.announced.signed():
            known = layout_of(os.path.basename(path))
            if known is not None and os.path.dirname(path) not in watched and os.path.isdir(path):
                out.append(Candidate(path, known[1], known[0]))
        return out

    def _was_signed(self, candidate: Candidate) -> bool:
        """True when the signer signed (or adopted) this checkpoint: it stays in re-verification."""
        record = self.state.announced.get(candidate.path)
        return record is not None and record.signed_digest is not None

    # -- one checkpoint: the one verification path ----------------------------------------------
    def verify_one(self, candidate: Candidate, resumed: Resumed | None = None) -> Verdict:
        """Verifies ``candidate`` against its ``.sig`` and the trusted keys; counts the result, logs a
        failure (and a resumed checkpoint that verified) and keeps the invalid set.

        ``resumed``: the ``run.resumed`` that named it (else the one remembered for it, if its last
        verification as a resumed checkpoint failed): a failure is remembered and the log lines name
        that run and step. Raises HashingCancelled when the signer is stopping (nothing counted).
        """
        resumed = resumed or self._resumed_of(candidate.path)
        self._verified.add(candidate.path)
        unsafe = not_a_directory(candidate.path)
        if unsafe is not None:
            message = f"{candidate.path} is {unsafe}, not a checkpoint directory; it is never verified"
            return FAILED, self.fail(candidate, UNSAFE_PATH, message, resumed)
        try:
            result = verify(self.state, candidate)
        except SignatureMissing as exc:
            return self._signature_missing(candidate, exc, resumed)
        except CheckpointVanished as exc:
            count(self.state, exc, candidate.path)
            self._gone(candidate.path)
            return PRUNED, ExitCode.OK
        except HashingCancelled:
            self._verified.discard(candidate.path)
            raise
        except SignerError as exc:
            count(self.state, exc, candidate.path)
            self.state.metrics.verifications.labels("incomplete").inc()
            return INCOMPLETE, ExitCode.INCOMPLETE
        return self._judge(candidate, result, resumed)

    def fail(
        self,
        candidate: Candidate,
        reason: str,
        message: str,
        resumed: Resumed | None = None,
        codes: list[str] | None = None,
    ) -> ExitCode:
        """Counts a failed verification (``reason``: the first problem code), logs ``message`` and
        keeps the checkpoint invalid until it verifies again; remembered when it is a resumed one."""
        metrics = self.state.metrics
        metrics.verifications.labels("failed").inc()
        metrics.verify_failures.labels(reason).inc()
        self._invalid.add(candidate.path)
        self._pruned.discard(candidate.path)
        about = f" for {resumed.describe()}" if resumed is not None else ""
        more = resumed.fields() if resumed is not None else {}
        if resumed is not None:
            self.resumed.put(FailedResume(candidate, resumed, reason))
        self.state.log.error(
            f"re-verification failed{about}: {message}",
            extra=fields(self.state, candidate, codes=codes or [reason], reason=reason, **more),
        )
        metrics.invalid.set(len(self._invalid))
        return ExitCode.VIOLATION

    def _resumed_of(self, path: str) -> Resumed | None:
        entry = self.resumed.get(path)
        return entry.resumed if entry is not None else None

    def _gone(self, path: str) -> None:
        """The checkpoint is gone (pruned with its ``.sig``, or by retention): no longer invalid."""
        self._invalid.discard(path)
        self.resumed.forget(path)
        self.state.metrics.invalid.set(len(self._invalid))

    def _signature_missing(self, candidate: Candidate, exc: SignatureMissing, resumed: Resumed | None) -> Verdict:
        """A ``.sig`` gone with its directory was pruned; gone from a directory still there, a violation."""
        if not os.path.isdir(candidate.path):
            self._gone(candidate.path)  # pruned: the directory went with its .sig
            return PRUNED, ExitCode.OK
        count(self.state, exc, candidate.path)
        if resumed is not None:
            message = f"{candidate.signature_path} does not exist: not signed, or its .sig was deleted"
        else:
            message = f"{candidate.signature_path} was deleted after signing"
        return FAILED, self.fail(candidate, SIGNATURE_MISSING, message, resumed)

    def _judge(self, candidate: Candidate, result: VerifyResult, resumed: Resumed | None) -> Verdict:
        """Counts a completed verification: ok, pruned by verl's retention, or failed (a violation)."""
        metrics = self.state.metrics
        if result.ok:
            metrics.verifications.labels("ok").inc()
            self._invalid.discard(candidate.path)
            self.resumed.forget(candidate.path)
            metrics.invalid.set(len(self._invalid))
            if resumed is not None:
                self.state.log.info(
                    f"verified {resumed.describe()}: {result.summary()}",
                    extra=fields(self.state, candidate, root_digest=result.signed_root_digest, **resumed.fields()),
                )
            return OK, ExitCode.OK
        pruned = pruned_by_retention(candidate, result)
        if pruned:
            self._gone(candidate.path)
            if candidate.path not in self._pruned:
                self._pruned.add(candidate.path)
                metrics.pruned.labels(candidate.layout).inc()
                self.state.log.info(
                    f"pruned by retention, not tampered with: {', '.join(r + '/' for r in pruned)} removed as a "
                    "whole, every other signed file unchanged",
                    extra=fields(self.state, candidate, removed=list(pruned)),
                )
            return PRUNED, ExitCode.OK
        return FAILED, self.fail(candidate, result.codes[0], result.summary(), resumed, result.codes)
