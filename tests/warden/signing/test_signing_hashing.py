"""Hashing layer: correct digests, refusals, progress, and files that vanish or change."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from tests.warden.signing.signing_helpers import CHECKPOINT_FILES, write_tree
from warden.errors import EXIT_INCOMPLETE, EXIT_VIOLATION
from warden.signing.errors import (
    CheckpointChanged,
    CheckpointVanished,
    HashingCancelled,
    UnsafePathError,
)
from warden.signing.hashing import FileEntry, hash_files, hash_tree, scan_tree


def expected_digests(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: hashlib.sha256(content).digest() for name, content in files.items()}


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_digests_match_hashlib_for_every_worker_count(tmp_path: Path, workers: int) -> None:
    root = write_tree(tmp_path / "ckpt", CHECKPOINT_FILES)
    assert hash_tree(root, max_workers=workers) == expected_digests(CHECKPOINT_FILES)


def test_small_chunks_give_the_same_digest(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", CHECKPOINT_FILES)
    scan = scan_tree(root)
    assert hash_files(root, scan.files, chunk_size=4096, max_workers=2) == expected_digests(CHECKPOINT_FILES)


def test_ignored_paths_are_pruned_by_component_not_prefix(tmp_path: Path) -> None:
    files = {".git/HEAD": b"ref", ".gitignore": b"*", ".github": b"x", ".git-keep": b"kept", "w": b"w"}
    root = write_tree(tmp_path / "ckpt", files)
    os.symlink("/etc", root / ".git" / "link-inside-ignored")  # ignored subtrees are not descended
    scan = scan_tree(root, [".git", ".gitignore", "./.github/"])
    assert [f.name for f in scan.files] == [".git-keep", "w"]
    assert scan.refused == ()


def test_progress_reports_every_byte_and_ends_at_total(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", CHECKPOINT_FILES)
    calls: list[tuple[int, int]] = []
    hash_tree(root, max_workers=2, progress=lambda done, total: calls.append((done, total)))
    total = sum(len(c) for c in CHECKPOINT_FILES.values())
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) >= 4  # the 3 MiB file alone reports once per 1 MiB read


def test_symlink_file_is_refused_with_its_path_and_target(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", {"real": b"x"})
    os.symlink("../../outside", root / "weights.bin")
    with pytest.raises(UnsafePathError) as info:
        hash_tree(root)
    assert f"{root}/weights.bin is a symlink (-> ../../outside)" in str(info.value)
    assert info.value.exit_code == EXIT_VIOLATION


def test_symlinked_directory_is_refused_not_skipped(tmp_path: Path) -> None:
    outside = write_tree(tmp_path / "outside", {"secret.bin": b"s"})
    root = write_tree(tmp_path / "ckpt", {"real": b"x"})
    os.symlink(outside, root / "actor")
    with pytest.raises(UnsafePathError, match=r"ckpt/actor is a symlink to a directory \(-> .*outside\)"):
        hash_tree(root)


@pytest.mark.timeout(20)
def test_fifo_and_socket_are_refused_without_blocking(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", {"real": b"x"})
    os.mkfifo(root / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
        with pytest.raises(UnsafePathError) as info:
            hash_tree(root)
    finally:
        sock.close()
    assert "pipe is a FIFO" in str(info.value) and "sock is a socket" in str(info.value)
    assert {reason for _, reason in info.value.paths} == {"a FIFO", "a socket"}


def test_name_that_is_not_utf8_is_refused_printably(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", {"ok": b"x"})
    os.close(os.open(os.fsencode(root) + b"/bad\xff.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    with pytest.raises(UnsafePathError, match=r"bad\\xff\.bin is a name that is not valid UTF-8"):
        hash_tree(root)


def test_checkpoint_path_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = write_tree(tmp_path / "step-000000050", {"w": b"x"})
    os.symlink(real, tmp_path / "latest")
    with pytest.raises(UnsafePathError, match="latest: refused, the checkpoint path is a symlink"):
        hash_tree(tmp_path / "latest")


def test_missing_checkpoint_is_vanished(tmp_path: Path) -> None:
    with pytest.raises(CheckpointVanished, match="does not exist") as info:
        hash_tree(tmp_path / "nope")
    assert info.value.exit_code == EXIT_INCOMPLETE


def _three_files(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "ckpt", {"a": b"A" * (2 << 20), "b": b"B", "c": b"C"})


def test_file_deleted_while_hashing_raises_vanished(tmp_path: Path) -> None:
    root = _three_files(tmp_path)

    def delete_c(done: int, total: int) -> None:
        if (root / "c").exists():
            (root / "c").unlink()

    with pytest.raises(CheckpointVanished, match="c: deleted while the checkpoint was being hashed") as info:
        hash_tree(root, max_workers=1, progress=delete_c)
    assert info.value.path == str(root / "c")


def test_checkpoint_removed_while_hashing_in_parallel_raises_vanished(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ckpt", {f"f{i:03d}": bytes(50_000) for i in range(60)})

    def remove_all(done: int, total: int) -> None:
        shutil.rmtree(root, ignore_errors=True)

    with pytest.raises(CheckpointVanished):
        hash_tree(root, max_workers=4, progress=remove_all)


def test_file_growing_while_hashing_raises_changed(tmp_path: Path) -> None:
    root = _three_files(tmp_path)
    grown: list[bool] = []

    def append(done: int, total: int) -> None:
        if not grown:
            grown.append(True)
            with open(root / "a", "ab") as fh:
                fh.write(b"more")

    with pytest.raises(CheckpointChanged, match="a: changed while hashing"):
        hash_tree(root, max_workers=1, progress=append)


@pytest.mark.parametrize("listed_delta", [-1, +1])
def test_small_file_whose_size_changed_after_listing_raises_changed(tmp_path: Path, listed_delta: int) -> None:
    # A file smaller than the read buffer is read in one call (the fast path): a size that differs
    # from the listed one (grown or truncated after the scan) must still be named, never hashed.
    root = write_tree(tmp_path / "ckpt", {"small.json": b"x" * 1000, "other": b"y"})
    listed = [FileEntry("small.json", 1000 + listed_delta), FileEntry("other", 1)]
    with pytest.raises(CheckpointChanged, match=r"small\.json: changed while hashing"):
        hash_files(root, listed, max_workers=2)


@pytest.mark.parametrize("extra", [b"", b"grown"])
def test_single_read_path_sees_growth_after_the_size_check(tmp_path: Path, extra: bytes) -> None:
    # The fast path's own guard: bytes beyond the size checked at open (appended between the
    # fstat and the read) are seen by the one extra byte it asks for.
    from warden.signing.hashing import _hash_whole_small, _Tracker

    path = tmp_path / "f"
    path.write_bytes(b"z" * 100 + extra)
    tracker = _Tracker(100, 1 << 20, None, None, hashlib.sha256)
    fd = os.open(path, os.O_RDONLY)
    try:
        if extra:
            with pytest.raises(CheckpointChanged, match="read 101 bytes"):
                _hash_whole_small(fd, str(path), 100, tracker)
        else:
            assert _hash_whole_small(fd, str(path), 100, tracker) == hashlib.sha256(b"z" * 100).digest()
    finally:
        os.close(fd)


def test_many_small_files_on_many_threads_match_hashlib(tmp_path: Path) -> None:
    files = {f"meta/{i:04d}/config.json": os.urandom(i * 37 % 5000) for i in range(400)}
    files["big.bin"] = os.urandom(3 << 20)
    root = write_tree(tmp_path / "ckpt", files)
    assert hash_tree(root, max_workers=8) == expected_digests(files)


def test_cancel_event_stops_hashing(tmp_path: Path) -> None:
    root = _three_files(tmp_path)
    cancel = threading.Event()
    with pytest.raises(HashingCancelled):
        hash_tree(root, max_workers=2, progress=lambda d, t: cancel.set(), cancel=cancel)


def test_small_jobs_are_spread_between_large_ones_and_none_is_lost() -> None:
    from warden.signing.hashing import HashJob, spread_small_jobs

    large = [HashJob(FileEntry(f"big{i}", 100 - i), ((0, 100 - i),)) for i in range(3)]
    small = [HashJob(FileEntry(f"s{i}", 5), ((0, 5),)) for i in range(7)]
    spread = spread_small_jobs(large + small, small_bytes=10)
    assert sorted(j.entry.name for j in spread) == sorted(j.entry.name for j in large + small)
    assert [j.entry.name for j in spread if j.size > 10] == ["big0", "big1", "big2"]  # order kept
    assert [j.entry.name for j in spread if j.size <= 10] == [f"s{i}" for i in range(7)]
    positions = [i for i, j in enumerate(spread) if j.size > 10]
    assert positions == [0, 3, 6]  # 7 small jobs: 2, 2, 3 after each large one
    assert spread_small_jobs(small, 10) == small
