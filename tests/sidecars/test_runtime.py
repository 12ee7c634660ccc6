"""The sidecar runtime: real processes, real HTTP, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import (
    free_port,
    http_get,
    need_binary,
    parse_samples,
    run_warden,
    spawn,
    stop_process,
    wait_http,
    warden_cmd,
)

from sidecars.runner import Runner
from sidecars.runtime import Outcome, RetryLater, Sidecar, SidecarContext
from warden import journal as ev
from warden.errors import IncompleteError, ViolationError

COMMON = (
    "warden_sidecar_up",
    "warden_sidecar_events_processed",
    "warden_sidecar_lag_events",
    "warden_sidecar_errors",
    "warden_sidecar_last_success_timestamp_seconds",
)


def start_journal_sidecar(run_dir, port, *extra):
    cmd = warden_cmd(
        "sidecar", "run", "journal", "--run-dir", str(run_dir), "--port", str(port), "--poll-interval", "0.2", *extra
    )
    proc = spawn(cmd, stderr=subprocess.PIPE)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
    return proc


def test_metrics_parse_and_carry_common_families(run_dir, journal):
    for i in range(3):
        journal.emit(ev.STEP_COMPLETED, {"reward": 0.1}, step=i)
    port = free_port()
    proc = start_journal_sidecar(run_dir, port)
    try:
        deadline = time.monotonic() + 10
        while True:
            body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
            samples = parse_samples(body)
            if samples.get(("warden_sidecar_events_processed_total", (("sidecar", "journal"),))) == 3:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
        names = {fam.name for fam in text_string_to_metric_families(body)}  # families, even without samples
        for family in COMMON:
            assert family in names
        assert samples[("warden_sidecar_up", (("sidecar", "journal"),))] == 1
        assert samples[("warden_journal_events_total", (("type", "step.completed"),))] == 3
        assert samples[("warden_sidecar_last_success_timestamp_seconds", (("sidecar", "journal"),))] > 1e9
        # New events are picked up while running (watchdog or polling), and lag returns to 0.
        journal.emit(ev.RUN_FINISHED, {"status": "ok"})
        deadline = time.monotonic() + 5
        while 'warden_journal_events_total{type="run.finished"} 1.0' not in body:
            assert time.monotonic() < deadline
            time.sleep(0.1)
            body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        assert 'warden_sidecar_lag_events{sidecar="journal"} 0.0' in body
        status, text = http_get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and text.startswith("ok")
    finally:
        stop_process(proc)


def test_promtool_accepts_the_metrics(run_dir, journal, tmp_path):
    promtool = need_binary("promtool")
    journal.emit(ev.RUN_STARTED, {})
    port = free_port()
    proc = start_journal_sidecar(run_dir, port)
    try:
        body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    finally:
        stop_process(proc)
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sigterm_exits_0_within_2_seconds(run_dir, journal):
    journal.emit(ev.RUN_STARTED, {})
    proc = start_journal_sidecar(run_dir, free_port())
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(5)
    assert code == 0
    assert time.monotonic() - start < 2.0
    logs = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
    assert any(entry["msg"] == "sidecar stopped" for entry in logs)
    assert all({"time", "level", "msg"} <= set(entry) for entry in logs)


def test_once_exit_codes(run_dir, journal, tmp_path):
    journal.emit(ev.RUN_STARTED, {})
    done = run_warden("sidecar", "run", "journal", "--run-dir", str(run_dir), "--once")
    assert done.returncode == 0, done.stderr
    assert (run_dir / "state" / "journal" / "cursor.json").exists()
    # A cursor beyond the end of the journal: the pass cannot complete -> 3.
    (run_dir / "state" / "journal" / "cursor.json").write_text('{"offset": 999999, "seq": 99}')
    broken = run_warden("sidecar", "run", "journal", "--run-dir", str(run_dir), "--once")
    assert broken.returncode == 3
    assert "Traceback" not in broken.stderr and "truncated or replaced" in broken.stderr
    # A bad policy -> 2, naming file and key.
    bad = tmp_path / "journal.yaml"
    bad.write_text("version: 1\nstale_after_secs: 3\n")
    usage = run_warden("sidecar", "run", "journal", "--run-dir", str(run_dir), "--once", "--policy", str(bad))
    assert usage.returncode == 2
    assert f"{bad}: stale_after_secs: unknown key" in usage.stderr and "Traceback" not in usage.stderr


class ScriptedSidecar(Sidecar):
    """A fake sidecar whose outcomes the test scripts; implements the real interface."""

    name = "scripted"
    description = "test double"
    default_port = 0
    handles = frozenset({ev.STEP_COMPLETED})

    def __init__(self, ctx, outcomes):
        super().__init__(ctx)
        self.outcomes = list(outcomes)
        self.seen = []

    def handle(self, event):
        self.seen.append(event.seq)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def run_scripted(run_dir, outcomes):
    ctx = SidecarContext(
        name="scripted", state_dir=str(run_dir / "state"), run_dir=str(run_dir), registry=CollectorRegistry()
    )
    sidecar = ScriptedSidecar(ctx, outcomes)
    runner = Runner(sidecar)
    return runner, sidecar, runner.run_once()


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([Outcome.OK, Outcome.OK], Outcome.OK),
        ([Outcome.OK, Outcome.VIOLATION], Outcome.VIOLATION),
        ([ViolationError("tampered"), Outcome.OK], Outcome.VIOLATION),
        ([IncompleteError("store down"), Outcome.VIOLATION], Outcome.INCOMPLETE),
        ([RuntimeError("bug"), Outcome.OK], Outcome.INCOMPLETE),
    ],
)
def test_runner_once_reports_the_worst_outcome(run_dir, journal, outcomes, expected):
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    journal.emit(ev.RUN_FINISHED, {})
    journal.emit(ev.STEP_COMPLETED, {}, step=2)
    _runner, sidecar, result = run_scripted(run_dir, outcomes)
    assert result == expected
    assert sidecar.seen == [1, 3]  # run.finished is not handled by this sidecar


def test_retry_later_keeps_the_cursor_before_the_event(run_dir, journal):
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    journal.emit(ev.STEP_COMPLETED, {}, step=2)
    runner, _sidecar, result = run_scripted(run_dir, [Outcome.OK, RetryLater("s3 down")])
    assert result == Outcome.INCOMPLETE
    errors = runner.ctx.registry.get_sample_value(
        "warden_sidecar_errors_total", {"sidecar": "scripted", "kind": "retry_later"}
    )
    assert errors == 1
    # The next pass starts at event 2 again.
    _, again, result = run_scripted(run_dir, [Outcome.OK])
    assert again.seen == [2] and result == Outcome.OK


@pytest.mark.parametrize(
    ("file_mode", "dir_mode"),
    [(0o664, 0o755), (0o646, 0o755), (0o644, 0o777)],
    ids=["group-writable journal", "world-writable journal", "world-writable run dir"],
)
def test_a_journal_others_can_write_is_never_acted_on(run_dir, journal, file_mode, dir_mode):
    """Storage writer: with write access to the journal they could announce their own checkpoint."""
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    os.chmod(run_dir / "events.jsonl", file_mode)
    os.chmod(run_dir, dir_mode)
    try:
        runner, sidecar, result = run_scripted(run_dir, [Outcome.OK])
        again = runner.run_once()
    finally:
        os.chmod(run_dir, 0o755)
    assert result == Outcome.VIOLATION and again == Outcome.VIOLATION
    assert sidecar.seen == []
    counted = runner.ctx.registry.get_sample_value(
        "warden_sidecar_errors_total", {"sidecar": "scripted", "kind": "journal_untrusted"}
    )
    assert counted == 1  # counted when the exposure appears, not on every pass


def test_a_sticky_shared_directory_and_a_private_journal_are_trusted(run_dir, journal):
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    os.chmod(run_dir, 0o1777)
    try:
        _runner, sidecar, result = run_scripted(run_dir, [Outcome.OK])
    finally:
        os.chmod(run_dir, 0o755)
    assert result == Outcome.OK and sidecar.seen == [1]


def _journal_index(run_dir):
    seqs = []
    path = run_dir / "state" / "journal" / "index.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                seqs.append(json.loads(line)["seq"])
    return seqs


@pytest.mark.slow
def test_sigkill_at_random_points_gives_exactly_once_effects(run_dir, journal):
    rng = random.Random(1234)
    total = 0
    trials = 20
    killed_mid_backlog = 0
    for _trial in range(trials):
        for _ in range(40):
            total += 1
            journal.emit(ev.STEP_COMPLETED, {"i": total}, step=total)
        proc = spawn(
            warden_cmd("sidecar", "run", "journal", "--run-dir", str(run_dir), "--once"), stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.05, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if 0 < len(_journal_index(run_dir)) < total:
            killed_mid_backlog += 1
    assert killed_mid_backlog >= 3, "the kills must land while a backlog is being processed"
    final = run_warden("sidecar", "run", "journal", "--run-dir", str(run_dir), "--once")
    assert final.returncode == 0, final.stderr
    seqs = _journal_index(run_dir)
    assert sorted(seqs) == list(range(1, total + 1)), "every event exactly once in the index"
    cursor = json.loads((run_dir / "state" / "journal" / "cursor.json").read_text())
    assert cursor["seq"] == total and cursor["offset"] == os.path.getsize(run_dir / "events.jsonl")


def test_journal_problems_are_counted_by_their_kind_not_their_wording(run_dir, journal):
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    with open(run_dir / "events.jsonl", "ab") as fh:
        fh.write(b"{not json\n")
        fh.write(b'{"v": 1, "seq": 9, "run_id": "test-run", "type": "step.completed", "time": "t", "data": {}}\n')
    runner, _sidecar, _ = run_scripted(run_dir, [Outcome.OK, Outcome.OK])
    for kind in ("journal_corrupt_line", "journal_gap"):
        value = runner.ctx.registry.get_sample_value(
            "warden_sidecar_errors_total", {"sidecar": "scripted", "kind": kind}
        )
        assert value == 1, kind
