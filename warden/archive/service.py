"""What the archiver does with journal events: the chain logic, without the sidecar runtime.

Event handling (at least once; every handler is idempotent):

- ``run.started``: the run's genesis is the digest of its ``genesis_nonce`` and ``config_digest``
  (:func:`warden.archive.anchor.genesis_of`; the bare config digest for journals older than the
  nonce). A run this state directory has never seen is first looked up in the store, so a lost
  state directory resumes the stored chain instead of forking it (store unreachable, or a stored chain this key cannot
  verify: :class:`~warden.errors.TryAgainLater`, which the sidecar turns into the
  runtime's RetryLater: the events wait in the journal);
- ``checkpoint.saved``: remembered as the run's checkpoint reference;
- ``reward.snapshot``: a step at or before the run's chain head is a replay and is
  skipped; otherwise the record is built, signed, written to the spool (the commit
  point) and the chain head advances. The event is done then: the store is not needed.

Several nodes on one run (a run lease, :mod:`warden.lease`): only the holder handles events and
uploads; on taking the lease, :meth:`Archiver.resync` sets aside what this state directory spooled
before (the previous owner may have stored other records for those steps) and forgets the chain
heads, which the next event looks up in the store again; the sidecar then replays the journal.

The uploader (:mod:`warden.archive.uploader`) drains the spool in a thread; the sidecar
(:mod:`sidecars.archiver.sidecar`) decides when, and what the uploader's state means for a check.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import Any

from warden.archive.anchor import genesis_of
from warden.archive.chain import ChainState, RunChain, recover_from_store
from warden.archive.errors import BadSnapshotEvent, ChainRecoveryError, RecordInvalid, StoreError
from warden.archive.instruments import ArchiveMetrics
from warden.archive.policy import ArchiverPolicy
from warden.archive.record import (
    MAX_STEP,
    Limits,
    build_record,
    genesis_for_run,
    object_hash,
    step_key,
    valid_run_id,
)
from warden.archive.signing import RecordSigner, verify_record
from warden.archive.spool import FENCED, Spool
from warden.archive.store import Retention, Store
from warden.archive.uploader import Uploader
from warden.errors import ConfigError, TryAgainLater
from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, RUN_STARTED, Event
from warden.lease import LeaseKeeper
from warden.logs import log_fields
from warden.payloads import CheckpointSaved, PayloadError, RewardSnapshot
from warden.signing.keys import load_private_key

NOTE_REASONS = (
    ("dropped", "dropped_sample"),
    ("truncated", "truncated_text"),
    ("UTF-8", "repaired_text"),
    ("no 'samples'", "no_samples"),
)


def load_signer(policy: ArchiverPolicy) -> RecordSigner:
    """The record signer from ``signing_key``; ConfigError when unset or unusable."""
    path = policy.signing_key_path()
    if path is None:
        raise ConfigError(
            f"archiver policy: signing_key is {policy.signing_key!r}, which does not resolve to a file; "
            "set WARDEN_SIGNING_KEY or signing_key to the private key from `warden keys generate`"
        )
    return RecordSigner(load_private_key(path))


class Archiver:
    """Turns events into signed, chained, spooled records; owns the :class:`Uploader` that stores them.

    On construction it refuses a store without the Object Lock the policy requires (when the
    store can be asked now) and rebuilds each run's chain head from the spool. ``name`` is the
    ``sidecar`` field of its log lines.
    """

    def __init__(
        self,
        policy: ArchiverPolicy,
        *,
        store: Store,
        signer: RecordSigner,
        spool: Spool,
        chains: ChainState,
        metrics: ArchiveMetrics,
        log: logging.Logger,
        name: str = "archiver",
        lease: LeaseKeeper | None = None,
    ) -> None:
        self.policy, self.store, self.signer, self.spool, self.chains = policy, store, signer, spool, chains
        self.metrics, self.log, self.name, self.lease = metrics, log, name, lease
        self.limits = Limits(policy.top_k, policy.min_reward, policy.max_text_bytes)
        retention = policy.retention
        self.uploader = Uploader(
            store,
            spool,
            chains,
            signer,
            metrics,
            log,
            retention=Retention(retention.mode, retention.days) if retention.mode != "none" else None,
            require_object_lock=retention.needs_object_lock,
            concurrency=policy.upload_concurrency,
            backoff=policy.backoff,
            lease=lease,
        )
        self._head_seqs: dict[str, tuple[int, int | None]] = {}  # run -> (head step, its event seq)
        self._refuse_without_object_lock()
        for run_id, step in self.chains.reconcile(self.spool, self.signer.own_trust):
            log.debug("chain head from the spool", extra=log_fields(sidecar=self.name, run_id=run_id, step=step))

    def _refuse_without_object_lock(self) -> None:
        try:
            ok = self.uploader.verify_object_lock()
        except StoreError as exc:
            self.log.warning(
                f"cannot check Object Lock now, checking before the first upload: {exc}",
                extra=log_fields(sidecar=self.name, kind=exc.kind),
            )
            return
        if not ok:
            self.store.close()
            raise self.uploader.lock_missing_error()

    def resync(self) -> None:
        """After this process took the run's lease: the spool's records and heads go to ``.fenced/``
        (kept as evidence, never uploaded) and every chain head is forgotten, so the next event of a
        run finds the chain as the store has it (the previous owner's records) and continues it; the
        events replayed then are skipped up to the stored head and archived after it."""

        def reset() -> int:
            moved = self.spool.set_aside_all(FENCED)
            self.chains.forget_all()
            self._head_seqs.clear()
            return moved

        token = self.lease.held() if self.lease is not None else None
        moved = self.uploader.between_passes(reset)
        self.uploader.ready_token = token
        self.log.info(
            "took the run lease: chains are looked up in the store again",
            extra=log_fields(sidecar=self.name, set_aside=moved),
        )

    # -- events -------------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Handles one event; raises TryAgainLater when it must wait, BadSnapshotEvent when it cannot be archived."""
        if not valid_run_id(event.run_id):
            self.metrics.event_problems.labels("unusable_event").inc()
            raise BadSnapshotEvent(f"event seq {event.seq}: run id {event.run_id!r} cannot name a key; not archived")
        if event.type == RUN_STARTED:
            genesis = genesis_of(event.data)
            self._ensure_run(event.run_id, genesis)
        elif event.type == CHECKPOINT_SAVED:
            self._remember_checkpoint(event)
        elif event.type == REWARD_SNAPSHOT:
            self._archive(event)

    def _ensure_run(self, run_id: str, genesis: str | None = None) -> RunChain:
        chain = self.chains.get(run_id)
        if chain is not None:
            return chain
        try:
            chain = recover_from_store(self.store, run_id, self.signer.own_trust)
        except StoreError as exc:
            self._store_failed(exc)
            raise TryAgainLater(f"run {run_id}: cannot look the run up in the store: {exc}") from None
        except ChainRecoveryError as exc:
            # Never fork or drop: the run's events wait in the journal until someone looks.
            raise TryAgainLater(
                f"run {run_id}: {exc}; the run's events wait in the journal until the objects under "
                f"runs/{run_id}/ are explained (restore this archiver's state directory, or move them aside)"
            ) from None
        if chain is not None:
            self.log.info(
                "continuing the chain found in the store",
                extra=log_fields(sidecar=self.name, run_id=run_id, step=chain.head_step),
            )
        else:
            source = "run.started" if genesis else "run_id"
            chain = RunChain(run_id, genesis or genesis_for_run(run_id), source)
        self.chains.set(chain)
        return chain

    def _remember_checkpoint(self, event: Event) -> None:
        """The newest checkpoint, named in the following records by step, path and (when announced)
        the root digest its signature covers, so that a record names the signed checkpoint."""
        try:
            saved = CheckpointSaved.from_data(event.data)
        except PayloadError:
            return
        if event.step is None:
            return
        chain = self._ensure_run(event.run_id)
        reference: dict[str, Any] = {"step": event.step, "path": saved.path}
        if saved.announced is not None:
            reference.update(root_digest=saved.root_digest, file_count=saved.file_count)
        if chain.checkpoint != reference:
            self.chains.set(replace(chain, checkpoint=reference))

    def _archive(self, event: Event) -> None:
        step = event.step
        if step is None or not 0 <= step <= MAX_STEP:
            self.metrics.event_problems.labels("unusable_event").inc()
            raise BadSnapshotEvent(f"run {event.run_id} event seq {event.seq}: reward.snapshot without a valid step")
        chain = self._ensure_run(event.run_id)
        if chain.head_step is not None and step <= chain.head_step:
            self._already_chained(event, step, chain.head_step, self._head_seq(chain))
            return
        record = build_record(
            run_id=event.run_id,
            step=step,
            time=event.time,
            event_seq=event.seq,
            snapshot=_snapshot_of(event),
            link=chain.link(),
            limits=self.limits,
            checkpoint=chain.checkpoint,
        )
        self._count_notes(record["notes"], event)
        body = self.signer.sign_record(record)
        self.spool.add(event.run_id, step, body)
        self.chains.advance(event.run_id, step, object_hash(body))
        self.metrics.spooled.inc()
        self.uploader.notify()

    def _head_seq(self, chain: RunChain) -> int | None:
        """Journal seq of the event behind the chain's head record (spool, else store; cached)."""
        assert chain.head_step is not None
        cached = self._head_seqs.get(chain.run_id)
        if cached is not None and cached[0] == chain.head_step:
            return cached[1]
        try:
            if chain.head_step in self.spool.steps(chain.run_id):
                body: bytes | None = self.spool.read(chain.run_id, chain.head_step)
            else:
                body = self.store.get(step_key(chain.run_id, chain.head_step))
        except (OSError, StoreError) as exc:
            if isinstance(exc, StoreError):
                self._store_failed(exc)
            raise TryAgainLater(f"run {chain.run_id}: cannot read the head record to tell a replay: {exc}") from None
        seq = None
        if body is not None:
            with contextlib.suppress(RecordInvalid):
                record, _ = verify_record(body, self.signer.own_trust, f"run {chain.run_id} step {chain.head_step}")
                seq = record.body.get("event_seq")
        seq = seq if isinstance(seq, int) else None
        self._head_seqs[chain.run_id] = (chain.head_step, seq)
        return seq

    def _store_failed(self, exc: StoreError) -> None:
        """A failed store request of the event path, counted like the uploader's (the event waits)."""
        self.metrics.store_errors.labels(exc.kind).inc()
        self.metrics.store_up.set(0)

    def _already_chained(self, event: Event, step: int, head_step: int, head_seq: int | None) -> None:
        """A snapshot for a step at or before the chain's head: a replay, or a new one, dropped loudly.

        A replay (a restart, a lost cursor) re-delivers events the chain already holds: their
        seq is at most the head record's. A later seq is a new snapshot for an archived step
        (a run resumed from an earlier checkpoint, or two runs under one run id): the first
        record of a step stays, and that is never silent.
        """
        fields = log_fields(sidecar=self.name, run_id=event.run_id, step=step, head_step=head_step, seq=event.seq)
        if head_seq is None or event.seq <= head_seq:
            self.metrics.replayed.inc()
            self.log.info("snapshot for a step already chained (a replay); not archived again", extra=fields)
            return
        self.metrics.superseded.inc()
        self.log.warning(
            f"run {event.run_id}: a new snapshot for step {step}, which is already archived (the chain is at step "
            f"{head_step}); not archived: the first record of a step stays. A run resumed from an earlier step, "
            "or two runs writing under one run id (give each its own)",
            extra=fields,
        )

    def _count_notes(self, notes: list[str], event: Event) -> None:
        for note in notes:
            reason = next((label for marker, label in NOTE_REASONS if marker in note), None)
            if reason is not None:
                self.metrics.event_problems.labels(reason).inc()
        if notes:
            self.log.warning(
                "snapshot archived with notes",
                extra=log_fields(sidecar=self.name, run_id=event.run_id, step=event.step, notes=notes[:5]),
            )

    def close(self) -> None:
        self.uploader.close(timeout=self.policy.request_timeout_seconds + 2)
        self.spool.close()
        self.store.close()


def _snapshot_of(event: Event) -> RewardSnapshot:
    """The event's snapshot; a payload that does not parse is archived with no samples and a note."""
    try:
        return RewardSnapshot.from_data(event.data)
    except PayloadError:
        return RewardSnapshot()
