"""The ``signer`` sidecar: signs announced checkpoints and re-verifies signed ones.

The work is four services of :mod:`warden.signer` over one shared
:class:`~warden.signer.state.SignerState`; this module wires them to the runtime:

- ``checkpoint.saved`` and ``run.started`` events go to
  :class:`~warden.signer.announced_signing.AnnouncedSigning`: a checkpoint is signed only
  if its bytes hash to the ``root_digest`` and ``file_count`` the event announced, else
  refused (``warden_signer_refused_total{reason}``, a violation); a hash abandoned on
  SIGTERM is RetryLater (the event is handled again on the next start);
- ``run.resumed`` (Warden's trainer, the HF callback, the verl bridge) goes to
  :class:`~warden.signer.resume_checking.ResumeChecking`: the checkpoint the run went on from
  is verified at once by the periodic re-verification's code; one that does not verify counts
  in ``warden_signer_invalid_checkpoints`` (it pages) and is kept in ``<state_dir>/resumed.json``
  across restarts; every event counts in ``warden_signer_resumed_checks_total{result}``;
- :meth:`SignerSidecar.check`, every ``check_interval_seconds``, runs
  :class:`~warden.signer.root_scanning.RootScan` (the policy's ``watch`` roots: sign
  complete, stable, unsigned checkpoints; the run's own root ``<run_dir>/checkpoints``:
  audited, never signed, ``warden_signer_violating_checkpoints{reason}``) and then
  :class:`~warden.signer.reverification.Reverification` (every signed checkpoint once per
  ``reverify_interval_seconds``, and the failed resumed checkpoints on the first check).

With ``lease.enabled`` (several nodes on one run, :mod:`warden.lease`) only the holder of the
run's lease handles events and checks; a standby lets events pass and, on taking the lease,
replays the journal (what the previous owner signed is found signed); every ``.sig`` is written
only after a fresh look at the lease file (``SignerState.fence``).

The metric families are :mod:`sidecars.signer.metrics`; the ``keys`` and ``checkpoint``
commands :mod:`sidecars.signer.commands`.
"""

from __future__ import annotations

import os

from sidecars.runner import journal_trusted
from sidecars.runtime import Outcome, RetryLater, Sidecar, SidecarContext
from sidecars.signer.metrics import SignerMetrics
from warden.errors import TryAgainLater
from warden.journal import CHECKPOINT_SAVED, RUN_RESUMED, RUN_STARTED, CursorStore, Event
from warden.lease import LeaseGate, keeper_for
from warden.logs import log_fields
from warden.signer.announced_signing import AnnouncedSigning
from warden.signer.announcements import ANNOUNCED_FILE, AnnouncementStore
from warden.signer.policy import SignerPolicy
from warden.signer.resume_checking import ResumeChecking
from warden.signer.resumes import RESUMED_FILE, ResumedStore
from warden.signer.reverification import Reverification
from warden.signer.root_scanning import RootScan
from warden.signer.runs import RUNS_FILE, RunRegistry
from warden.signer.state import SignerState, policy_dir, roots_of, signing_key, trust_set


class SignerSidecar(Sidecar[SignerPolicy]):
    name = "signer"
    description = "hashes and signs checkpoints (checkpoint.saved, HF and verl roots), re-verifies them (and on resume)"
    default_port = 9461
    policy_schema = SignerPolicy
    handles = frozenset({CHECKPOINT_SAVED, RUN_STARTED, RUN_RESUMED})
    needs_run_dir = False

    def __init__(self, ctx: SidecarContext, use_watchdog: bool = True) -> None:
        super().__init__(ctx)
        key = signing_key(self.policy, ctx.policy_path)
        trusted = trust_set(key, self.policy.trusted_keys_path(policy_dir(ctx.policy_path)))
        self.metrics = SignerMetrics(ctx.registry)
        self.lease = keeper_for(
            self.policy.lease, self.name, ctx.run_dir, clock=ctx.clock, registry=ctx.registry, log=ctx.log
        )
        self.state = SignerState(
            name=self.name,
            policy=self.policy,
            key=key,
            trusted=trusted,
            metrics=self.metrics,
            roots=roots_of(self.policy, ctx.run_dir),
            runs=RunRegistry(os.path.join(ctx.state_dir, RUNS_FILE)),
            announced=AnnouncementStore(os.path.join(ctx.state_dir, ANNOUNCED_FILE)),
            log=ctx.log,
            clock=ctx.clock,
            stop=ctx.stop,
            run_dir=ctx.run_dir,
            fence=self.lease.fence if self.lease is not None else None,
        )
        self.scan = RootScan(self.state, use_watchdog)
        if self.state.announced.load_error:
            ctx.log.error(self.state.announced.load_error, extra=log_fields(sidecar=self.name))
        self.events = AnnouncedSigning(self.state)
        resumed = ResumedStore(os.path.join(ctx.state_dir, RESUMED_FILE))
        if resumed.load_error:
            ctx.log.error(resumed.load_error, extra=log_fields(sidecar=self.name))
        self.reverify = Reverification(self.state, resumed)
        self.resumes = ResumeChecking(self.state, self.reverify)
        self._first_check = True
        self.gate: LeaseGate | None = None
        if self.lease is not None:
            self.gate = LeaseGate(
                self.lease,
                ctx.journal_path,
                self.handles,
                self._catch_up,
                trusted=lambda: journal_trusted(ctx.journal_path),
                seen_seq=CursorStore(os.path.join(ctx.state_dir, "cursor.json")).load().seq,
                log=ctx.log,
            )
            self.lease.tick()
            self.lease.start()

    def handle(self, event: Event) -> Outcome:
        try:
            if self.gate is not None:
                self.gate.seen(event.seq)
                if not self.gate.acting(event.seq):
                    return Outcome.OK  # standing by: the holder handles it
            return self._act(event)
        except TryAgainLater as exc:
            raise RetryLater(str(exc)) from None

    def _catch_up(self, event: Event) -> Outcome:
        """An event replayed after taking the lease: what the previous holder signed is taken from
        its verified ``.sig`` statement, not hashed again (AnnouncedSigning.catching_up)."""
        self.events.catching_up = True
        try:
            return self._act(event)
        finally:
            self.events.catching_up = False

    def _act(self, event: Event) -> Outcome:
        if event.type == RUN_STARTED:
            return self.events.run_started(event)
        if event.type == RUN_RESUMED:
            return self.resumes.run_resumed(event)
        return self.events.checkpoint_saved(event)

    def check(self) -> Outcome:
        if self.gate is not None:
            try:
                if not self.gate.acting():
                    return Outcome.OK  # standing by: the holder scans and re-verifies
            except TryAgainLater:
                return Outcome.INCOMPLETE
        now = self.ctx.clock()
        outcome = self.scan.check(now, first=self._first_check)
        if not self.ctx.stop.is_set():
            outcome = max(outcome, self.reverify.check(now, first=self._first_check))
        self._first_check = False
        return outcome

    def close(self) -> None:
        self.scan.close()
        if self.lease is not None:
            self.lease.close()
