"""Two archivers of one run in this process (two "nodes", one clock each), with the run lease.

The node that loses the lease while records sit in its spool never puts them (each put is preceded
by a look at the lease file); the node that takes over continues the chain the store holds and
archives what the first left unstored: one object per step, no conflict, no alarm.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from support import FakeStore

from sidecars.archiver.sidecar import ArchiverSidecar
from sidecars.runner import Runner
from sidecars.runtime import SidecarContext
from tests.warden.archive.archiver_helpers import CONFIG_DIGEST, metric, snapshot_data
from warden.archive.policy import ArchiverPolicy, BackoffPolicy
from warden.archive.record import steps_prefix
from warden.archive.signing import RecordSigner, verify_record
from warden.journal import EventWriter
from warden.lease import LeaseSettings
from warden.signing.keys import load_private_key

LEASE = LeaseSettings(
    enabled=True, duration_seconds=10.0, renew_seconds=2.0, max_clock_skew_seconds=1.0, act_margin_seconds=3.0
)


def test_the_node_that_lost_the_lease_puts_nothing_and_the_new_holder_continues_the_chain(tmp_path, keys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal = EventWriter(str(run_dir / "events.jsonl"), "run-1")
    store = FakeStore()
    signer = RecordSigner(load_private_key(keys[0]))
    now = {"t": 1_800_000_000.0}

    def node(name: str) -> ArchiverSidecar:
        policy = ArchiverPolicy(
            store="fake://store",
            request_timeout_seconds=2.0,
            check_interval_seconds=0.1,
            backoff=BackoffPolicy(0.05, 0.2),
            lease=replace(LEASE, holder=name),
        )
        ctx = SidecarContext(
            name="archiver", state_dir=str(tmp_path / name), run_dir=str(run_dir), policy=policy, clock=lambda: now["t"]
        )
        return ArchiverSidecar(ctx, store=store, signer=signer)

    a = node("node-a")
    a.lease.tick()
    b = node("node-b")
    b.lease.tick()
    assert a.lease.held() == 1 and b.lease.held() is None
    runner_a, runner_b = Runner(a, use_watchdog=False), Runner(b, use_watchdog=False)
    try:
        journal.emit("run.started", {"config_digest": CONFIG_DIGEST, "genesis_nonce": "g" * 32})
        for step in (1, 2, 3):
            journal.emit("reward.snapshot", snapshot_data(step), step=step)
        runner_a.drain()
        a.uploader.run_pass()
        runner_b.drain()  # standing by: lets the events pass
        assert len([k for k in store.objects if k.startswith(steps_prefix("run-1"))]) == 3
        assert b.spool.depth() == 0

        for step in (4, 5):
            journal.emit("reward.snapshot", snapshot_data(step), step=step)
        runner_a.drain()
        assert a.spool.depth() == 2  # spooled, not stored: then node A stalls past its lease
        now["t"] += LEASE.duration_seconds + LEASE.max_clock_skew_seconds + 0.5
        b.lease.tick()
        assert b.lease.held() == 2
        assert a.uploader.run_pass().stored == 0  # A no longer holds: nothing put
        runner_b.drain()
        b.check()  # takes over: resync from the store, replay, upload
        b.uploader.run_pass()
        a.lease.tick()
        assert a.lease.held() is None
        assert a.uploader.run_pass().stored == 0

        stored = sorted(k for k in store.objects if k.startswith(steps_prefix("run-1")))
        assert len(stored) == 5
        records = [verify_record(store.objects[k], signer.own_trust, k)[0] for k in stored]
        assert [r.step for r in records] == [1, 2, 3, 4, 5]
        assert [r.prev_step for r in records] == [None, 1, 2, 3, 4]
        for sidecar in (a, b):
            assert metric(sidecar, "warden_archiver_conflicts_total") == 0
            for reason in ("stolen", "token_backwards", "malformed", "tampered"):
                assert metric(sidecar, "warden_archiver_lease_alarms_total", reason=reason) == 0
        assert metric(b, "warden_archiver_lease_takeovers_total") == 1
        assert a.spool.depth() == 2  # A's unstored records stay in its spool, never put
        assert not Path(b.spool.root, ".fenced").exists()  # B had spooled nothing before it took over
    finally:
        journal.close()
        a.close()
        b.close()
