"""Drains the spool into the store, run by run, in step order, with back-off after failures.

One pass (:meth:`Uploader.run_pass`) takes each run's spooled records in step order and
creates them with :meth:`~warden.archive.store.Store.create` (``If-None-Match: *``),
up to ``concurrency`` at a time in a sliding window, handling the answers in step order;
at the first failure the pass stops, so the head never passes a
step that is not stored, and the records after the failure stay spooled (retried later,
they find themselves "already stored"). A record the store already holds with different
bytes is a conflict: set aside, counted, never overwritten.

The stored prefix is forgotten by the spool every :data:`FORGET_EVERY` records and at the
end of the run's drain: first the run's signed head (its newest stored record) is written
to the spool, then the records it covers are removed, then the head is put to the store.
A crash anywhere leaves records still to upload (answered "already stored") or a head to
put again; the spool's head file is never removed, so it and the spooled records always
give the chain head (see :mod:`warden.archive.chain`).

:meth:`Uploader.start` runs passes in a thread (:meth:`Uploader.serve`): at once when
:meth:`notify` is called, otherwise every second, and after a failure only when the
back-off delay (doubling from ``initial_seconds`` up to ``max_seconds``, times a random
factor in [0.5, 1)) has passed. Each turn of that loop first waits, with a timeout, on
one condition (new records, or, while the store is failing, the back-off deadline; stop
ends either), then acts: so it never turns without waiting. After a failure the retry
happens at the deadline even with nothing spooled (:meth:`Uploader.probe`: one cheap
request), so every failed attempt is counted in ``store_errors`` and a store that comes
back is noticed.

With a run lease (multi-node, :mod:`warden.lease`) only the holder uploads: a pass does nothing
while this process does not hold the lease, and every put and head put is preceded by a fresh
check of the lease file (:meth:`~warden.lease.LeaseKeeper.guard`); a put refused there stops the
pass without counting as a store failure, and its record stays spooled.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from warden.archive.chain import ChainState
from warden.archive.errors import ObjectLockMissing, StoreConflict, StoreError
from warden.archive.instruments import UploadMetrics
from warden.archive.policy import BackoffPolicy
from warden.archive.record import build_head, head_key, object_hash, step_key
from warden.archive.signing import RecordSigner
from warden.archive.spool import Spool
from warden.archive.store import Created, Retention, Store
from warden.lease import LeaseKeeper, LeaseLost
from warden.logs import log_fields

# Stored records are dropped from the spool (after the head covering them is spooled) in
# groups this large, or at the end of a run's drain: one atomic head write per group.
FORGET_EVERY = 256
# With nothing to upload and the store healthy, the loop looks at the spool this often
# (records are normally announced by notify()).
IDLE_SECONDS = 1.0
# What a probe lists (one key at most): the archiver's own prefix, which its IAM policy may list.
PROBE_PREFIX = "runs/"


def _event_wait(event: threading.Event, timeout: float) -> bool:
    return event.wait(timeout)


def _nothing() -> None:
    """The after-put check without a lease."""


class Fenced(StoreError):
    """A put not made: this process does not hold the run's lease with the current token."""


@dataclass
class PassResult:
    """What one pass did: records stored, conflicts found, and the failure that stopped it."""

    stored: int = 0
    conflicts: list[str] = field(default_factory=list)
    failure: StoreError | None = None


class Uploader:
    def __init__(
        self,
        store: Store,
        spool: Spool,
        chains: ChainState,
        signer: RecordSigner,
        metrics: UploadMetrics,
        log: logging.Logger,
        *,
        retention: Retention | None,
        require_object_lock: bool,
        concurrency: int,
        backoff: BackoffPolicy,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Event, float], bool] = _event_wait,
        lease: LeaseKeeper | None = None,
    ) -> None:
        """``rng`` draws the back-off jitter; ``monotonic`` and ``wait`` (``event.wait(timeout)``,
        the only way the loop waits) are the clock: a test passes a simulated one of each."""
        self.store, self.spool, self.chains, self.signer = store, spool, chains, signer
        self.metrics, self.log = metrics, log
        self.retention = retention
        self.concurrency = concurrency
        self.backoff = backoff
        self._rng = rng or random.Random()
        self._monotonic = monotonic
        self._wait = wait
        self.lease = lease
        self.ready_token: int | None = None
        """The lease token under which the spool was reset (Archiver.resync): only then does this
        process upload, so nothing spooled under an earlier holding is ever put."""
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="archiver-put") if concurrency > 1 else None
        self._pass_lock = threading.Lock()
        self._work = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._heads_put: dict[str, bytes] = {}
        self.retry_at = 0.0
        self.failing: StoreError | None = None
        self.conflicts_total = 0
        self.lock_state: bool | None = None if require_object_lock else True
        metrics.object_lock.set(1 if self.lock_state else 0)

    # -- Object Lock -------------------------------------------------------------------------
    def verify_object_lock(self) -> bool:
        """True when Object Lock is not required or the bucket has it. Raises StoreError when unreachable."""
        if self.lock_state is None:
            self.lock_state = self.store.object_lock_enabled()
            self.metrics.object_lock.set(1 if self.lock_state else 0)
        return self.lock_state

    def lock_missing_error(self) -> ObjectLockMissing:
        return ObjectLockMissing(
            f"{self.store.url}: the policy requires Object Lock (retention) but the bucket was created without it; "
            "create a bucket with Object Lock enabled (aws s3api create-bucket --object-lock-enabled-for-bucket) "
            "or set retention.mode: none"
        )

    # -- one pass ------------------------------------------------------------------------------
    def run_pass(self) -> PassResult:
        """Uploads everything spooled now; stops at the first store failure.

        Every outcome goes through :meth:`_after_pass`, a bucket without the Object Lock the
        policy requires included: a failure always sets the next retry's deadline.
        """
        result = PassResult()
        if not self.holding():
            return result
        with self._pass_lock:
            try:
                if not self.verify_object_lock():
                    result.failure = self.lock_missing_error()
                else:
                    for run_id in self.spool.runs():
                        if self._stop.is_set() or not self._drain_run(run_id, result):
                            break
            except StoreError as exc:
                result.failure = exc
            self._after_pass(result)
        return result

    def probe(self) -> PassResult:
        """One cheap question to the store, the retry after a failure when nothing is spooled.

        The Object Lock check while it is unknown (it must be asked anyway), else a listing of
        at most one key. Counted and backed off like a pass (``store_errors``, ``store_up``).
        """
        result = PassResult()
        with self._pass_lock:
            try:
                if self.lock_state is None:
                    if not self.verify_object_lock():
                        result.failure = self.lock_missing_error()
                elif self.lock_state is False:
                    result.failure = self.lock_missing_error()
                else:
                    self.store.list_keys(PROBE_PREFIX, limit=1)
            except StoreError as exc:
                result.failure = exc
            self._after_pass(result)
        return result

    def _drain_run(self, run_id: str, result: PassResult) -> bool:
        """Uploads ``run_id``'s records and puts its head; False when a failure stopped it."""
        stored: list[tuple[int, bytes]] = []  # stored, not yet forgotten by the spool
        try:
            for step, body, answer in self._answers(run_id):
                if isinstance(answer, Fenced):
                    return False
                if isinstance(answer, StoreConflict):
                    self._conflict(run_id, step, answer, result)
                elif isinstance(answer, StoreError):
                    result.failure = answer
                    return False
                else:
                    self.metrics.archived.inc()
                    result.stored += 1
                stored.append((step, body))
                if len(stored) >= FORGET_EVERY:
                    self._forget(run_id, stored)
                    stored = []
        finally:
            if stored:
                self._forget(run_id, stored)
        return self._put_head(run_id)

    def _answers(self, run_id: str) -> Iterator[tuple[int, bytes, Created | StoreError]]:
        """The store's answers for the run's spooled steps, in step order.

        Up to ``concurrency`` puts are in flight (a sliding window, not batches); steps
        spooled meanwhile join the window. Stops early when the pass is stopped; when the
        caller stops consuming, puts still in flight finish and are simply not reported.
        """
        if self._pool is None:
            last = -1
            while not self._stop.is_set():
                following = self.spool.steps_after(run_id, last, 1)
                if not following:
                    return
                last = following[0]
                yield self._store_one(run_id, last)
            return
        window: deque[Future[tuple[int, bytes, Created | StoreError]]] = deque()
        last = -1
        try:
            while not self._stop.is_set():
                if len(window) < self.concurrency:
                    more = self.spool.steps_after(run_id, last, self.concurrency - len(window))
                    for step in more:
                        window.append(self._pool.submit(self._store_one, run_id, step))
                        last = step
                if not window:
                    return
                yield window.popleft().result()
        finally:
            for future in window:
                future.cancel()

    def _store_one(self, run_id: str, step: int) -> tuple[int, bytes, Created | StoreError]:
        body = self.spool.read(run_id, step)
        confirm = self._fence()
        if confirm is None:
            return step, body, Fenced(f"run {run_id} step {step}: not the lease holder; not put", "lease")
        started = self._monotonic()
        try:
            answer: Created | StoreError = self.store.create(step_key(run_id, step), body, self.retention)
        except StoreError as exc:
            answer = exc
        finally:
            confirm()  # a put that outlasted the lease pages (late_write)
        self.metrics.upload_seconds.observe(self._monotonic() - started)
        return step, body, answer

    def _fence(self) -> Callable[[], None] | None:
        """None when this process may not put now; else the check to run right after the put (the
        lease's :meth:`~warden.lease.LeaseKeeper.fence`; nothing to check without a lease)."""
        if self.lease is None:
            return _nothing
        if not self.holding():
            return None
        try:
            return self.lease.fence()
        except LeaseLost:
            return None

    def _conflict(self, run_id: str, step: int, exc: StoreConflict, result: PassResult) -> None:
        where = self.spool.set_aside(run_id, step)
        self.conflicts_total += 1
        self.metrics.conflicts.inc()
        self.metrics.store_errors.labels("conflict").inc()
        result.conflicts.append(f"run {run_id} step {step}: {exc} (our record kept in {where})")
        self.log.error(
            f"conflict: {exc}", extra=log_fields(run_id=run_id, step=step, key=exc.key, kind="conflict", kept=where)
        )

    def _forget(self, run_id: str, stored: list[tuple[int, bytes]]) -> None:
        """Spools the signed head of the stored prefix ``stored``, then drops its records from the spool."""
        chain = self.chains.get(run_id)
        last_step, last_body = stored[-1]
        head = build_head(
            run_id=run_id,
            genesis=chain.genesis if chain and chain.genesis else None,
            first_step=chain.first_step if chain else None,
            last_step=last_step,
            last_hash=object_hash(last_body),
        )
        self.spool.set_head(run_id, self.signer.sign_head(head))
        for step, _ in stored:
            self.spool.remove(run_id, step)  # conflicts were already set aside: a no-op for them
        self.metrics.last_step.set(last_step)

    def _put_head(self, run_id: str) -> bool:
        """Puts the run's spooled head unless the store already got these bytes from this process;
        False when the lease check refused the put."""
        body = self.spool.head(run_id)
        if body is not None and self._heads_put.get(run_id) != body:
            confirm = self._fence()
            if confirm is None:
                return False
            try:
                self.store.put(head_key(run_id), body, self.retention)
            finally:
                confirm()
            self._heads_put[run_id] = body
        return True

    def holding(self) -> bool:
        """True without a lease, else while this process holds it under the token its spool was reset
        for (no I/O: the keeper's last read)."""
        return self.lease is None or (self.ready_token is not None and self.lease.held() == self.ready_token)

    def between_passes(self, action: Callable[[], int]) -> int:
        """Runs ``action`` while no pass runs, then forgets which heads this process put (the
        spool was reset: :meth:`Archiver.resync <warden.archive.service.Archiver.resync>`)."""
        with self._pass_lock:
            result = action()
            self._heads_put.clear()
            return result

    def _after_pass(self, result: PassResult) -> None:
        failure = result.failure
        if failure is None:
            self._failures = 0
            self.retry_at = 0.0
            if self.failing is not None:
                self.log.info("store reachable again", extra=log_fields(store=self.store.url))
            self.failing = None
            self.metrics.store_up.set(1)
            return
        self._failures += 1
        delay = min(self.backoff.max_seconds, self.backoff.initial_seconds * 2 ** (self._failures - 1))
        delay *= self._rng.uniform(0.5, 1.0)
        self.retry_at = self._monotonic() + delay
        self.metrics.store_errors.labels(failure.kind).inc()
        self.metrics.store_up.set(0)
        if self.failing is None or self._failures % 10 == 0:
            self.log.warning(
                f"store failing, spooling: {failure}",
                extra=log_fields(kind=failure.kind, spooled=self.spool.depth(), retry_in=round(delay, 2)),
            )
        self.failing = failure

    def heads_pending(self) -> bool:
        """Whether some run's spooled head has not been put by this process yet."""
        return any(self._heads_put.get(run) != self.spool.head(run) for run in self.spool.head_runs())

    # -- background thread --------------------------------------------------------------------
    def notify(self) -> None:
        """New records were spooled."""
        self._work.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve, name="archiver-upload", daemon=True)
            self._thread.start()

    def serve(self) -> None:
        """Uploads until :meth:`close`: what :meth:`start`'s thread runs.

        Every turn waits exactly once, with a timeout, before it acts: while the store is
        failing, on stop until the back-off deadline (new records wait for the retry too),
        then retries (a pass, or a :meth:`probe` with nothing spooled), which moves the
        deadline on or ends the failure; otherwise on new records (:meth:`notify`) or stop,
        for at most :data:`IDLE_SECONDS`, then passes when anything is spooled.
        """
        while not self._stop.is_set():
            if self.failing is not None:
                self._wait(self._stop, max(0.0, self.retry_at - self._monotonic()))
            else:
                self._wait(self._work, IDLE_SECONDS)
            if self._stop.is_set():
                return
            self._work.clear()  # before looking: a record spooled from now on wakes the next turn
            if not self.holding():
                continue  # standing by: this turn waited
            pending = self.spool.depth() > 0 or self.heads_pending()
            if not pending and self.failing is None:
                continue  # idle: this turn waited
            try:
                if pending:
                    self.run_pass()
                else:
                    self.probe()
            except Exception:  # a bug must not end uploads for good: log, back off, go on
                self.log.exception("upload pass crashed", extra=log_fields(store=self.store.url))
                self._after_pass(PassResult(failure=StoreError("upload pass crashed", "internal")))

    def close(self, timeout: float = 15.0) -> None:
        self._stop.set()
        self._work.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
