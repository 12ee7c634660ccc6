"""Fault injection shared by the paths tests and the end-to-end drills.

``FaultFS`` runs ``sidecars/paths`` tests' FUSE filesystem (paths_faultfs.py), whose faults
(ESTALE, EIO, ENOTCONN, EROFS, ENOSPC, slow, an unkillable hang) are switched at run time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support import IN_CI

FAULTFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sidecars", "paths", "paths_faultfs.py")


def need(condition: bool, message: str) -> None:
    """Skips locally when ``condition`` is false, fails under CI=true (docs/design.md section 10)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is in our mount table, read as text (never stats the mount)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return any(line.split(" ")[4] == mountpoint for line in fh)


class FaultFS:
    """A running paths_faultfs.py; ``mode()`` switches its faults through the control file."""

    def __init__(self, base: str) -> None:
        self.mountpoint = os.path.join(base, "mnt")
        self.control = os.path.join(base, "control.json")
        self.data = os.path.join(self.mountpoint, "data")
        os.makedirs(self.mountpoint)
        self.mode("ok")
        self.log = open(os.path.join(base, "faultfs.log"), "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, FAULTFS, self.mountpoint, self.control], stderr=self.log)
        deadline = time.monotonic() + 10
        while not mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(self.log.name, encoding="utf-8", errors="replace") as fh:
                    raise AssertionError(f"faultfs did not mount: {fh.read()[-2000:]}")
            time.sleep(0.02)

    def mode(self, mode: str, **extra: object) -> None:
        tmp = self.control + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"mode": mode, **extra}, fh)
        os.replace(tmp, self.control)

    def kill_daemon(self) -> None:
        """SIGKILL the daemon: the mount stays but every request fails with ENOTCONN."""
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Releases any hang, unmounts lazily and stops the daemon; never leaves a hung mount."""
        self.mode("ok")
        time.sleep(0.1)
        if mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True, timeout=10)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if mounted(self.mountpoint):
            subprocess.run(["umount", "-l", self.mountpoint], capture_output=True, timeout=10)
        self.log.close()
