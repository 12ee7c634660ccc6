"""A FUSE filesystem (mfusepy + libfuse3) that fails on demand, for the path watcher's drills.

    python paths_faultfs.py MOUNTPOINT CONTROL_FILE

Layout: ``/`` holds ``data/`` (the watched directory) with ``small.txt``; files created
in ``data/`` live in memory. Every operation on ``/data`` or below first reads
CONTROL_FILE (JSON, re-read on every request) and obeys its ``mode``:

* ``ok``: behave.
* ``estale`` / ``eio`` / ``enotconn``: lookups, listings, opens and reads fail with that errno.
* ``erofs`` / ``enospc``: creating or writing files fails with that errno.
* ``slow``: every request sleeps ``slow_seconds`` first, then behaves.
* ``hang``: every request blocks until the mode changes. The kernel has handed the request
  to us, so the caller sleeps uninterruptibly (D state) and SIGKILL cannot end it: the
  hard-NFS case. Changing the mode (or killing this daemon) releases it.

Attribute and entry caching are off (timeouts 0) so a mode change takes effect at once.
Unmount with ``fusermount3 -u -z MOUNTPOINT``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
import time

import mfusepy

ERRNOS = {"estale": errno.ESTALE, "eio": errno.EIO, "enotconn": errno.ENOTCONN}
WRITE_ERRNOS = {"erofs": errno.EROFS, "enospc": errno.ENOSPC}


class FaultFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, control: str) -> None:
        self.control = control
        self._mutex = threading.Lock()
        self.files: dict[str, bytearray] = {"/data/small.txt": bytearray(b"hello from faultfs\n")}
        self.dirs = {"/", "/data"}
        self.fh = 0

    # -- fault injection -----------------------------------------------------------
    def _mode(self) -> dict[str, object]:
        try:
            with open(self.control, encoding="utf-8") as fh:
                return dict(json.load(fh))
        except (OSError, ValueError):
            return {"mode": "ok"}

    def _gate(self, path: str, writing: bool = False) -> None:
        if not (path == "/data" or path.startswith("/data/")):
            return
        ctl = self._mode()
        mode = ctl.get("mode", "ok")
        while mode == "hang":
            time.sleep(0.05)
            ctl = self._mode()
            mode = ctl.get("mode", "ok")
        if mode == "slow":
            time.sleep(float(str(ctl.get("slow_seconds", 2.0))))
        if mode in ERRNOS:
            raise mfusepy.FuseOSError(ERRNOS[str(mode)])
        if writing and mode in WRITE_ERRNOS:
            raise mfusepy.FuseOSError(WRITE_ERRNOS[str(mode)])

    # -- operations ----------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, object]:
        self._gate(path)
        now = time.time_ns()
        base = {"st_uid": os.getuid(), "st_gid": os.getgid(), "st_atime": now, "st_mtime": now, "st_ctime": now}
        with self._mutex:
            if path in self.dirs:
                return {**base, "st_mode": stat.S_IFDIR | 0o777, "st_nlink": 2}
            if path in self.files:
                return {**base, "st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": len(self.files[path])}
        raise mfusepy.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        self._gate(path)
        prefix = path.rstrip("/") + "/"
        with self._mutex:
            names = [p[len(prefix) :] for p in (*self.dirs, *self.files) if p.startswith(prefix) and p != prefix]
        return [".", "..", *[n for n in names if "/" not in n]]

    def open(self, path: str, flags: int) -> int:
        self._gate(path)
        with self._mutex:
            if path not in self.files:
                raise mfusepy.FuseOSError(errno.ENOENT)
            self.fh += 1
            return self.fh

    def create(self, path: str, mode: int, fi: object = None) -> int:
        self._gate(path, writing=True)
        with self._mutex:
            self.files[path] = bytearray()
            self.fh += 1
            return self.fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._gate(path)
        with self._mutex:
            return bytes(self.files.get(path, b"")[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._gate(path, writing=True)
        with self._mutex:
            buf = self.files.setdefault(path, bytearray())
            buf[offset : offset + len(data)] = data
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._gate(path, writing=True)
        with self._mutex:
            del self.files.setdefault(path, bytearray())[length:]
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._gate(path, writing=True)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        return 0

    def unlink(self, path: str) -> int:
        self._gate(path)
        with self._mutex:
            self.files.pop(path, None)
        return 0

    def utimens(self, path: str, times: object = None) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self._gate(path)
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": 262144,
            "f_bfree": 131072,
            "f_bavail": 131072,
            "f_files": 100000,
            "f_ffree": 50000,
            "f_favail": 50000,
            "f_namemax": 255,
        }


def main() -> None:
    mountpoint, control = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    mfusepy.FUSE(
        FaultFS(control),
        mountpoint,
        foreground=True,
        fsname="warden-faultfs",
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
        direct_io=True,
    )


if __name__ == "__main__":
    main()
