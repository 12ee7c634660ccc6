"""Fixtures of the path watcher's tests: policies, a running sidecar, the FUSE fault filesystem.

Helpers are reached through the ``paths_kit`` fixture (tests here do not import each other).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from dataclasses import dataclass, field

import pytest
import yaml
from faults import FaultFS, need
from support import ROOT, free_port, http_get, need_binary, parse_samples, spawn, stop_process, wait_http, warden_cmd


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
        return parse_samples(body)

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
