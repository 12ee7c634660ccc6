"""Periodic re-verification of every signed checkpoint.

Once per ``reverify_interval_seconds`` (0: never) every checkpoint with a ``.sig`` in a
root, or that this signer signed (also outside the roots, from an event), is queued; the
first check verifies the whole queue, later checks one checkpoint each. A failure is
``warden_signer_verify_failures_total{reason}`` and counts in
``warden_signer_invalid_checkpoints`` until it verifies again; one signed by this signer
whose ``.sig`` disappeared while its directory is still there fails with
``signature_missing``. A verl checkpoint whose ``actor/`` and ``critic/`` retention removed
as a whole, the rest unchanged, was pruned (``warden_signer_pruned_total``), not tampered with.
"""

from __future__ import annotations

import os

import warden.layouts as verl_layout
from warden.errors import ExitCode
from warden.signer.announcements import SIGNATURE_MISSING
from warden.signer.operations import count, fields, verify
from warden.signer.state import SignerState
from warden.signer.watch import Candidate, layout_of, list_checkpoints
from warden.signing.errors import CheckpointVanished, HashingCancelled, SignatureMissing, SignerError
from warden.signing.verify import FILES_MISMATCH, VerifyResult


def pruned_by_retention(candidate: Candidate, result: VerifyResult) -> tuple[str, ...] | None:
    """The role directories verl's retention removed, when that alone explains ``result``'s
    failure (:func:`warden.layouts.pruned_roles`); None for every other failure
    and every other layout."""
    if candidate.layout != "verl" or result.codes != [FILES_MISMATCH]:
        return None
    changed = len(result.modified) + len(result.extra)
    present = verl_layout.observe(candidate.path).roles
    return verl_layout.pruned_roles([d.name for d in result.missing], changed, present)


class Reverification:
    """Re-verifies signed checkpoints on the policy's interval; keeps the invalid and pruned sets."""

    def __init__(self, state: SignerState) -> None:
        self.state = state
        self._queue: list[Candidate] = []
        self._next_round = 0.0
        self._invalid: set[str] = set()
        self._pruned: set[str] = set()

    def check(self, now: float, first: bool) -> ExitCode:
        """Verifies queued signed checkpoints (all of them on the ``first`` check, else one); refills on time."""
        metrics = self.state.metrics
        if not self.state.policy.reverify_interval_seconds:
            return ExitCode.OK
        if not self._queue and now >= self._next_round:
            self._refill(now)
        outcome = ExitCode.OK
        budget = len(self._queue) if first else 1
        while self._queue and budget > 0 and not self.state.stop.is_set():
            budget -= 1
            outcome = max(outcome, self._reverify_one(self._queue.pop(0)))
            if not self._queue:
                metrics.last_reverify.set(self.state.clock())
        metrics.invalid.set(len(self._invalid))
        return outcome

    def _refill(self, now: float) -> None:
        """Queues every signed checkpoint for the round that starts at ``now``."""
        self._queue = [
            c
            for root in self.state.roots
            for c in list_checkpoints(root.path, root.layout)
            if os.path.lexists(c.signature_path) or self._was_signed(c)
        ] + self._signed_outside_roots()
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

    def _reverify_one(self, candidate: Candidate) -> ExitCode:
        try:
            result = verify(self.state, candidate)
        except HashingCancelled:
            self._queue.insert(0, candidate)
            return ExitCode.OK
        except SignatureMissing as exc:
            return self._signature_missing(candidate, exc)
        except CheckpointVanished as exc:
            count(self.state, exc, candidate.path)
            self._invalid.discard(candidate.path)
            return ExitCode.OK
        except SignerError as exc:
            count(self.state, exc, candidate.path)
            self.state.metrics.verifications.labels("incomplete").inc()
            return ExitCode.INCOMPLETE
        return self._judge(candidate, result)

    def _signature_missing(self, candidate: Candidate, exc: SignatureMissing) -> ExitCode:
        """A ``.sig`` gone with its directory was pruned; gone from a directory still there, a violation."""
        if not os.path.isdir(candidate.path):
            self._invalid.discard(candidate.path)  # pruned: the directory went with its .sig
            return ExitCode.OK
        count(self.state, exc, candidate.path)
        self.state.metrics.verifications.labels("failed").inc()
        self.state.metrics.verify_failures.labels(SIGNATURE_MISSING).inc()
        self._invalid.add(candidate.path)
        self.state.log.error(
            f"re-verification failed: {candidate.signature_path} was deleted after signing",
            extra=fields(self.state, candidate, codes=[SIGNATURE_MISSING]),
        )
        return ExitCode.VIOLATION

    def _judge(self, candidate: Candidate, result: VerifyResult) -> ExitCode:
        """Counts a completed verification: ok, pruned by verl's retention, or failed (a violation)."""
        metrics = self.state.metrics
        if result.ok:
            metrics.verifications.labels("ok").inc()
            self._invalid.discard(candidate.path)
            return ExitCode.OK
        pruned = pruned_by_retention(candidate, result)
        if pruned:
            self._invalid.discard(candidate.path)
            if candidate.path not in self._pruned:
                self._pruned.add(candidate.path)
                metrics.pruned.labels(candidate.layout).inc()
                self.state.log.info(
                    f"pruned by retention, not tampered with: {', '.join(r + '/' for r in pruned)} removed as a "
                    "whole, every other signed file unchanged",
                    extra=fields(self.state, candidate, removed=list(pruned)),
                )
            return ExitCode.OK
        self._pruned.discard(candidate.path)
        metrics.verifications.labels("failed").inc()
        metrics.verify_failures.labels(result.codes[0]).inc()
        self._invalid.add(candidate.path)
        self.state.log.error(
            f"re-verification failed: {result.summary()}", extra=fields(self.state, candidate, codes=result.codes)
        )
        return ExitCode.VIOLATION
