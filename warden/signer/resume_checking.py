"""Verifying the checkpoint a ``run.resumed`` names, at once, whichever trainer wrote the event.

Warden's trainer, the HF callback and the verl bridge all write
:class:`~warden.payloads.RunResumed`: ``checkpoint`` (a path, or None when the integration
could not tell) and ``from_step``. Which checkpoint is checked:

- ``checkpoint`` given: resolved as an announced path is
  (:func:`~warden.signer.announced_signing.event_candidate`: relative to the run dir, a
  ``step-N`` looked for in the run's own root when the trainer sees another mount point), and
  checked only when it lies directly in a watched root or in a directory announced
  checkpoints live in, under a name of a known layout (or announced itself). Anything else
  is refused and never read: a path with control or invisible characters, over 4096
  characters, outside those directories, or a payload that does not parse;
- ``checkpoint`` None: the one checkpoint of that run at ``from_step`` the signer knows (its
  announcements, else the watched roots' spelling of the step); none or several: ``unnamed``.

The check is :meth:`Reverification.verify_one
<warden.signer.reverification.Reverification.verify_one>`, the periodic re-verification,
against the trusted keys. A checkpoint that does not verify (bytes changed, ``.sig`` missing
or invalid, a symlink or FIFO in its place) counts in ``warden_signer_invalid_checkpoints``
and ``warden_signer_verify_failures_total{reason}``, which pages
(WardenCheckpointVerificationFailed); the error log line names the path, the reason and the
run and step that resumed from it, untrusted values quoted
(:func:`warden.errors.quote_untrusted`). One gone is ``checkpoint_missing``, unless the journal
retired it since (``checkpoint.pruned``: a replay after a long stop). Each event counts once in
``warden_signer_resumed_checks_total{result}`` (:data:`warden.signer.resumes.RESULTS`); a
verified one also logs ``verified the resumed checkpoint of run ... at step ...``. A hash
abandoned on SIGTERM is :class:`~warden.errors.TryAgainLater`: the cursor stays before the event
and the checkpoint is checked on the next start.
"""

from __future__ import annotations

import os

from warden.errors import ExitCode, TryAgainLater, quote_untrusted
from warden.journal import JOURNAL_NAME, Event, JournalError
from warden.ledger import read_ledger
from warden.logs import log_fields
from warden.payloads import PayloadError, RunResumed
from warden.signer.announced_signing import event_candidate
from warden.signer.operations import fields
from warden.signer.resumes import CHECKPOINT_MISSING, FAILED, PRUNED, REFUSED, UNNAMED, Resumed
from warden.signer.reverification import Reverification
from warden.signer.state import SignerState
from warden.signer.watch import CANONICAL, Candidate, layout_of
from warden.signing.errors import HashingCancelled

MAX_PATH = 4096
"""Characters of a ``run.resumed`` checkpoint path the signer looks at (PATH_MAX)."""


class ResumeChecking:
    """Handles ``run.resumed``: verifies the checkpoint the run went on from (see the module)."""

    def __init__(self, state: SignerState, reverification: Reverification) -> None:
        self.state = state
        self.reverify = reverification

    def run_resumed(self, event: Event) -> ExitCode:
        """Verifies the checkpoint ``event`` names; VIOLATION when it does not verify."""
        try:
            payload = RunResumed.from_data(event.data)
        except PayloadError as exc:
            resumed = Resumed(event.run_id, event.step, event.seq)
            return self._refused(resumed, event.data.get("checkpoint"), f"in a payload that does not parse ({exc})")
        step = payload.from_step if payload.from_step is not None else event.step
        resumed = Resumed(event.run_id, step, event.seq, payload.source)
        if payload.checkpoint is None:
            known = self._known_at(resumed)
            if isinstance(known, str):
                return self._unnamed(resumed, known)
            return self._check(known, resumed)
        located = self._locate(payload.checkpoint, resumed)
        if isinstance(located, str):
            return self._refused(resumed, payload.checkpoint, located)
        return self._check(located, resumed)

    # -- which checkpoint --------------------------------------------------------------------
    def _locate(self, raw: str, resumed: Resumed) -> Candidate | str:
        """The checkpoint ``raw`` names, or why it is not one the signer checks."""
        if not raw:
            return "an empty path"
        if len(raw) > MAX_PATH:
            return f"a path of {len(raw)} characters"
        if not raw.isprintable():
            return "a path with control or invisible characters"
        candidate = event_candidate(self.state, raw, resumed.step)
        watched = {r.path for r in self.state.roots}
        if candidate.root not in watched | self.state.announced.directories():
            return "outside the watched roots and the directories of announced checkpoints"
        if layout_of(os.path.basename(candidate.path)) is None and self.state.announced.get(candidate.path) is None:
            return "not a checkpoint name (step-NNNNNNNNN, checkpoint-N, global_step_N) and never announced"
        return candidate

    def _known_at(self, resumed: Resumed) -> Candidate | str:
        """The one checkpoint of ``resumed``'s run at its step the signer knows, or why there is none."""
        if resumed.step is None:
            return "names neither a checkpoint nor a step"
        step = resumed.step
        paths = sorted(p for p, r in self.state.announced.items() if r.step == step and r.run_id == resumed.run_id)
        if not paths:
            spelled = (os.path.join(r.path, CANONICAL[r.layout].format(step)) for r in self.state.roots)
            paths = sorted(p for p in spelled if os.path.lexists(p))
        if len(paths) != 1:
            return f"names no checkpoint, and the signer knows {len(paths)} of that run at step {step}"
        known = layout_of(os.path.basename(paths[0]))
        return Candidate(paths[0], known[1], known[0]) if known else Candidate(paths[0], step, "warden")

    # -- the check -----------------------------------------------------------------------------
    def _check(self, candidate: Candidate, resumed: Resumed) -> ExitCode:
        if not os.path.lexists(candidate.path):
            if self._retired(candidate, resumed):
                self.state.log.info(
                    f"{resumed.describe()} was pruned by retention since (checkpoint.pruned); nothing to verify",
                    extra=fields(self.state, candidate, **resumed.fields()),
                )
                return self._count(PRUNED, ExitCode.OK)
            message = f"{candidate.path} does not exist, and the journal has no checkpoint.pruned for it"
            return self._count(FAILED, self.reverify.fail(candidate, CHECKPOINT_MISSING, message, resumed))
        try:
            result, outcome = self.reverify.verify_one(candidate, resumed)
        except HashingCancelled:
            why = f"{candidate.path}: verification abandoned on stop; the run.resumed will be retried"
            raise TryAgainLater(why) from None
        return self._count(result, outcome)

    def _retired(self, candidate: Candidate, resumed: Resumed) -> bool:
        """True when the journal retired the checkpoint (``checkpoint.pruned``, not saved again since)."""
        if not self.state.run_dir:
            return False
        record = self.state.announced.get(candidate.path)
        run_id = record.run_id if record is not None and record.run_id else resumed.run_id
        try:
            ledger = read_ledger(os.path.join(self.state.run_dir, JOURNAL_NAME), run_id)
        except (JournalError, OSError):
            return False
        return candidate.step in ledger.pruned and candidate.step not in ledger.live

    def _count(self, result: str, outcome: ExitCode) -> ExitCode:
        self.state.metrics.resumed_checks.labels(result).inc()
        return outcome

    def _refused(self, resumed: Resumed, raw: object, why: str) -> ExitCode:
        """Checks nothing: counts and logs (the path quoted) why the event's checkpoint is not looked at."""
        shown = quote_untrusted(raw if isinstance(raw, str) else repr(raw), 300)
        why = quote_untrusted(why, 500)
        self.state.log.error(
            f"run.resumed seq {resumed.seq}: {resumed.describe()} is not verified: '{shown}' is {why}",
            extra=log_fields(sidecar=self.state.name, path=shown, reason=why, **resumed.fields()),
        )
        return self._count(REFUSED, ExitCode.INCOMPLETE)

    def _unnamed(self, resumed: Resumed, why: str) -> ExitCode:
        self.state.log.warning(
            f"run.resumed seq {resumed.seq} of run '{quote_untrusted(resumed.run_id, 200)}' {why}; nothing verified",
            extra=log_fields(sidecar=self.state.name, reason=why, **resumed.fields()),
        )
        return self._count(UNNAMED, ExitCode.INCOMPLETE)
