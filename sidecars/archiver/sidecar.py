"""The ``archiver`` sidecar: a signed, hash-chained record of every reward snapshot, in S3.

A thin adapter over :class:`warden.archive.service.Archiver` (what each event does: the
module docstring there): it opens the store, the spool and the chain state from the policy
and the state directory, turns ``TryAgainLater`` into the runtime's RetryLater (the event
waits in the journal), and maps the uploader's state to the check's outcome.

With ``lease.enabled`` (several nodes on one run, :mod:`warden.lease`) only the holder of the
run's lease handles events and uploads; on taking the lease it resyncs from the store
(:meth:`~warden.archive.service.Archiver.resync`) and replays the journal.

The uploader (:mod:`warden.archive.uploader`) drains the spool in a thread. The first
:meth:`ArchiverSidecar.check` drains it synchronously instead, so ``--once`` exits 0
only when every record is in the store (3 while the store is down, 1 on a conflict).
"""

from __future__ import annotations

import os

from sidecars.archiver.metrics import ArchiverMetrics
from sidecars.runner import journal_trusted
from sidecars.runtime import Outcome, RetryLater, Sidecar, SidecarContext
from warden.archive.chain import ChainState, default_state_path
from warden.archive.policy import ArchiverPolicy
from warden.archive.service import Archiver, load_signer
from warden.archive.signing import RecordSigner
from warden.archive.spool import Spool
from warden.archive.store import Store, open_store
from warden.errors import TryAgainLater
from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, RUN_STARTED, CursorStore, Event
from warden.lease import LeaseGate, keeper_for


class ArchiverSidecar(Sidecar[ArchiverPolicy]):
    name = "archiver"
    description = "signs a hash-chained record of each reward snapshot and archives it to S3 (spools while down)"
    default_port = 9462
    policy_schema = ArchiverPolicy
    handles = frozenset({RUN_STARTED, REWARD_SNAPSHOT, CHECKPOINT_SAVED})
    needs_run_dir = True

    def __init__(self, ctx: SidecarContext, *, store: Store | None = None, signer: RecordSigner | None = None) -> None:
        super().__init__(ctx)
        signer = signer or load_signer(self.policy)
        store = store or open_store(
            self.policy.store_url(),
            addressing_style=self.policy.addressing_style,
            timeout=self.policy.request_timeout_seconds,
            max_connections=self.policy.upload_concurrency + 4,
            attempts=1,  # the uploader's back-off with jitter is the retry policy
        )
        os.makedirs(ctx.state_dir, exist_ok=True)
        spool = Spool(os.path.join(ctx.state_dir, "spool"), clock=ctx.clock)
        chains = ChainState(default_state_path(ctx.state_dir))
        self.metrics = ArchiverMetrics(ctx.registry, spool)
        self.lease = keeper_for(
            self.policy.lease, self.name, ctx.run_dir, clock=ctx.clock, registry=ctx.registry, log=ctx.log
        )
        self._first_check = True
        self._conflicts_reported = 0
        self.archiver = Archiver(
            self.policy,
            store=store,
            signer=signer,
            spool=spool,
            chains=chains,
            metrics=self.metrics,
            log=ctx.log,
            name=self.name,
            lease=self.lease,
        )
        self.store, self.spool, self.uploader = store, spool, self.archiver.uploader
        self.gate: LeaseGate | None = None
        if self.lease is not None:
            self.gate = LeaseGate(
                self.lease,
                ctx.journal_path,
                self.handles,
                self.archiver.handle,
                on_acquire=self.archiver.resync,
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
                    return Outcome.OK  # standing by: the holder archives it
            self.archiver.handle(event)
        except TryAgainLater as exc:
            raise RetryLater(str(exc)) from None
        return Outcome.OK

    def check(self) -> Outcome:
        if self.gate is not None:
            try:
                acting = self.gate.acting()
            except TryAgainLater:
                return Outcome.INCOMPLETE
            if not acting:
                if self._first_check:
                    self._first_check = False
                    self.uploader.start()  # idle until this process takes the lease
                return Outcome.OK
        if self._first_check:
            self._first_check = False
            self.uploader.run_pass()
            self.uploader.start()
        if self.uploader.lock_state is False:
            raise self.uploader.lock_missing_error()
        conflicts = self.uploader.conflicts_total - self._conflicts_reported
        self._conflicts_reported = self.uploader.conflicts_total
        if conflicts:
            return Outcome.VIOLATION
        if self.uploader.failing is not None and (self.spool.depth() or self.uploader.heads_pending()):
            return Outcome.INCOMPLETE
        return Outcome.OK

    def close(self) -> None:
        self.archiver.close()
        if self.lease is not None:
            self.lease.close()
