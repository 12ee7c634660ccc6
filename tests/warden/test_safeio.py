"""warden.safeio: links, FIFOs, special files and oversized files are refused, never followed or waited on."""

from __future__ import annotations

import os
import threading

import pytest

from warden import safeio
from warden.safeio import UnsafeFile, open_dir_nofollow, read_regular


def test_a_regular_file_within_the_cap_is_read(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert read_regular(str(tmp_path / "f"), 3) == b"abc"


@pytest.mark.parametrize("kind", ["link", "fifo", "dir", "big"])
def test_unsafe_entries_are_refused_with_a_reason(tmp_path, kind):
    target, path = tmp_path / "real", tmp_path / "entry"
    target.write_bytes(b"x")
    expected = {"link": "link", "fifo": "not_regular", "dir": "not_regular", "big": "too_large"}[kind]
    if kind == "link":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_bytes(b"y" * 11)
    result: list[BaseException] = []
    worker = threading.Thread(target=lambda: _capture(result, lambda: read_regular(str(path), 10)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the read blocked"
    assert isinstance(result[0], UnsafeFile) and result[0].reason == expected


def _capture(out: list[BaseException], call) -> None:
    try:
        call()
    except BaseException as exc:
        out.append(exc)


def test_a_directory_with_a_linked_component_is_refused(tmp_path):
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    fd = open_dir_nofollow(str(tmp_path / "real" / "inner"))
    os.close(fd)
    with pytest.raises(UnsafeFile) as caught:
        open_dir_nofollow(str(tmp_path / "link" / "inner"))
    assert caught.value.reason == "link"


def test_a_file_that_grows_past_the_cap_while_read_is_refused(tmp_path, monkeypatch):
    # The size check at open passes; the file then grows: the one extra byte read shows it.
    import warden.safeio as safeio

    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    real_open = safeio.open_regular_fd

    def open_then_grow(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        with open(path, "ab") as fh:
            fh.write(b"more")
        return fd

    monkeypatch.setattr(safeio, "open_regular_fd", open_then_grow)
    with pytest.raises(UnsafeFile, match="grew past the 12-byte cap"):
        read_regular(str(path), 12)


@pytest.mark.parametrize("sync_first", [True, False])
def test_an_atomic_write_is_durable_when_it_returns_and_visible_per_its_order(tmp_path, monkeypatch, sync_first):
    """Either order ends with the file and its directory fsynced and no temporary left; with
    ``sync_first`` False the new file is in place before the first fsync (visible while it syncs)."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        return real_fsync(fd)

    def replace(*args, **kwargs):
        calls.append("rename")
        return real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    (tmp_path / "x.sig").write_bytes(b"old")
    safeio.atomic_write_bytes(str(tmp_path / "x.sig"), b"new bytes", sync_first=sync_first)
    assert (tmp_path / "x.sig").read_bytes() == b"new bytes" and os.listdir(tmp_path) == ["x.sig"]
    expected = ["fsync-file", "rename"] if sync_first else ["rename", "fsync-file"]
    assert calls == [*expected, "fsync-dir"]


@pytest.mark.parametrize("sync_first", [True, False])
def test_a_temporary_swapped_before_the_rename_is_never_reported_written(tmp_path, monkeypatch, sync_first):
    real_write_all = safeio.write_all

    def write_all_then_swap(fd, payload):
        real_write_all(fd, payload)
        (tmp,) = [n for n in os.listdir(tmp_path) if n != "x.sig"]
        os.unlink(tmp_path / tmp)
        (tmp_path / tmp).write_bytes(b"planted")  # another inode under the temporary's name

    monkeypatch.setattr(safeio, "write_all", write_all_then_swap)
    with pytest.raises(safeio.UnsafeFile):
        safeio.atomic_write_bytes(str(tmp_path / "x.sig"), b"mine", sync_first=sync_first)
