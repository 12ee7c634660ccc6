"""The scheduler and preflight, in process, with real probe children and a FIFO as a killable hang."""

from __future__ import annotations

import os
import time

import pytest

from warden.errors import EXIT_VIOLATION
from warden.paths import PathsUnhealthy, preflight, require_healthy
from warden.paths.policy import PathSpec
from warden.paths.scheduler import PathWatcher, states_outcome


@pytest.fixture
def fifo_dir(tmp_path):
    d = tmp_path / "fifo"
    d.mkdir()
    os.mkfifo(d / "small")
    return d


def test_fifo_hang_is_stuck_within_the_deadline_and_recovers(fifo_dir):
    spec = PathSpec(name="data", path=str(fifo_dir), read_file="small", interval_seconds=0.2, deadline_seconds=0.5)
    verdicts = []
    watcher = PathWatcher([spec], on_verdict=lambda st: verdicts.append((time.monotonic(), st.reason)))
    t0 = time.monotonic()
    live_max = 0
    try:
        while time.monotonic() - t0 < 2.5:
            watcher.tick()
            live_max = max(live_max, watcher.live_probes()["data"])
            time.sleep(0.02)
        st = watcher.states["data"]
        assert st.stuck and st.reason == "stuck" and not st.healthy
        assert "no answer within the 0.5s deadline while reading a small file" in st.message
        first_stuck = next(t for t, reason in verdicts if reason == "stuck")
        assert first_stuck - t0 < 0.5 + 0.3
        assert live_max == 1, "never more than one probe process per path"
        # Repair: a regular file replaces the FIFO; the next probe succeeds and clears stuck.
        os.unlink(fifo_dir / "small")
        (fifo_dir / "small").write_text("ok\n")
        fixed = time.monotonic()
        while not watcher.states["data"].healthy:
            assert time.monotonic() - fixed < 0.5 + 0.2 + 1.0, watcher.states["data"].message
            watcher.tick()
            time.sleep(0.02)
        assert not watcher.states["data"].stuck and watcher.states["data"].last_success is not None
    finally:
        watcher.close()


def test_run_round_does_not_wait_for_a_hung_probe(fifo_dir, tmp_path):
    specs = [
        PathSpec(name="hung", path=str(fifo_dir), read_file="small", deadline_seconds=0.5),
        PathSpec(name="fine", path=str(tmp_path), writable=True, min_free_bytes="1MiB"),
    ]
    watcher = PathWatcher(specs)
    try:
        t0 = time.monotonic()
        states = watcher.run_round()
        took = time.monotonic() - t0
        assert took < 0.5 + 0.4
        assert states["hung"].stuck and states["fine"].healthy
        assert states["fine"].mount is not None and states["fine"].free_bytes > 0
        assert states_outcome(states.values()) == 1
        # The FIFO hang is killable: the abandoned probe dies, a new one hangs again.
        again = watcher.run_round()
        assert again["hung"].stuck and watcher.live_probes()["hung"] <= 1
    finally:
        watcher.close()


def test_a_probe_that_cannot_run_is_incomplete(tmp_path):
    spec = PathSpec(name="data", path=str(tmp_path))
    missing_python = PathWatcher([spec], python=str(tmp_path / "no-python")).run_round()["data"]
    assert missing_python.incomplete and "could not start a probe process" in missing_python.detail
    crashed = PathWatcher([spec], python="/bin/false").run_round()["data"]
    assert crashed.incomplete and "probe process exited with 1" in crashed.detail
    assert states_outcome([crashed]) == 3


def test_preflight_names_path_reason_and_remedy(tmp_path, fifo_dir):
    good = tmp_path / "ckpt"
    good.mkdir()
    (good / "f").write_text("x")
    t0 = time.monotonic()
    problems = preflight(
        {
            "checkpoint root": (str(good), True),
            "data": (str(tmp_path / "nope"), False),
            "model": (PathSpec(name="model", path=str(fifo_dir), read_file="small", deadline_seconds=0.5)),
        },
        deadline=2.0,
    )
    assert time.monotonic() - t0 < 0.5 + 0.5, "the hung path costs its own deadline, not more"
    by = {p.name: p for p in problems}
    assert set(by) == {"data", "model"}
    assert by["data"].reason == "missing" and by["data"].errno == "ENOENT"
    assert by["data"].message.startswith(f"data {tmp_path / 'nope'}: no such file or directory (ENOENT)")
    assert "create it, mount the volume" in by["data"].message
    assert by["model"].reason == "stuck" and by["model"].stuck
    assert preflight({"checkpoint_root": (str(good), True)}, deadline=2.0, min_free_bytes="1KiB") == []
    with pytest.raises(PathsUnhealthy) as info:
        require_healthy({"checkpoint root": (str(good), True)}, deadline=2.0, min_free_bytes="100%")
    assert info.value.exit_code == EXIT_VIOLATION
    assert str(info.value).startswith(f"checkpoint root {good}: ") and "below min_free_bytes" in str(info.value)
