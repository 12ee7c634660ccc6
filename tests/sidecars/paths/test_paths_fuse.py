"""FUSE fault drills (mfusepy + fuse3): errno faults, slowness, an unkillable hang, a dead daemon.

The hang is held for 12 s rather than the 60 s of a real incident, to keep CI fast: what
it shows (one probe process, stuck metric, fast /metrics) does not change after the first
deadline, so a longer hold would only repeat the same samples.
"""

from __future__ import annotations

import os
import time

import pytest
from support import stop_process

pytestmark = pytest.mark.slow  # real FUSE faults and an unkillable hang: minutes (make test-fast skips)

HANG_HOLD_SECONDS = 12.0


def test_errno_faults_are_classified_and_recover(paths_kit, faultfs, tmp_path):
    policy = paths_kit.policy(
        [
            {
                "name": "data",
                "path": faultfs.data,
                "writable": True,
                "interval_seconds": 0.2,
                "deadline_seconds": 2,
                "max_latency_seconds": 0.25,
            }
        ]
    )
    sidecar = paths_kit.start_sidecar(policy)
    sidecar.wait_for("warden_path_up", 1, 10, path="data")
    info = [k for k in sidecar.scrape() if k[0] == "warden_path_mount_info"]
    assert info and dict(info[0][1])["fstype"] == "fuse" and dict(info[0][1])["mount_point"] == faultfs.mountpoint
    cases = [
        ("estale", {}, "stale_handle"),
        ("eio", {}, "io_error"),
        ("enotconn", {}, "disconnected"),
        ("erofs", {}, "read_only"),
        ("enospc", {}, "full"),
        ("slow", {"slow_seconds": 0.03}, "slow"),
    ]
    for mode, extra, reason in cases:
        faultfs.mode(mode, **extra)
        took = sidecar.wait_for("warden_path_failure", 1, 5, path="data", reason=reason)
        assert took < 0.2 + 1.5, (mode, took)
        assert sidecar.value("warden_path_up", path="data") == 0
        faultfs.mode("ok")
        sidecar.wait_for("warden_path_up", 1, 5, path="data")
    sidecar.assert_scrapes_fast()


def test_unkillable_hang_is_stuck_bounded_and_recovers(paths_kit, faultfs, tmp_path, report_by_name):
    deadline = 1.0
    policy = paths_kit.policy(
        [
            {"name": "data", "path": faultfs.data, "writable": True, "interval_seconds": 0.2, "deadline_seconds": 1},
            {"name": "scratch", "path": str(tmp_path), "writable": True, "interval_seconds": 0.5},
        ]
    )
    sidecar = paths_kit.start_sidecar(policy)
    sidecar.wait_for("warden_path_up", 1, 10, path="data")
    sidecar.wait_for("warden_path_up", 1, 10, path="scratch")

    faultfs.mode("hang")
    t0 = time.monotonic()
    sidecar.wait_for("warden_path_stuck", 1, deadline + 3, path="data")
    detected = time.monotonic() - t0
    assert detected < deadline + 1.0, detected

    # `warden paths check` in another process: reports stuck on time, never waits for its child.
    code, report, took = paths_kit.check(policy)
    assert code == 1 and report_by_name(report)["data"]["stuck"] and took < deadline + 2.5, took
    # A second sidecar whose probe hangs too stops on SIGTERM at once, leaving its D-state child.
    other = paths_kit.start_sidecar(policy)
    other.wait_for("warden_path_stuck", 1, deadline + 3, path="data")
    t_term = time.monotonic()
    assert stop_process(other.proc) == 0 and time.monotonic() - t_term < 2.0

    states, probe_counts, hung = set(), [], set()
    end = t0 + HANG_HOLD_SECONDS
    while time.monotonic() < end:
        samples = sidecar.scrape()
        assert samples[("warden_path_stuck", (("path", "data"),))] == 1
        assert samples[("warden_path_up", (("path", "scratch"),))] == 1
        children = sidecar.children()
        probe_counts.append(len(children))
        states.update(state for _pid, state in children)
        hung.update(pid for pid, state in children if state == "D")
        time.sleep(0.2)
    sidecar.assert_scrapes_fast()
    # At most the hung probe of `data` plus a short-lived probe of `scratch`; the hung one
    # ignores SIGKILL while the filesystem holds its request: state D, the hard-NFS case.
    assert max(probe_counts) <= 2, probe_counts
    assert "D" in states, states
    assert sidecar.value("warden_path_probe_processes", path="data") == 1
    duration = sidecar.value("warden_path_probe_duration_seconds", path="data")
    assert duration is not None and duration > HANG_HOLD_SECONDS - deadline - 1

    faultfs.mode("ok")
    t1 = time.monotonic()
    sidecar.wait_for("warden_path_stuck", 0, deadline + 3, path="data")
    sidecar.wait_for("warden_path_up", 1, 3, path="data")
    assert time.monotonic() - t1 < deadline + 1.0
    reaped_by = time.monotonic() + 2
    while any(os.path.exists(f"/proc/{pid}") for pid in hung):
        assert time.monotonic() < reaped_by, f"hung probes {hung} were not reaped after recovery"
        time.sleep(0.05)


def test_dead_daemon_is_disconnected(paths_kit, faultfs, report_by_name):
    policy = paths_kit.policy([{"name": "data", "path": faultfs.data, "deadline_seconds": 2}])
    code, report, _ = paths_kit.check(policy)
    assert code == 0, report
    faultfs.kill_daemon()
    code, report, _ = paths_kit.check(policy)
    data = report_by_name(report)["data"]
    assert code == 1 and (data["reason"], data["errno"]) == ("disconnected", "ENOTCONN"), data
    assert "fusermount3 -u" in data["message"]
