"""The run lease (warden/lease.py): one actor at a time under any schedule, pages on forgeries.

Generated schedules (hypothesis) run several keepers over one real lease directory, each with its
own clock offset within the skew bound: processes tick, try to act, stall and crash in any order
while time moves by any amount. Invariants:

- L1 at most one process acts at any instant: two successful guards of different processes are at
  least ``act_margin_seconds`` apart in real time (the margin covers the side effect itself);
- L2 honest schedules raise no alarm (no false page), whatever the skew within the bound;
- L3 a live standby holds the lease within ``duration + skew + 2 x renew`` of the holder's last
  renewal once the holder is gone;
- L4 a forged or stolen lease (token backwards, another holder while ours is in time, malformed
  bytes, an expiry no holder could write, a link / FIFO / oversized file) pages, and nobody acts
  on it.

``WARDEN_HYPOTHESIS_EXAMPLES`` sets the number of generated schedules (CI default 60; 2000 for a
full run); the hostile-storage harness plays every (access point, substitution) against a tick.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from security.hostile_storage import Operation, Outcome, Report, attack

from warden.lease import (
    ALARM_REASONS,
    LeaseFile,
    LeaseKeeper,
    LeaseMetrics,
    LeaseRecord,
    LeaseSettings,
    Observation,
    View,
    decide,
    may_act,
)

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = LeaseSettings(
    enabled=True, duration_seconds=10.0, renew_seconds=2.0, max_clock_skew_seconds=1.5, act_margin_seconds=1.0
)
SCOPE = "signer"


@dataclass
class World:
    """Real time, one lease directory, and one keeper per process (its clock = real time + offset)."""

    directory: str
    offsets: list[float]
    now: float = 1_700_000_000.0
    keepers: list[LeaseKeeper] = field(default_factory=list)
    alive: list[bool] = field(default_factory=list)
    acts: list[tuple[float, int]] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        io = LeaseFile(self.directory, SCOPE)
        for index, offset in enumerate(self.offsets):
            keeper = LeaseKeeper(io, SCOPE, f"node{index}:1", SETTINGS, clock=lambda o=offset: self.now + o)
            self.keepers.append(keeper)
            self.alive.append(True)

    def tick(self, index: int) -> None:
        if self.alive[index]:
            decision = self.keepers[index].tick()
            if decision.alarm is not None:
                self.alarms.append(f"node{index} {decision.alarm} at {self.now}")

    def act(self, index: int) -> None:
        if self.alive[index] and self.keepers[index].guard():
            self.acts.append((self.now, index))


def _world(offsets: list[float]) -> World:
    return World(tempfile.mkdtemp(prefix="lease-"), offsets)


# offsets within the skew bound, its ends included (where a wrong rule shows first)
offsets = st.lists(
    st.one_of(st.sampled_from([0.0, SETTINGS.max_clock_skew_seconds]), st.floats(0, SETTINGS.max_clock_skew_seconds)),
    min_size=2,
    max_size=4,
)
# one round: real time moves by dt, then each process does nothing, ticks, acts, or both (in that
# order); now and then one process crashes for good (kill -9: no release)
rounds = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 16).map(lambda q: q / 4), st.floats(0, 4)),
        st.lists(st.sampled_from(["none", "tick", "act", "tick+act", "act+tick"]), min_size=4, max_size=4),
        st.one_of(st.none(), st.none(), st.none(), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(offsets, rounds)
def test_at_most_one_process_acts_at_any_instant_and_honest_schedules_never_page(clock_offsets, schedule):
    world = _world(clock_offsets)
    try:
        for dt, ops, crash in schedule:
            world.now += dt
            for index in range(len(world.keepers)):
                for op in ops[index].split("+"):
                    if op != "none":
                        getattr(world, op)(index)
            if crash is not None and crash < len(world.keepers):
                world.alive[crash] = False
        for (t1, p1), (t2, p2) in zip(world.acts, world.acts[1:], strict=False):
            if p1 != p2:
                assert t2 - t1 >= SETTINGS.act_margin_seconds, f"node{p1} acted at {t1}, node{p2} at {t2}"
        assert world.alarms == []
    finally:
        shutil.rmtree(world.directory)


@settings(max_examples=max(10, EXAMPLES // 5), deadline=None)
@given(offsets, st.floats(0.05, 0.5), st.integers(0, 40))
def test_a_holder_whose_renewals_stall_and_an_eager_standby_never_act_together(clock_offsets, step, stall_after):
    """The schedule the random one rarely reaches: the holder's keeper stops renewing (a stalled
    thread, a paused NFS mount) while its side effects keep trying; every other process ticks and
    acts at every step, so the first moment a standby may act is hit."""
    world = _world(clock_offsets)
    try:
        world.tick(0)
        for round_index in range(int((SETTINGS.duration_seconds + 4 * SETTINGS.max_clock_skew_seconds) / step) + 60):
            world.now += step
            if round_index < stall_after:
                world.tick(0)
            world.act(0)
            for index in range(1, len(world.keepers)):
                world.tick(index)
                world.act(index)
        others = {p for _, p in world.acts} - {0}
        assert others, "no standby ever took over"
        for (t1, p1), (t2, p2) in zip(world.acts, world.acts[1:], strict=False):
            if p1 != p2:
                assert t2 - t1 >= SETTINGS.act_margin_seconds, f"node{p1} acted at {t1}, node{p2} at {t2}"
        assert world.alarms == []
    finally:
        shutil.rmtree(world.directory)


@settings(max_examples=max(20, EXAMPLES // 3), deadline=None)
@given(offsets, st.floats(0, SETTINGS.renew_seconds))
def test_a_standby_takes_over_within_the_lease_time_after_the_holder_stops(clock_offsets, phase):
    world = _world(clock_offsets)
    try:
        world.tick(0)
        assert world.keepers[0].held() == 1
        for index in range(1, len(world.keepers)):
            world.tick(index)
        last_renewal = world.now
        world.alive[0] = False  # kill -9: no release
        world.now += phase
        bound = SETTINGS.duration_seconds + SETTINGS.max_clock_skew_seconds + 2 * SETTINGS.renew_seconds
        taken_at = None
        while world.now - last_renewal <= bound + SETTINGS.renew_seconds:
            for index in range(1, len(world.keepers)):
                world.tick(index)
            holders = [i for i in range(1, len(world.keepers)) if world.keepers[i].held() is not None]
            assert len(holders) <= 1
            if holders:
                taken_at = world.now
                assert world.keepers[holders[0]].held() == 2
                break
            world.now += SETTINGS.renew_seconds
        assert taken_at is not None and taken_at - last_renewal <= bound
        assert world.alarms == []
    finally:
        shutil.rmtree(world.directory)


# -- L4: forgeries ----------------------------------------------------------------------------------
def _holding(tmp_path) -> tuple[World, LeaseFile]:
    world = World(str(tmp_path), [0.0, 0.5])
    world.tick(0)
    world.tick(1)
    assert world.keepers[0].held() == 1 and world.keepers[1].held() is None
    return world, LeaseFile(str(tmp_path), SCOPE)


def _forge(io: LeaseFile, kind: str, now: float, rng_token: int) -> None:
    if kind == "stolen":
        io.write(LeaseRecord(SCOPE, "intruder:6", rng_token + 2, now, now + 5))
    elif kind == "rewritten":
        io.write(LeaseRecord(SCOPE, "node0:1", rng_token, now, now + 5))  # ours, with an expiry we did not write
    elif kind == "malformed":
        with open(io.path, "wb") as fh:
            fh.write(b'{"version": 1, "token": "1"')
    elif kind == "expiry_too_far":
        io.write(LeaseRecord(SCOPE, "node0:1", rng_token, now, now + 10**6))
    elif kind == "link":
        os.unlink(io.path)
        os.symlink("/etc/hostname", io.path)
    elif kind == "fifo":
        os.unlink(io.path)
        os.mkfifo(io.path)
    elif kind == "oversized":
        with open(io.path, "wb") as fh:
            fh.truncate(1 << 30)
    elif kind == "missing":
        os.unlink(io.path)


EXPECTED = {
    "stolen": "stolen",
    "rewritten": "tampered",
    "malformed": "malformed",
    "expiry_too_far": "expiry_too_far",
    "link": "malformed",
    "fifo": "malformed",
    "oversized": "malformed",
    "missing": "missing",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_forged_or_stolen_lease_pages_the_holder_and_nobody_acts_on_it(tmp_path, kind):
    from prometheus_client import CollectorRegistry

    world, io = _holding(tmp_path)
    registry = CollectorRegistry()
    world.keepers[0].metrics = LeaseMetrics(registry, SCOPE)
    world.now += 1
    world.act(0)
    assert world.acts == [(world.now, 0)]
    _forge(io, kind, world.now, 1)
    assert not world.keepers[1].guard()
    world.act(0)  # the guard refuses, reads again (a tick): pages
    assert len(world.acts) == 1, "acted on a forged lease"
    assert world.keepers[0].view.alarm == EXPECTED[kind]
    assert registry.get_sample_value("warden_signer_lease_alarms_total", {"reason": EXPECTED[kind]}) == 1
    if kind in ("stolen", "expiry_too_far"):
        assert world.keepers[0].held() is None, "a holder that finds another holder steps down"
    else:
        assert world.keepers[0].held() == 1, "a holder repairs a lease file it still holds"
        assert io.read().record.holder == "node0:1"


def test_a_standby_seeing_a_token_go_backwards_pages(tmp_path):
    world, io = _holding(tmp_path)
    world.now += SETTINGS.duration_seconds + 5  # node0 gone quiet; node1 takes over with token 2
    world.tick(1)
    assert world.keepers[1].held() == 2
    io.write(LeaseRecord(SCOPE, "node0:1", 1, world.now, world.now + 5))  # a replayed old lease file
    assert world.keepers[1].tick().alarm == "stolen"
    world.tick(0)  # the old holder's lease ran out long ago: it stands by
    assert world.keepers[0].held() is None
    standby = View(highest=2)
    obs = Observation(LeaseRecord(SCOPE, "node0:1", 1, world.now, world.now + 5))
    assert decide(world.now, "node2:1", SCOPE, SETTINGS, standby, obs).alarm == "token_backwards"


def test_a_lease_naming_a_standby_is_not_acted_on_by_it():
    now = 100.0
    forged = LeaseRecord(SCOPE, "node1:1", 7, now, now + 5)
    assert not may_act(now, "node1:1", SETTINGS, View(), forged)
    decision = decide(now, "node1:1", SCOPE, SETTINGS, View(), Observation(forged, claim_token=7))
    assert decision.change == "standby" and decision.view.token is None


def test_a_persisting_forgery_is_taken_over_after_the_lease_time_and_keeps_paging_once(tmp_path):
    world, io = _holding(tmp_path)
    world.alive[0] = False
    io.write(LeaseRecord(SCOPE, "squatter:1", 50, world.now, world.now + 10**6))
    world.tick(1)
    assert world.alarms == ["node1 expiry_too_far at 1700000000.0"]
    world.now += SETTINGS.duration_seconds + SETTINGS.max_clock_skew_seconds + 0.1
    world.tick(1)
    assert world.keepers[1].held() == 51
    assert len(world.alarms) == 1


def test_settings_refuse_a_duration_without_room_for_a_second_renewal():
    with pytest.raises(ValueError, match="duration_seconds"):
        LeaseSettings(duration_seconds=4, renew_seconds=2, act_margin_seconds=1)


def test_every_alarm_reason_is_a_metric_label():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    LeaseMetrics(registry, "archiver")
    for reason in ALARM_REASONS:
        assert registry.get_sample_value("warden_archiver_lease_alarms_total", {"reason": reason}) == 0


# -- the hostile-storage harness against a holder's tick and guard ----------------------------------
SAMPLE = float(os.environ.get("WARDEN_HOSTILE_SAMPLE", "0.5"))


def _setup(scratch: str) -> dict:
    run = os.path.join(scratch, "run")
    os.makedirs(run)
    os.chmod(run, 0o777)  # the storage writer's
    victim = os.path.join(scratch, "outside", "victim")
    os.makedirs(os.path.dirname(victim))
    with open(victim, "wb") as fh:
        fh.write(b"not the lease")
    clock = {"now": 1000.0}
    keeper = LeaseKeeper(LeaseFile(run, SCOPE), SCOPE, "node0:1", SETTINGS, clock=lambda: clock["now"])
    keeper.tick()
    assert keeper.held() == 1
    clock["now"] += 1
    return {"run": run, "victim": victim, "keeper": keeper, "io": LeaseFile(run, SCOPE)}


def _run(ctx: dict) -> bool:
    ctx["keeper"].tick()
    return ctx["keeper"].guard()


def _check(ctx: dict, outcome: Outcome) -> list[str]:
    if outcome.kind != "ok" or not outcome.value:
        return []  # refused, or standing by / not acting: never a pass on a forged lease
    obs = ctx["io"].read()
    if obs.record is None or (obs.record.holder, obs.record.token) != ("node0:1", 1):
        return [f"acted while the lease file says {obs.record or obs.problem}"]
    return []


def test_hostile_storage_every_substitution_on_a_tick_ends_sound_refused_or_standing_by():
    report = Report()
    operation = Operation(
        name="lease tick+guard",
        setup=_setup,
        run=_run,
        check=_check,
        roots=lambda c: [c["run"]],
        protected=lambda c: [os.path.dirname(c["victim"])],
        victim=lambda c: c["victim"],
    )
    scratches: list[str] = []

    def scratch() -> str:
        scratches.append(tempfile.mkdtemp(prefix="lease-hostile-"))
        return scratches[-1]

    try:
        attack(operation, scratch, report, SAMPLE, seed=20261202)
    finally:
        for path in scratches:
            shutil.rmtree(path, ignore_errors=True)
    print(report.describe())
    assert report.failures == [], "\n".join(report.failures[:20])
    assert report.total() >= 10


# -- release, the catch-up gate, the policy section -------------------------------------------------
def test_a_holder_stopped_cleanly_hands_over_after_the_skew_not_the_lease_time(tmp_path):
    """A released lease (expires_at = now) is free once it has run out by the skew and the standby has
    seen it unchanged for the act margin (a forged expired record looks the same: a holder that checked
    just before the change has finished its side effect by then)."""
    world, _io = _holding(tmp_path)
    world.now += 1
    world.keepers[0].close(release=True)
    world.now += SETTINGS.max_clock_skew_seconds + 0.01
    world.tick(1)
    assert world.keepers[1].held() is None, "first sight of the released record: not yet"
    world.now += SETTINGS.act_margin_seconds
    world.tick(1)
    assert world.keepers[1].held() == 2
    assert world.alarms == []


def test_the_gate_stands_by_then_replays_the_journal_once_per_new_token(tmp_path):
    from warden.journal import EventWriter
    from warden.lease import LeaseGate

    clock = {"now": 1000.0}
    holder = LeaseKeeper(LeaseFile(str(tmp_path), SCOPE), SCOPE, "a", SETTINGS, clock=lambda: clock["now"])
    me = LeaseKeeper(LeaseFile(str(tmp_path), SCOPE), SCOPE, "b", SETTINGS, clock=lambda: clock["now"])
    holder.tick()
    me.tick()
    with EventWriter(str(tmp_path / "events.jsonl"), "r") as journal:
        events = [journal.emit("checkpoint.saved", {"path": f"/c/{n}"}, step=n) for n in range(1, 6)]
    handled: list[int] = []
    resyncs: list[int] = []
    gate = LeaseGate(
        me,
        str(tmp_path / "events.jsonl"),
        frozenset({"checkpoint.saved"}),
        lambda event: handled.append(event.seq),
        on_acquire=lambda: resyncs.append(1),
    )
    for event in events[:3]:
        gate.seen(event.seq)
        assert not gate.acting(event.seq)
    assert handled == [] and resyncs == []
    clock["now"] += SETTINGS.duration_seconds + SETTINGS.max_clock_skew_seconds + 0.1  # "a" is gone
    me.tick()
    gate.seen(events[3].seq)
    assert gate.acting(events[3].seq)  # event 4 is handled by the caller; 1-3 replayed first
    assert handled == [e.seq for e in events[:3]] and resyncs == [1]
    assert gate.acting()  # the same token: no second replay
    assert handled == [e.seq for e in events[:3]] and resyncs == [1]


def test_the_policy_section_is_checked_where_it_is_loaded(tmp_path):
    from warden.archive.policy import ArchiverPolicy
    from warden.errors import WardenError
    from warden.policy import policy_from_mapping
    from warden.signer.policy import SignerPolicy

    signer = policy_from_mapping({"version": 1, "lease": {"enabled": True, "holder": "node-a"}}, SignerPolicy)
    assert signer.lease.enabled and signer.lease.holder_id() == "node-a"
    assert policy_from_mapping({"version": 1}, SignerPolicy).lease.enabled is False
    with pytest.raises(WardenError, match="duration_seconds"):
        policy_from_mapping({"version": 1, "lease": {"duration_seconds": 1}}, SignerPolicy)
    with pytest.raises(WardenError, match="act_margin_seconds"):
        policy_from_mapping(
            {"version": 1, "request_timeout_seconds": 10, "lease": {"enabled": True, "act_margin_seconds": 1}},
            ArchiverPolicy,
        )


# -- after the side effect: a write that outlasted its lease pages (late_write) ----------------------
def test_a_side_effect_that_outlasts_its_lease_pages_late_write_and_one_in_time_does_not(tmp_path):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    clock = {"now": 1000.0}
    metrics = LeaseMetrics(registry, SCOPE)
    keeper = LeaseKeeper(LeaseFile(str(tmp_path), SCOPE), SCOPE, "a", SETTINGS, lambda: clock["now"], metrics)
    keeper.tick()
    confirm = keeper.fence()
    clock["now"] += SETTINGS.act_margin_seconds / 2  # a side effect that took less than the margin
    confirm()
    late = lambda: registry.get_sample_value("warden_signer_lease_alarms_total", {"reason": "late_write"})  # noqa: E731
    assert late() == 0
    confirm = keeper.fence()
    clock["now"] = keeper.view.expires_at  # paused between the check and the end of the write
    confirm()
    assert late() == 1
    keeper.tick()  # renewal refused (the lease ran out): it stands by
    assert keeper.held() is None and registry.get_sample_value("warden_signer_lease_held") == 0


def test_an_archiver_put_that_outlasts_the_lease_pages_late_write(tmp_path):
    from dataclasses import replace

    from support import FakeStore

    from sidecars.archiver.sidecar import ArchiverSidecar
    from sidecars.runner import Runner
    from sidecars.runtime import SidecarContext
    from tests.warden.archive.archiver_helpers import CONFIG_DIGEST, metric, snapshot_data
    from warden.archive.policy import ArchiverPolicy, BackoffPolicy
    from warden.archive.signing import RecordSigner
    from warden.journal import EventWriter
    from warden.signing.keys import generate_keypair, load_private_key

    now = {"t": 1_800_000_000.0}
    lease = replace(SETTINGS, holder="node-a", act_margin_seconds=3.0)

    class StallingStore(FakeStore):
        """A real in-memory store whose put of step 2 stalls past the lease (an NFS or network stall)."""

        def _put_if_absent(self, key, body, retention):
            if key.endswith("2.json"):
                now["t"] += lease.duration_seconds
            return super()._put_if_absent(key, body, retention)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = ArchiverPolicy(
        store="fake://store", request_timeout_seconds=2.0, check_interval_seconds=0.1,
        backoff=BackoffPolicy(0.05, 0.2), lease=lease,
    )  # fmt: skip
    ctx = SidecarContext(
        name="archiver", state_dir=str(tmp_path / "a"), run_dir=str(run_dir), policy=policy, clock=lambda: now["t"]
    )
    sidecar = ArchiverSidecar(
        ctx,
        store=StallingStore(),
        signer=RecordSigner(load_private_key(generate_keypair(tmp_path / "keys").private_key)),
    )
    runner = Runner(sidecar, use_watchdog=False)
    try:
        with EventWriter(str(run_dir / "events.jsonl"), "run-1") as journal:
            journal.emit("run.started", {"config_digest": CONFIG_DIGEST, "genesis_nonce": "g" * 32})
            journal.emit("reward.snapshot", snapshot_data(1), step=1)
            runner.drain()
            sidecar.check()
            sidecar.uploader.run_pass()
            assert metric(sidecar, "warden_archiver_lease_alarms_total", reason="late_write") == 0
            journal.emit("reward.snapshot", snapshot_data(2), step=2)
            runner.drain()
            sidecar.uploader.run_pass()
        assert metric(sidecar, "warden_archiver_lease_alarms_total", reason="late_write") == 1
    finally:
        sidecar.close()


@pytest.mark.parametrize(
    ("dir_mode", "file_mode", "trusted"),
    [
        (0o755, 0o644, True),
        (0o1777, 0o644, True),  # sticky: others cannot replace our journal
        (0o775, 0o644, False),  # the storage group can rename its own file into place
        (0o757, 0o644, False),
        (0o1775, 0o644, True),
        (0o755, 0o664, False),  # the journal itself writable by others
    ],
)
def test_the_catch_up_trusts_a_journal_only_where_others_cannot_replace_it(tmp_path, dir_mode, file_mode, trusted):
    from sidecars.runner import journal_trusted

    run = tmp_path / "run"
    run.mkdir()
    journal = run / "events.jsonl"
    journal.write_bytes(b"")
    os.chmod(journal, file_mode)
    os.chmod(run, dir_mode)
    try:
        assert journal_trusted(str(journal)) is trusted
        assert journal_trusted(str(run / "missing.jsonl")), "a missing journal: nothing to replay"
        assert not journal_trusted(str(journal / "events.jsonl")), "an error but ENOENT (ENOTDIR) distrusts"
    finally:
        os.chmod(run, 0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_the_catch_up_distrusts_a_journal_not_owned_by_its_directorys_owner(tmp_path):
    from sidecars.runner import journal_trusted

    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    journal = run / "events.jsonl"
    journal.write_bytes(b"")
    os.chmod(journal, 0o644)
    assert journal_trusted(str(journal))
    os.chown(journal, 4242, 4242)  # someone else's file, moved in while they could write here
    assert not journal_trusted(str(journal))
