"""The real stack for the fault drills: `warden stack up` with a webhook sink as the pager.

The `drill` fixture itself lives in tests/e2e/conftest.py.

Each drill gets a fresh run directory, its own policies, the sidecars it needs, Prometheus
and Alertmanager (scraping and evaluating every 0.5 s) and a sink that records pages.
"""

from __future__ import annotations

import os
import shutil
import time

import yaml
from support import StackProcess, WebhookSink, need_binary

FAST = ["--scrape-interval", "500ms", "--evaluation-interval", "500ms"]


def need_monitoring() -> None:
    need_binary("prometheus")
    if not (shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")):
        need_binary("prometheus-alertmanager")


class Drill:
    """One drill's world: policies dir, run dir, sink, and the stack once started."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.run_dir = os.path.join(base, "run")
        self.policy_dir = os.path.join(base, "policies")
        os.makedirs(self.run_dir)
        os.makedirs(self.policy_dir)
        self.sink = WebhookSink()
        self.stack: StackProcess | None = None

    def policy(self, name: str, body: dict) -> str:
        path = os.path.join(self.policy_dir, f"{name}.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump({"version": 1, **body}, fh)
        return path

    def start(self, *only: str, extra: tuple[str, ...] = ()) -> StackProcess:
        need_monitoring()
        args = [
            "--run-dir",
            self.run_dir,
            "--policy-dir",
            self.policy_dir,
            *FAST,
            "--pager-url",
            self.sink.url("/pager"),
            "--ticket-url",
            self.sink.url("/ticket"),
            "--deadman-url",
            self.sink.url("/deadman"),
            *extra,
        ]
        for name in only:
            args += ["--only", name]
        self.stack = StackProcess(args)
        self.stack.wait_ready()
        # The pipeline is live once the Watchdog reaches the dead-man's switch.
        self.sink.wait_for("/deadman", lambda a: a["labels"].get("alertname") == "Watchdog", timeout=30)
        return self.stack

    def page(self, alertname: str, timeout: float, status: str = "firing", receiver: str = "/pager"):
        return self.sink.wait_for(
            receiver, lambda a: a["labels"].get("alertname") == alertname and a.get("status") == status, timeout
        )

    def close(self) -> None:
        if self.stack is not None:
            code = self.stack.stop()
            assert code == 0, "\n".join(self.stack.lines[-20:])
        self.sink.close()


def record(name: str, seconds: float) -> None:
    """Prints a drill's measured fault-to-page time (collected for the closing note)."""
    print(f"\nDRILL {name}: fault-to-page {seconds:.2f} s")
    with open(os.path.join(os.environ.get("WARDEN_DRILL_LOG_DIR", "/tmp"), "warden-drills.log"), "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name} {seconds:.3f}\n")
