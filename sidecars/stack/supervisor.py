"""Starts, watches and stops the stack's processes by PID.

Each service logs to its own file; a crashed service is restarted with back-off up to a
limit; ``stop_all`` sends SIGTERM, waits, then SIGKILL, so nothing outlives the stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from warden.errors import IncompleteError


class ServiceFailed(IncompleteError):
    """A service did not become ready or crashed too often; the message names it and its log."""


@dataclass
class Service:
    """One process of the stack. ``ready_url`` answering 200 means ready."""

    name: str
    argv: list[str]
    ready_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    log_path: str = ""
    restarts_allowed: int = 3
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _log: IO[bytes] | None = None

    def start(self) -> None:
        if self.log_path:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open while the process runs)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env={**os.environ, **self.env},
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except OSError:
        return False


class Supervisor:
    """Owns a list of services; ``clock``/``sleep`` are injectable for tests."""

    def __init__(self, services: list[Service], sleep: Callable[[float], None] = time.sleep) -> None:
        self.services = services
        self._sleep = sleep

    def start_all(self, ready_timeout: float = 60.0) -> None:
        self.start(self.services, ready_timeout)

    def start(self, services: list[Service], ready_timeout: float = 60.0) -> None:
        """Starts ``services`` (all at once) and waits until each is ready."""
        for svc in services:
            svc.start()
        for svc in services:
            self.wait_ready(svc, ready_timeout)

    def wait_ready(self, svc: Service, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not svc.running:
                raise ServiceFailed(
                    f"{svc.name} exited with {svc.proc and svc.proc.returncode} while starting; "
                    f"see {svc.log_path or 'its output'}"
                )
            if svc.ready_url is None or http_ok(svc.ready_url):
                return
            if time.monotonic() > deadline:
                raise ServiceFailed(f"{svc.name} not ready at {svc.ready_url} after {timeout:.0f}s; see {svc.log_path}")
            self._sleep(0.1)

    def check_restart(self) -> list[str]:
        """Restarts crashed services (up to their limit); returns the names restarted."""
        restarted = []
        for svc in self.services:
            if svc.proc is not None and not svc.running:
                if svc.restarts >= svc.restarts_allowed:
                    raise ServiceFailed(f"{svc.name} crashed {svc.restarts + 1} times; see {svc.log_path}")
                svc.restarts += 1
                svc.start()
                restarted.append(svc.name)
        return restarted

    def stop_all(self) -> None:
        for svc in reversed(self.services):
            svc.stop()
