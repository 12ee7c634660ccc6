"""warden.safeio: links, FIFOs, special files and oversized files are refused, never followed or waited on."""

from __future__ import annotations

import os
import threading

import pytest

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
