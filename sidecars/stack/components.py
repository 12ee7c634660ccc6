"""The demo's plan: the local stack (docker-compose services as processes) with policies
that point at the demo run, plus the one-shot checks and verdicts of its summary.

Policies are the shipped defaults from ``policies/`` with the fields that must point at
this run replaced, written to ``<run>/policies/``; a sidecar whose module is not
importable here is left out with a note, so the demo runs on a partial install.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

Echo = Callable[[str], None]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO_POLICIES = os.path.join(REPO, "policies")
DEMO_SIDECARS = ("journal", "signer", "archiver", "tokenscan", "deps", "paths")


def free_port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port."""
    for candidate in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


@dataclass
class Plan:
    run_dir: str
    trainer_port: int
    stack: Any = None  # sidecars.stack.local.LocalStack
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.stack.urls) if self.stack else {}

    def port(self, name: str) -> int | None:
        return self.stack.ports.get(name) if self.stack else None


def warden_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "sidecars.cli", *args]


def available(name: str) -> bool:
    from sidecars.registry import SIDECARS

    module = SIDECARS[name].partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def default_policy(name: str) -> dict[str, Any]:
    with open(os.path.join(REPO_POLICIES, f"{name}.yaml"), encoding="utf-8") as fh:
        loaded = yaml.safe_load(fh)
    return loaded if isinstance(loaded, dict) else {"version": 1}


def demo_key(run_dir: str) -> tuple[str, str]:
    """A signing key pair for this demo run only, in ``<run>/keys`` (private key mode 0600)."""
    from warden.signing import generate_keypair

    key_dir = os.path.join(run_dir, "keys")
    if not os.path.exists(os.path.join(key_dir, "signing.key")):
        generate_keypair(key_dir)
    return os.path.join(key_dir, "signing.key"), os.path.join(key_dir, "signing.pub")


# Policy adjusters: the default policy -> this run's. One per sidecar.
def _signer(plan: Plan, p: dict[str, Any]) -> dict[str, Any]:
    return {
        **p,
        "signing_key": plan.settings["key"],
        "trusted_keys": plan.settings["pub"],
        "check_interval_seconds": 1,
        "stable_seconds": 2,
        "reverify_interval_seconds": 10,
    }


def _archiver(plan: Plan, p: dict[str, Any]) -> dict[str, Any]:
    store = plan.settings.get("store")
    retention = (
        {"mode": "COMPLIANCE", "days": 1, "require_object_lock": True}
        if store
        else {"mode": "none", "days": 0, "require_object_lock": False}
    )
    return {
        **p,
        "store": store or f"file://{os.path.join(plan.run_dir, 'archive')}",
        "signing_key": plan.settings["key"],
        "retention": retention,
        "check_interval_seconds": 1,
    }


def _tokenscan(plan: Plan, p: dict[str, Any]) -> dict[str, Any]:
    return {**p, "paths": [], "check_interval_seconds": 1}  # the trainer's model.loading events add paths


# The demo audits its own interpreter: in a checkout, the environment `make` built from the development
# lock (the shipped policy's lock.path is the sidecars' runtime lock, which lacks the extras).
DEV_LOCK = os.path.join(REPO_POLICIES, "locks", "dev-py311-linux-x86_64.txt")


def _deps(plan: Plan, p: dict[str, Any]) -> dict[str, Any]:
    return {
        **p,
        "target": {**p.get("target", {}), "python": sys.executable},
        "lock": {**p["lock"], "path": DEV_LOCK},
        "integrity": {**p["integrity"], "check_pyc": False},  # the full .pyc pass takes ~20 s here
        "vulnerabilities": {**p["vulnerabilities"], "pip_audit_crosscheck": False},
        "strict": False,
        "check_interval_seconds": 1,
    }


def _paths(plan: Plan, p: dict[str, Any]) -> dict[str, Any]:
    return {
        **p,
        "check_interval_seconds": 0.2,
        "paths": [
            {
                "name": "run_dir",
                "path": plan.run_dir,
                "writable": True,
                "interval_seconds": 2,
                "deadline_seconds": 1,
                "min_free_bytes": "1%",
            },
            {
                "name": "checkpoint_root",
                "path": os.path.join(plan.run_dir, "checkpoints"),
                "exists": False,
                "interval_seconds": 2,
                "deadline_seconds": 1,
            },
            {
                # The demo removes this directory for a moment to show one alert firing and resolving.
                "name": STAGED_FAULT_NAME,
                "path": staged_fault_path(plan.run_dir),
                "interval_seconds": 0.5,
                "deadline_seconds": 1,
            },
        ],
    }


STAGED_FAULT_NAME = "staged_fault"


def staged_fault_path(run_dir: str) -> str:
    """The watched directory the demo takes away and gives back (created by the plan)."""
    return os.path.join(run_dir, "staged-fault")


ADJUSTERS: dict[str, Callable[[Plan, dict[str, Any]], dict[str, Any]]] = {
    "journal": lambda plan, p: {**p, "check_interval_seconds": 1},
    "signer": _signer,
    "archiver": _archiver,
    "tokenscan": _tokenscan,
    "deps": _deps,
    "paths": _paths,
}


def plan_demo(run_dir: str) -> Plan:
    """Writes the demo's key and policies and plans the local stack; starts nothing."""
    from sidecars.stack.local import StackOptions, plan_local_stack

    plan = Plan(run_dir=run_dir, trainer_port=free_port(9460))
    plan.settings["key"], plan.settings["pub"] = demo_key(run_dir)
    os.makedirs(staged_fault_path(run_dir), exist_ok=True)
    opts = StackOptions(
        run_dir=run_dir,
        policy_dir=os.path.join(run_dir, "policies"),
        signing_key=plan.settings["key"],
        trainer_port=plan.trainer_port,
    )
    only = tuple(name for name in DEMO_SIDECARS if available(name))
    plan.notes += [f"sidecar {n} is not available in this install; skipped" for n in DEMO_SIDECARS if n not in only]
    opts.only = only
    stack = plan_local_stack(opts)
    if stack.s3_credentials is not None:
        plan.settings["store"] = "s3://warden-archive/demo"
    os.makedirs(opts.policy_dir, exist_ok=True)
    for name in only:
        with open(os.path.join(opts.policy_dir, f"{name}.yaml"), "w", encoding="utf-8") as fh:
            yaml.safe_dump(ADJUSTERS[name](plan, default_policy(name)), fh, sort_keys=False)
    plan.stack = stack
    plan.notes += stack.notes
    return plan


def scrape(port: int | None) -> dict[str, float]:
    """``{name{labels}: value}`` from a local /metrics; empty when unreachable."""
    if port is None:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def total(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix + "{"))


def lag_of(plan: Plan, name: str) -> float | None:
    return scrape(plan.port(name)).get(f"warden_sidecar_lag_events{{sidecar={name}}}")


def run_quiet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(warden_argv(*args), capture_output=True, text=True, env={**os.environ, **(env or {})})
