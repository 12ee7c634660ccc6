"""The signer's checkpoint discovery in process: layouts, listing, completion, stability, the root watcher."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from warden.signer.watch import (
    Candidate,
    RootWatcher,
    StabilityTracker,
    TreeState,
    completion_blocker,
    layout_of,
    list_checkpoints,
    read_tracker,
    remove_stale_signature_temps,
    tree_state,
)


def test_layouts_and_listing_skip_temporaries_links_and_files(tmp_path):
    assert layout_of("step-000000050") == ("warden", 50)
    assert layout_of("checkpoint-500") == ("hf", 500)
    assert layout_of("global_step_7") == ("verl", 7)
    assert layout_of(".tmp-step-000000050") is None and layout_of("tmp-checkpoint-5") is None
    for name in ("checkpoint-2", "checkpoint-10", "tmp-checkpoint-20", "checkpoint-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-30").write_text("a file")
    os.symlink(tmp_path / "checkpoint-2", tmp_path / "checkpoint-40")
    assert [c.step for c in list_checkpoints(str(tmp_path), "hf")] == [2, 10]
    assert list_checkpoints(str(tmp_path / "absent"), "hf") == []


def test_verl_tracker_and_completion(tmp_path):
    assert read_tracker(str(tmp_path)) is None
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    for text, expected in (("", None), ("1", 1), ("12\n", 12), ("1 2", None), ("-3", None), ("abc", None)):
        tracker.write_text(text)
        assert read_tracker(str(tmp_path)) == expected, text
    verl = Candidate(str(tmp_path / "global_step_12"), 12, "verl")
    assert completion_blocker(verl, 12) is None
    assert "not the step named" in (completion_blocker(verl, 10) or "")
    hf = Candidate(str(tmp_path / "checkpoint-3"), 3, "hf")
    os.mkdir(hf.path)
    assert "trainer_state.json" in (completion_blocker(hf, None) or "")
    Path(hf.path, "trainer_state.json").write_text("{}")
    assert completion_blocker(hf, None) is None
    assert completion_blocker(Candidate(str(tmp_path / "step-000000001"), 1, "warden"), None) is None


def test_tree_state_sees_size_and_mtime_changes(tmp_path):
    root = tmp_path / "checkpoint-1"
    assert tree_state(str(root)) is None
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.bin").write_bytes(b"abc")
    first = tree_state(str(root))
    assert first is not None and len(first.fingerprint) == 3  # root, sub, sub/a.bin
    assert abs(first.last_change - time.time()) < 5
    os.utime(root / "sub" / "a.bin", ns=(0, 12345))
    touched = tree_state(str(root))
    assert touched is not None and touched.fingerprint != first.fingerprint
    extra = tmp_path / "tracker.txt"
    extra.write_text("1")
    with_extra = tree_state(str(root), [str(extra)])
    assert with_extra is not None and any(entry[0] == str(extra) for entry in with_extra.fingerprint)


def test_stability_needs_a_quiet_fingerprint_or_old_mtimes():
    tracker = StabilityTracker(10.0)
    fresh = TreeState((("a", 1, 1),), last_change=1000.0)
    assert tracker.remaining("p", fresh, 1000.0) == 10.0
    assert tracker.remaining("p", fresh, 1004.0) == 6.0
    changed = TreeState((("a", 2, 2),), last_change=1005.0)
    assert tracker.remaining("p", changed, 1006.0) == 9.0  # a change restarts the quiet period
    assert tracker.remaining("p", changed, 1016.0) <= 0
    old = TreeState((("b", 1, 1),), last_change=500.0)
    assert tracker.remaining("q", old, 1000.0) <= 0  # first seen, but untouched for long (a --once pass)
    tracker.forget(["q"])
    assert tracker.remaining("p", changed, 1017.0) == 10.0 - 12.0  # forgotten: judged by mtime only


def test_stale_signature_temporaries_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    left = tmp_path / f".tmp-step-000000002.sig.{dead_pid}.140"
    mine = tmp_path / f".tmp-step-000000004.sig.{os.getpid()}.140"
    alive_fresh = tmp_path / f".tmp-step-000000006.sig.{os.getppid()}.140"
    other = tmp_path / ".tmp-step-000000008"
    current = tmp_path / ".tmp-step-000000010.sig.0123456789abcdef"  # warden.safeio.temp_name's form
    for path in (left, mine, alive_fresh, current):
        path.write_text("{")
        os.utime(path, (time.time() - 5, time.time() - 5))
    other.mkdir()
    removed = remove_stale_signature_temps(str(tmp_path))
    assert removed == [str(left)]
    assert mine.exists() and alive_fresh.exists() and other.exists() and current.exists()
    later = remove_stale_signature_temps(str(tmp_path), now=time.time() + 3600)
    assert later == sorted([str(alive_fresh), str(current)])


def test_root_watcher_marks_changes_but_not_signature_writes(tmp_path):
    watcher = RootWatcher([str(tmp_path / "later"), str(tmp_path)])
    try:
        assert watcher.refresh() is True
        (tmp_path / "checkpoint-1.sig").write_text("{}")
        time.sleep(0.3)
        assert watcher.take_dirty() == set()
        (tmp_path / "checkpoint-1").mkdir()
        deadline = time.monotonic() + 5
        while str(tmp_path) not in watcher.take_dirty():
            assert time.monotonic() < deadline, "no inotify event seen"
            time.sleep(0.02)
        (tmp_path / "later").mkdir()
        assert watcher.refresh() is True
    finally:
        watcher.close()
