"""The event journal: writer, reader, cursor, crash behaviour (real processes)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest

from warden import journal as ev
from warden.journal import Cursor, CursorStore, Event, EventTooLarge, EventWriter, JournalReader


def read_all(path, **kwargs):
    reader = JournalReader(str(path), Cursor(), **kwargs)
    return [e for e, _ in reader.read_available()], reader


def test_round_trip_of_every_type(run_dir, journal):
    sent = {}
    for i, etype in enumerate(sorted(ev.EVENT_TYPES)):
        data = {"i": i, "text": "héllo ✓", "nested": {"x": [1.5, None]}}
        sent[etype] = journal.emit(etype, data, step=i)
    got, reader = read_all(run_dir / "events.jsonl")
    assert [e.type for e in got] == sorted(ev.EVENT_TYPES)
    for event in got:
        assert event == sent[event.type]
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    assert reader.stats.corrupt == reader.stats.gaps == 0


def test_line_format_matches_design(run_dir, journal):
    journal.emit(ev.STEP_COMPLETED, {"reward_mean": 0.5}, step=17)
    line = (run_dir / "events.jsonl").read_bytes()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert set(obj) == {"v", "seq", "run_id", "type", "time", "step", "data"}
    assert obj["v"] == 1 and obj["seq"] == 1 and obj["step"] == 17
    assert obj["time"].endswith("Z") and len(obj["time"]) == len("2026-11-30T03:12:45.123456Z")


def _append_many(path, tag, count, seed):
    rng = random.Random(seed)
    writer = EventWriter(path, f"run-{tag}")
    for i in range(count):
        # Sizes straddle the 4 KiB page and pipe-buffer boundaries.
        writer.emit(ev.STEP_COMPLETED, {"tag": tag, "i": i, "pad": "x" * rng.randint(0, 12000)}, step=i)
    writer.close()


def test_two_processes_appending_never_interleave(run_dir):
    path = str(run_dir / "events.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, tag, 400, n)) for n, tag in enumerate("ab")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    assert lines[-1] == b""
    # Any interleaving would fail to parse. An empty line is allowed: a writer opening while
    # the other appends may seal what looked like a torn tail with a newline.
    decoded = [json.loads(line) for line in lines[:-1] if line]
    for tag in "ab":
        mine = [d["data"]["i"] for d in decoded if d["data"]["tag"] == tag]
        assert mine == list(range(400))


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys
    from warden.journal import EventWriter
    w = EventWriter(sys.argv[1], "crashy")
    i = 0
    while True:
        w.emit("step.completed", {"i": i, "pad": "y" * (i % 5000)}, step=i)
        i += 1
    """
)


def test_kill_9_writer_then_reader_sees_only_complete_lines_and_writer_resumes(run_dir):
    path = str(run_dir / "events.jsonl")
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, path], cwd=os.getcwd())
    deadline = time.monotonic() + 20
    while (not os.path.exists(path) or os.path.getsize(path) < 200_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Simulate a torn tail as a power loss would leave it.
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"seq":999999,"run_id":"crashy","type":"step.comp')
    got, reader = read_all(path)
    assert len(got) > 10
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    assert [e.data["i"] for e in got] == list(range(len(got)))
    assert reader.stats.corrupt == 0
    # The restarted writer continues after the last complete line; the torn tail is sealed
    # off as one corrupt line and never merges with the new one.
    writer = EventWriter(path, "crashy")
    assert writer.torn_bytes_sealed > 0
    writer.emit(ev.RUN_RESUMED, {"from_step": len(got)})
    writer.close()
    again, reader = read_all(path)
    assert [e.seq for e in again[:-1]] == [e.seq for e in got]
    assert again[-1].type == ev.RUN_RESUMED and again[-1].seq == len(got) + 1
    assert reader.stats.corrupt == 1 and reader.stats.gaps == 0


def test_torn_last_line_waits_for_newline(run_dir, journal):
    path = run_dir / "events.jsonl"
    journal.emit(ev.RUN_STARTED, {})
    full = ev.encode_line(Event(seq=2, run_id="test-run", type=ev.STEP_COMPLETED, time="2026-11-30T00:00:00.000000Z"))
    with open(path, "ab") as fh:
        fh.write(full[:20])
    reader = JournalReader(str(path))
    first = list(reader.read_available())
    assert [e.seq for e, _ in first] == [1]
    assert reader.cursor.offset == len(ev.encode_line(first[0][0]))
    assert list(reader.read_available()) == []  # still torn: nothing, no error
    with open(path, "ab") as fh:
        fh.write(full[20:])
    assert [e.seq for e, _ in reader.read_available()] == [2]
    assert reader.stats.corrupt == 0


def test_corrupt_middle_line_is_counted_and_skipped(run_dir, journal):
    path = run_dir / "events.jsonl"
    journal.emit(ev.RUN_STARTED, {})
    with open(path, "ab") as fh:
        fh.write(b"this is not json\n")
        fh.write(b'{"v":1,"seq":2}\n')  # valid JSON, not an event
    journal._seq = 1  # the writer does not know about the junk
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    problems = []
    reader = JournalReader(str(path), on_problem=problems.append)
    got = [e for e, _ in reader.read_available()]
    assert [e.seq for e in got] == [1, 2]
    assert reader.stats.corrupt == 2
    assert any("corrupt line at byte" in p for p in problems)


def test_gaps_are_detected(run_dir, journal):
    path = run_dir / "events.jsonl"
    journal.emit(ev.RUN_STARTED, {})
    journal._seq = 5  # lines 2..5 lost
    journal.emit(ev.STEP_COMPLETED, {}, step=1)
    problems = []
    got, reader = read_all(path, on_problem=problems.append)
    assert [e.seq for e in got] == [1, 6]
    assert reader.stats.gaps == 1 and reader.stats.missing_seqs == 4
    assert "expected 2, found 6" in problems[0]


def test_oversized_line_refused_without_holding_it(run_dir, journal):
    path = run_dir / "events.jsonl"
    journal.emit(ev.RUN_STARTED, {})
    huge = {"v": 1, "seq": 2, "run_id": "r", "type": ev.STEP_COMPLETED, "time": "t", "data": {"x": "z" * (8 << 20)}}
    with open(path, "ab") as fh:
        fh.write(json.dumps(huge).encode() + b"\n")
    journal._seq = 2
    journal.emit(ev.STEP_COMPLETED, {}, step=3)
    tracemalloc.start()
    got, reader = read_all(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [e.seq for e in got] == [1, 3]
    assert reader.stats.oversized == 1
    assert peak < 4 << 20, f"reader held {peak} bytes for an 8 MiB line"


def test_emit_refuses_an_oversized_event(journal):
    with pytest.raises(EventTooLarge, match=r"step\.completed event at step 3"):
        journal.emit(ev.STEP_COMPLETED, {"x": "a" * (ev.MAX_LINE_BYTES + 1)}, step=3)
    assert journal.last_seq == 0


def test_unknown_types_and_fields_are_ignored(run_dir, journal):
    path = run_dir / "events.jsonl"
    journal.emit("future.thing", {"a": 1})
    with open(path, "ab") as fh:
        line = {"v": 1, "seq": 2, "run_id": "r", "type": ev.OOM, "time": "t", "step": 4, "data": {}, "extra": [1]}
        fh.write(json.dumps(line).encode() + b"\n")
    got, reader = read_all(path)
    assert [(e.seq, e.type) for e in got] == [(2, ev.OOM)]
    assert reader.stats.unknown_type == 1 and reader.cursor.seq == 2


def test_reader_resumes_from_cursor(run_dir, journal):
    for i in range(5):
        journal.emit(ev.STEP_COMPLETED, {}, step=i)
    path = str(run_dir / "events.jsonl")
    pairs = list(JournalReader(path).read_available())
    resumed = JournalReader(path, pairs[2][1])
    assert [e.seq for e, _ in resumed.read_available()] == [4, 5]


def test_truncated_journal_below_cursor_is_reported(run_dir, journal):
    journal.emit(ev.RUN_STARTED, {})
    reader = JournalReader(str(run_dir / "events.jsonl"), Cursor(offset=10_000, seq=50))
    with pytest.raises(ev.JournalTruncated, match="remove the cursor file"):
        list(reader.read_available())


def test_cursor_store_is_atomic_and_round_trips(tmp_path):
    store = CursorStore(str(tmp_path / "s" / "cursor.json"))
    assert store.load() == Cursor()
    store.save(Cursor(offset=123, seq=7))
    assert store.load() == Cursor(offset=123, seq=7)
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["cursor.json"]  # no temp files left
    (tmp_path / "s" / "cursor.json").write_text("{bad")
    with pytest.raises(ev.JournalError, match="delete it to start over"):
        store.load()


def test_writer_reopen_continues_seq(run_dir):
    path = str(run_dir / "events.jsonl")
    with EventWriter(path, "r") as w:
        w.emit(ev.RUN_STARTED, {})
        w.emit(ev.STEP_COMPLETED, {}, step=1)
    with EventWriter(path, "r") as w:
        assert w.last_seq == 2
        assert w.emit(ev.RUN_RESUMED, {}).seq == 3
    assert ev.read_last_seq(path) == 3


def test_follower_wakes_on_append(run_dir, journal):
    journal.emit(ev.RUN_STARTED, {})
    follower = ev.JournalFollower(str(run_dir / "events.jsonl"), poll_seconds=5.0)
    try:
        if not follower.using_watchdog:
            pytest.skip("watchdog could not start an inotify observer here")
        time.sleep(0.2)
        start = time.monotonic()
        journal.emit(ev.STEP_COMPLETED, {}, step=1)
        follower.wait()
        assert time.monotonic() - start < 2.0
    finally:
        follower.close()


def test_follower_is_not_woken_by_reads(run_dir, journal):
    """Readers open and close the journal; that must not count as a change (busy loop)."""
    journal.emit(ev.RUN_STARTED, {})
    path = str(run_dir / "events.jsonl")
    follower = ev.JournalFollower(path, poll_seconds=0.5)
    try:
        if not follower.using_watchdog:
            pytest.skip("watchdog could not start an inotify observer here")
        wakes = 0
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            start = time.monotonic()
            list(JournalReader(path).read_available())  # what a sidecar does after each wake
            ev.read_last_seq(path)
            follower.wait()
            wakes += time.monotonic() - start < 0.4
        assert wakes <= 1, f"{wakes} early wake-ups without any write"
    finally:
        follower.close()


def test_reopening_while_another_process_appends_never_deletes_its_lines(run_dir):
    """Recovery seals, never truncates: a writer opened mid-append must not cut other lines."""
    path = str(run_dir / "events.jsonl")
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_append_many, args=(path, "a", 3000, 7))
    proc.start()
    opened = 0
    while proc.is_alive() and opened < 200:
        EventWriter(path, "other").close()  # recovery runs against a moving tail
        opened += 1
    proc.join(60)
    assert proc.exitcode == 0 and opened > 10
    events = [e for e, _ in JournalReader(path).read_available() if e.data.get("tag") == "a"]
    assert [e.data["i"] for e in events] == list(range(3000))
