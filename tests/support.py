"""Helpers shared by the tests: free ports, process control, HTTP polling, binaries.

Fakes that implement real interfaces also live here, so there is one place to look.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import pytest

from warden.archive.errors import StoreUnavailable
from warden.archive.store import DEFAULT_MAX_OBJECT_BYTES, Blob, Retention, Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IN_CI = os.environ.get("CI", "").lower() == "true"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def need_binary(name: str) -> str:
    """Path of ``name``; skips locally when missing, fails under CI=true."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (CI installs it via .ci/run)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def warden_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sidecars.cli", *args]


def run_warden(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, cwd: str = ROOT
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(warden_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(body: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by (name, sorted label pairs)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


def scrape(target: int | str, timeout: float = 5.0) -> Samples:
    """One /metrics scrape of a port on 127.0.0.1 (or a full URL); asserts it answered 200."""
    url = target if isinstance(target, str) else f"http://127.0.0.1:{target}/metrics"
    status, body = http_get(url, timeout=timeout)
    assert status == 200, f"{url}: {status} {body[:200]}"
    return parse_samples(body)


def wait_http(url: str, deadline_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> str:
    """Polls ``url`` until it answers 200 and returns the body."""
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {url} answered")
        try:
            status, body = http_get(url, timeout=1.0)
            if status == 200:
                return body
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{url} did not answer within {deadline_s}s ({last})")


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10) -> int:
    """Signals ``proc`` by PID, waits, kills on timeout; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def spawn(cmd: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(cmd), cwd=ROOT, **kwargs)  # type: ignore[call-overload]


class WebhookSink:
    """An Alertmanager webhook receiver on 127.0.0.1: records every POST by URL path.

    ``wait_for(path, predicate, timeout)`` returns the first alert (a dict with labels,
    status, ...) posted to ``path`` that satisfies ``predicate``, with its arrival time.
    """

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received: list[tuple[float, str, dict]] = []
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(body or b"{}")
                with sink._cond:
                    for alert in payload.get("alerts", []):
                        sink.received.append((time.monotonic(), self.path, alert))
                    sink._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_for(self, path: str, predicate, timeout: float) -> tuple[float, dict]:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for arrived, got_path, alert in self.received:
                    if got_path == path and predicate(alert):
                        return arrived, alert
                remaining = end - time.monotonic()
                if remaining <= 0:
                    seen = [(p, a.get("labels", {}).get("alertname"), a.get("status")) for _, p, a in self.received]
                    raise AssertionError(f"no matching alert on {path} within {timeout}s; got {seen}")
                self._cond.wait(remaining)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeClock:
    """Simulated time for code that takes ``monotonic`` and ``wait(event, timeout)`` callables.

    :meth:`wait` returns at once when the event is set; otherwise it advances time by the
    timeout, running what :meth:`at` scheduled for that span in order (an action may set
    the event, which ends the wait then, as a real wait would). ``waits`` records each
    wait as (start time, timeout). A loop that turns without waiting cannot advance this
    clock, so it would run forever: more than ``max_reads`` reads of :meth:`monotonic`
    between two waits, or more than ``max_waits`` waits in all, fail the test instead.
    """

    def __init__(self, start: float = 0.0, *, max_reads: int = 1000, max_waits: int = 100_000) -> None:
        self.now = start
        self.waits: list[tuple[float, float]] = []
        self.max_reads, self.max_waits = max_reads, max_waits
        self._reads = 0
        self._due: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        self._reads += 1
        if self._reads > self.max_reads:
            raise AssertionError(f"{self._reads} clock reads without a wait, at t={self.now}: a loop spins")
        return self.now

    def at(self, when: float, action: Callable[[], object]) -> None:
        """Runs ``action`` when simulated time reaches ``when`` (during a wait)."""
        heapq.heappush(self._due, (when, next(self._order), action))

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self._reads = 0
        self.waits.append((self.now, timeout))
        if len(self.waits) > self.max_waits:
            raise AssertionError(f"{len(self.waits)} waits by t={self.now}: a loop spins")
        end = self.now + timeout
        while not event.is_set() and self._due and self._due[0][0] <= end:
            when, _, action = heapq.heappop(self._due)
            self.now = max(self.now, when)
            action()
        if not event.is_set():
            self.now = end
        return event.is_set()


class FakeStore(Store):
    """An in-memory :class:`~warden.archive.store.Store` that can be taken down.

    While ``down`` every request fails as a refused connection does (StoreUnavailable, kind
    ``connect``). ``attempts`` lists every request as (``clock()``, operation, succeeded);
    ``object_lock`` is what :meth:`object_lock_enabled` answers. No versions.
    """

    def __init__(
        self, url: str = "fake://store", *, object_lock: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(url)
        self.objects: dict[str, bytes] = {}
        self.object_lock = object_lock
        self.down = False
        self.clock = clock
        self.attempts: list[tuple[float, str, bool]] = []

    def _request(self, operation: str) -> None:
        self._count(operation)
        self.attempts.append((self.clock(), operation, not self.down))
        if self.down:
            raise StoreUnavailable(f"{self.url}: {operation}: connection refused (store down)", "connect")

    def failed_attempts(self) -> list[float]:
        """When each failed request was sent."""
        return [when for when, _, ok in self.attempts if not ok]

    def _put_if_absent(self, key: str, body: bytes, retention: Retention | None) -> bool:
        self._request("PutObject")
        with self._lock:
            if key in self.objects:
                return False
            self.objects[key] = body
            return True

    def put(self, key: str, body: bytes, retention: Retention | None = None) -> None:
        self._request("PutObject")
        with self._lock:
            self.objects[key] = body

    def read(self, key: str, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES, version_id: str | None = None) -> Blob | None:
        self._request("GetObject")
        with self._lock:
            body = self.objects.get(key)
        return None if body is None or version_id is not None else Blob(body)

    def list_keys(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[str]:
        self._request("ListObjectsV2")
        with self._lock:
            keys = sorted(k for k in self.objects if k.startswith(prefix) and (start_after is None or k > start_after))
        return keys[:limit] if limit is not None else keys

    def object_lock_enabled(self) -> bool:
        self._request("GetObjectLockConfiguration")
        return self.object_lock


class StackProcess:
    """`warden stack up` in a child process; reads the URLs it prints."""

    def __init__(self, args: list[str]) -> None:
        self.proc = spawn(warden_cmd("stack", "up", *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.urls: dict[str, str] = {}
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            match = re.match(r"^\s+(\S+)\s+(http://127\.0\.0\.1:\d+)", line)
            if match:
                self.urls[match.group(1)] = match.group(2)
            if line.startswith("stack ready"):
                threading.Timer(0.5, self.ready.set).start()

    def wait_ready(self, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while not self.ready.wait(0.2) and self.proc.poll() is None and time.monotonic() < end:
            pass
        if not self.ready.is_set():
            self.stop()
            raise AssertionError("stack not ready:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# A tiny trainer config for tests: ~0.2M parameters, 8 prompts x 8 tokens, CPU, one thread.
TEST_CONFIG = {
    "version": 1,
    "run": {"seed": 3, "device": "cpu", "metrics_port": 0, "torch_threads": 1, "console": False},
    "model": {
        "tiny": {
            "vocab_size": 300,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 128,
            "num_prompts": 64,
        }
    },
    "reward": {"kind": "rule", "rule": "digits"},
    "rollout": {"n": 2, "max_new_tokens": 8, "progress": False},
    "algorithm": {"kl_coef": 0.001, "kl_kind": "k3"},
    "ppo": {
        "train_batch_size": 8,
        "mini_batch_size": 8,
        "micro_batch_size": 4,
        "epochs": 2,
        "actor_lr": 3.0e-3,
        "critic_lr": 3.0e-3,
    },
    "snapshot": {"top_k": 3},
    "checkpoint": {"every_steps": 2, "keep_last": 3},
    "max_steps": 4,
}


def merge(base, extra):
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
