"""The uploader's loop in simulated time: back-off while the store is down, never a turn without a wait.

The loop (:meth:`Uploader.serve`) runs in the test's thread on a :class:`~support.FakeClock`:
a wait advances simulated time at once, so ten minutes of outage take milliseconds, and a
loop that turned without waiting would fail the clock's spin guard instead of hanging.
The store is a :class:`~support.FakeStore`, taken down and brought back at set times.
"""

from __future__ import annotations

import itertools
import logging
import random

import pytest
from prometheus_client import CollectorRegistry
from support import FakeClock, FakeStore

from sidecars.archiver.metrics import ArchiverMetrics
from warden.archive.chain import ChainState
from warden.archive.errors import StoreError
from warden.archive.policy import ArchiverPolicy, BackoffPolicy
from warden.archive.record import head_key, step_key
from warden.archive.service import Archiver
from warden.archive.signing import RecordSigner
from warden.archive.spool import Spool
from warden.archive.uploader import IDLE_SECONDS, Uploader
from warden.errors import TryAgainLater
from warden.journal import RUN_STARTED, Event
from warden.signing.keys import load_private_key

BACKOFF = BackoffPolicy(initial_seconds=0.5, max_seconds=30.0)  # the shipped policy's
OUTAGE = 600.0  # simulated seconds the store is down, from t=0
RUN = "run-1"


class Rig:
    """An uploader over a real spool and signer, a fake store and simulated time."""

    def __init__(self, tmp_path, private_key: str, *, object_lock: bool = True) -> None:
        self.clock = FakeClock()
        self.store = FakeStore(object_lock=object_lock, clock=lambda: self.clock.now)
        self.spool = Spool(str(tmp_path / "spool"))
        self.chains = ChainState(str(tmp_path / "chain.json"))
        self.registry = CollectorRegistry()
        self.metrics = ArchiverMetrics(self.registry, self.spool)
        self.signer = RecordSigner(load_private_key(private_key))

    def uploader(self, *, require_object_lock: bool = False, seed: int = 0) -> Uploader:
        return Uploader(
            self.store,
            self.spool,
            self.chains,
            self.signer,
            self.metrics,
            logging.getLogger("test.uploader"),
            retention=None,
            require_object_lock=require_object_lock,
            concurrency=1,
            backoff=BACKOFF,
            rng=random.Random(seed),
            monotonic=self.clock.monotonic,
            wait=self.clock.wait,
        )

    def spool_records(self, uploader: Uploader, steps) -> None:
        for step in steps:
            self.spool.add(RUN, step, f"record {step}".encode())
            uploader.notify()

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def turns_before(self, when: float) -> int:
        """Turns of the loop that began before ``when``: each turn waits exactly once."""
        return sum(1 for start, _ in self.clock.waits if start < when)


@pytest.fixture
def rig(tmp_path, keys):
    rig = Rig(tmp_path, keys[0])
    yield rig
    rig.spool.close()


def most_attempts(span: float, backoff: BackoffPolicy = BACKOFF) -> int:
    """Attempts that fit in ``span`` seconds from a first one at 0 if every delay were its shortest."""
    t, failures = 0.0, 0
    while True:
        following = t + 0.5 * min(backoff.max_seconds, backoff.initial_seconds * 2**failures)
        if following > span:
            return failures + 1
        t, failures = following, failures + 1


def assert_backed_off(times: list[float], backoff: BackoffPolicy = BACKOFF) -> None:
    """The gap after the n-th consecutive failure is min(max, initial * 2^(n-1)) times a factor in [0.5, 1)."""
    for n, (before, after) in enumerate(itertools.pairwise(times), start=1):
        full = min(backoff.max_seconds, backoff.initial_seconds * 2 ** (n - 1))
        assert 0.5 * full - 1e-9 <= after - before <= full + 1e-9, f"gap {n}: {after - before:.3f}s, schedule {full}s"


@pytest.mark.parametrize(
    ("require_object_lock", "spooled_at_start", "spooled_later"),
    [
        (True, [], []),  # the issue: the lock check failed at start, nothing spooled
        (True, [], [1, 2, 3]),  # records spooled during the outage (the run's events got through)
        (False, [1, 2, 3, 4, 5], [6, 7]),  # records waiting from a previous start
    ],
    ids=["lock-check-nothing-spooled", "spooled-during-outage", "spooled-before-and-during"],
)
def test_an_outage_is_retried_on_the_back_off_schedule_counted_and_drained(
    rig, require_object_lock, spooled_at_start, spooled_later
):
    rig.store.down = True
    uploader = rig.uploader(require_object_lock=require_object_lock)
    rig.spool_records(uploader, spooled_at_start)
    rig.clock.at(100.0, lambda: rig.spool_records(uploader, spooled_later))
    rig.clock.at(OUTAGE, lambda: setattr(rig.store, "down", False))
    rig.clock.at(OUTAGE + 120.0, uploader.close)

    assert uploader.run_pass().failure is not None  # the sidecar's first check, synchronous
    uploader.serve()

    failed = rig.store.failed_attempts()
    assert failed[0] == 0.0 and max(failed) < OUTAGE
    assert len(failed) >= 20, "the store was not retried while down"  # ~30 s apart at most, over 600 s
    assert_backed_off(failed)
    # One wait per turn, one attempt per turn while failing: the loop never turned idle.
    assert len(failed) - 1 <= rig.turns_before(OUTAGE) <= len(failed) <= most_attempts(OUTAGE)
    assert rig.sample("warden_archiver_store_errors_total", kind="connect") == len(failed)

    recovered_at = min(when for when, _, ok in rig.store.attempts if ok)
    assert OUTAGE <= recovered_at <= OUTAGE + BACKOFF.max_seconds
    steps = spooled_at_start + spooled_later
    assert sorted(k for k in rig.store.objects if "/steps/" in k) == [step_key(RUN, s) for s in steps]
    assert (head_key(RUN) in rig.store.objects) == bool(steps)
    assert rig.spool.depth() == 0 and not uploader.heads_pending()
    assert uploader.failing is None and uploader.lock_state is True
    assert rig.sample("warden_archiver_store_up") == 1
    assert rig.sample("warden_archiver_records_archived_total") == len(steps)
    # After the drain, idle turns of IDLE_SECONDS each: no more requests, no faster turns.
    idle = [timeout for start, timeout in rig.clock.waits if start > recovered_at + 1.0]
    assert idle and all(timeout == IDLE_SECONDS for timeout in idle)
    assert all(when <= recovered_at + 1.0 for when, _, _ in rig.store.attempts)


def test_a_pass_that_crashes_is_retried_on_the_back_off_schedule(rig, monkeypatch):
    """A bug in a pass (not a StoreError) backs off like a store failure, counted as internal."""
    uploader = rig.uploader()
    rig.spool_records(uploader, [1])
    crashes: list[float] = []
    real_create = rig.store.create

    def create(key, body, retention=None):
        if rig.clock.now < OUTAGE:
            crashes.append(rig.clock.now)
            raise RuntimeError("a bug")
        return real_create(key, body, retention)

    monkeypatch.setattr(rig.store, "create", create)
    rig.clock.at(OUTAGE + 60.0, uploader.close)
    uploader.serve()

    assert crashes[0] == 0.0 and len(crashes) >= 20  # the first turn: notify() had set the wake-up
    assert_backed_off(crashes)
    assert rig.turns_before(OUTAGE) <= len(crashes) + 1
    assert rig.sample("warden_archiver_store_errors_total", kind="internal") == len(crashes)
    assert rig.store.objects == {step_key(RUN, 1): b"record 1", head_key(RUN): rig.spool.head(RUN)}
    assert uploader.failing is None


def test_a_bucket_without_object_lock_is_reported_on_the_back_off_schedule(rig, tmp_path, keys):
    """Object Lock required and missing, nothing spooled: failing for good, yet no spin."""
    rig.store.object_lock = False
    uploader = rig.uploader(require_object_lock=True)
    rig.clock.at(OUTAGE, uploader.close)
    assert uploader.run_pass().failure is not None
    uploader.serve()

    assert uploader.lock_state is False
    assert [op for _, op, _ in rig.store.attempts] == ["GetObjectLockConfiguration"]  # asked once: the answer stays
    failures = rig.sample("warden_archiver_store_errors_total", kind="object_lock_missing")
    assert rig.turns_before(OUTAGE) <= failures <= most_attempts(OUTAGE)
    assert failures >= 20


def test_idle_with_the_store_up_sends_nothing_and_a_new_record_goes_at_once(rig):
    uploader = rig.uploader(require_object_lock=True)
    assert uploader.run_pass().failure is None
    rig.clock.at(50.5, lambda: rig.spool_records(uploader, [1]))
    rig.clock.at(100.0, uploader.close)
    uploader.serve()

    assert [(when, op) for when, op, _ in rig.store.attempts] == [
        (0.0, "GetObjectLockConfiguration"),
        (50.5, "PutObject"),  # the record, woken by notify(), not by the idle timeout
        (50.5, "PutObject"),  # the head
    ]
    assert all(timeout == IDLE_SECONDS for _, timeout in rig.clock.waits)
    assert 99 <= len(rig.clock.waits) <= 102


def test_close_ends_a_long_back_off_wait_at_once(rig):
    rig.store.down = True
    uploader = rig.uploader()
    rig.spool_records(uploader, [1])
    for _ in range(10):  # failures enough for the longest delay
        uploader.run_pass()
    waiting_until = uploader.retry_at
    assert waiting_until - rig.clock.now >= 0.5 * BACKOFF.max_seconds
    rig.clock.at(rig.clock.now + 1.0, uploader.close)
    uploader.serve()
    assert rig.clock.now == 1.0 < waiting_until
    assert len(rig.clock.waits) == 1


def test_a_probe_is_a_counted_request(rig):
    """With the lock check done and nothing to upload, the retry is a one-key listing."""
    uploader = rig.uploader()
    rig.store.down = True
    result = uploader.probe()
    assert isinstance(result.failure, StoreError) and result.failure.kind == "connect"
    assert rig.store.attempts == [(0.0, "ListObjectsV2", False)]
    assert rig.sample("warden_archiver_store_errors_total", kind="connect") == 1
    assert rig.sample("warden_archiver_store_up") == 0 and uploader.failing is not None
    assert uploader.retry_at > 0
    rig.store.down = False
    assert uploader.probe().failure is None
    assert uploader.failing is None and uploader.retry_at == 0.0
    assert rig.sample("warden_archiver_store_up") == 1


def test_the_archivers_failed_run_look_up_is_a_counted_store_error(rig):
    """run.started looks the run up in the store: a failure there is a failed store request too."""
    rig.store.down = True
    archiver = Archiver(
        ArchiverPolicy(),
        store=rig.store,
        signer=rig.signer,
        spool=rig.spool,
        chains=rig.chains,
        metrics=rig.metrics,
        log=logging.getLogger("test.archiver"),
    )
    before = rig.sample("warden_archiver_store_errors_total", kind="connect")  # the start's Object Lock check
    event = Event(seq=1, run_id=RUN, type=RUN_STARTED, time="2025-01-01T00:00:00Z", data={"config_digest": "ab"})
    with pytest.raises(TryAgainLater):
        archiver.handle(event)
    assert rig.sample("warden_archiver_store_errors_total", kind="connect") == before + 1
    assert rig.sample("warden_archiver_store_up") == 0
