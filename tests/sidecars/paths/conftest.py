"""Fixtures of the path watcher's tests: policies, a running sidecar, the FUSE fault filesystem.

Helpers are reached through the ``paths_kit`` fixture (tests here do not import each other).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import IN_CI, ROOT, free_port, http_get, need_binary, spawn, stop_process, wait_http, warden_cmd

FAULTFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paths_faultfs.py")


def need(condition: bool, message: str) -> None:
    """Skips locally when ``condition`` is false, fails under CI=true (DESIGN section 10)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is in our mount table, read as text (never stats the mount)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return any(line.split(" ")[4] == mountpoint for line in fh)


@dataclass
class Sidecar:
    proc: subprocess.Popen[bytes]
    port: int
    latencies: list[float] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Samples of one /metrics scrape; records how long the scrape took."""
        t0 = time.monotonic()
        status, body = http_get(self.url, timeout=5)
        self.latencies.append(time.monotonic() - t0)
        assert status == 200, body
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body)
            for s in fam.samples
        }

    def assert_scrapes_fast(self, limit: float = 0.1) -> None:
        """95% of scrapes under ``limit`` (100 ms) and none near a probe deadline (0.5 s).

        The tail allows for a loaded 2-core machine; a scrape that waited on a hung probe
        would take seconds, not a scheduling hiccup's tens of milliseconds.
        """
        ordered = sorted(self.latencies)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        assert p95 < limit and ordered[-1] < 0.5, f"p95 {p95:.3f}s, max {ordered[-1]:.3f}s over {len(ordered)}"

    def value(self, name: str, **labels: str) -> float | None:
        return self.scrape().get((name, tuple(sorted(labels.items()))))

    def wait_for(self, name: str, expected: float, timeout: float, **labels: str) -> float:
        """Polls until metric == expected; returns the seconds it took."""
        t0 = time.monotonic()
        while True:
            got = self.value(name, **labels)
            if got == expected:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{name}{labels} is {got}, not {expected}, after {timeout}s")
            time.sleep(0.05)

    def children(self) -> list[tuple[int, str]]:
        """(pid, state letter) of the sidecar's child processes, from /proc/*/stat only."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:
                out.append((int(entry), fields[0]))
        return out


class PathsKit:
    """Builds policies and runs the sidecar or ``warden paths check`` as real processes."""

    def __init__(self, tmp_path: str) -> None:
        self.tmp = tmp_path
        self._procs: list[subprocess.Popen[bytes]] = []

    def policy(self, paths: list[dict[str, object]], name: str = "paths.yaml", **top: object) -> str:
        doc = {"version": 1, **top, "paths": paths}
        where = os.path.join(self.tmp, name)
        with open(where, "w", encoding="utf-8") as fh:
            yaml.safe_dump(doc, fh)
        return where

    def start_sidecar(self, policy: str) -> Sidecar:
        port = free_port()
        cmd = warden_cmd(
            "sidecar",
            "run",
            "paths",
            "--policy",
            policy,
            "--port",
            str(port),
            "--poll-interval",
            "0.1",
            "--state-dir",
            os.path.join(self.tmp, "state"),
        )
        proc = spawn(cmd, stderr=subprocess.DEVNULL)
        self._procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        return Sidecar(proc, port)

    def check(self, policy: str, *prefix: str, timeout: float = 30) -> tuple[int, dict[str, object], float]:
        """Runs ``[prefix...] warden paths check --format json``; returns (code, report, seconds)."""
        return self.check_script(
            [*prefix, *warden_cmd("paths", "check", "--policy", policy, "--format", "json")], timeout
        )

    def check_script(self, cmd: list[str], timeout: float = 30) -> tuple[int, dict[str, object], float]:
        """Runs ``cmd`` (which ends in a JSON report on stdout); returns (code, report, seconds)."""
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        took = time.monotonic() - t0
        assert "Traceback" not in done.stderr, done.stderr
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"exit {done.returncode}: {done.stdout}\n{done.stderr}") from None
        return done.returncode, report, took

    def close(self) -> None:
        for proc in self._procs:
            stop_process(proc)


@pytest.fixture
def paths_kit(tmp_path):
    kit = PathsKit(str(tmp_path))
    yield kit
    kit.close()


def by_name(report: dict[str, object]) -> dict[str, dict[str, object]]:
    return {p["name"]: p for p in report["paths"]}  # type: ignore[index,union-attr]


@pytest.fixture
def report_by_name():
    return by_name


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


@pytest.fixture
def faultfs(tmp_path):
    need(os.path.exists("/dev/fuse"), "/dev/fuse is missing: the FUSE drills need the fuse kernel module")
    need_binary("fusermount3")
    need(
        importlib.util.find_spec("mfusepy") is not None,
        "PyPI mfusepy is not installed (pip install mfusepy; it is in the test extra)",
    )
    fs = FaultFS(str(tmp_path / "fuse"))
    try:
        yield fs
    finally:
        fs.stop()


@pytest.fixture
def unshare():
    """Command prefix that runs a shell script in a private mount namespace."""
    path = need_binary("unshare")
    probe = subprocess.run([path, "-m", "true"], capture_output=True, text=True)
    need(probe.returncode == 0, f"unshare -m does not work here (needs root/CAP_SYS_ADMIN): {probe.stderr.strip()}")
    return path
