"""The demo's and the local stack's components: which sidecars run, with which policies.

A sidecar whose module is not importable here is left out with a note, so the demo
still runs on a partial install. Policies are the shipped defaults from ``policies/``
with the fields that must point at this run replaced, written to ``<run>/policies/``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from sidecars.registry import SIDECARS
from sidecars.stack.supervisor import Service

Echo = Callable[[str], None]
REPO_POLICIES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "policies")


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
class SidecarPlan:
    name: str
    port: int
    policy_path: str
    follows_journal: bool


@dataclass
class Plan:
    run_dir: str
    trainer_port: int
    services: list[Service] = field(default_factory=list)
    sidecars: list[SidecarPlan] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def warden_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "sidecars.cli", *args]


def available(name: str) -> bool:
    module = SIDECARS[name].partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def default_policy(name: str) -> dict[str, Any]:
    path = os.path.join(REPO_POLICIES, f"{name}.yaml")
    if not os.path.exists(path):
        return {"version": 1}
    with open(path, encoding="utf-8") as fh:
        loaded = yaml.safe_load(fh)
    return loaded if isinstance(loaded, dict) else {"version": 1}


def write_policy(plan: Plan, name: str, policy: dict[str, Any]) -> str:
    directory = os.path.join(plan.run_dir, "policies")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(policy, fh, sort_keys=False)
    return path


# Policy adjusters: default policy -> the policy for this run. One per sidecar.
def _journal_policy(plan: Plan, policy: dict[str, Any]) -> dict[str, Any]:
    return {**policy, "check_interval_seconds": 2}


def _paths_policy(plan: Plan, policy: dict[str, Any]) -> dict[str, Any]:
    entries = [
        {
            "name": "run_dir",
            "path": plan.run_dir,
            "readable": True,
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
    ]
    return {**policy, "paths": entries}


def demo_key(plan: Plan) -> str:
    """A signing key for this demo run only: ``<run>/keys/signing.key`` (mode 0600)."""
    from sidecars.signer import generate_keypair

    key_dir = os.path.join(plan.run_dir, "keys")
    path = os.path.join(key_dir, "signing.key")
    if not os.path.exists(path):
        generate_keypair(key_dir)
    return path


def _signer_policy(plan: Plan, policy: dict[str, Any]) -> dict[str, Any]:
    key = demo_key(plan)
    plan.settings["signing_key"] = key
    plan.settings["trusted_keys"] = os.path.join(os.path.dirname(key), "signing.pub")
    return {
        **policy,
        "signing_key": key,
        "trusted_keys": plan.settings["trusted_keys"],
        "check_interval_seconds": 1,
        "stable_seconds": 2,
        "reverify_interval_seconds": 10,
    }


POLICY_ADJUSTERS: dict[str, Callable[[Plan, dict[str, Any]], dict[str, Any]]] = {
    "journal": _journal_policy,
    "signer": _signer_policy,
    "paths": _paths_policy,
}


def plan_demo(run_dir: str) -> Plan:
    """Decides ports, writes policies and builds the service list for a demo run."""
    plan = Plan(run_dir=run_dir, trainer_port=free_port(9460))
    plan.urls["trainer"] = f"http://127.0.0.1:{plan.trainer_port}/metrics"
    for name, adjust in POLICY_ADJUSTERS.items():
        if name not in SIDECARS or not available(name):
            plan.notes.append(f"sidecar {name} is not available in this install; skipped")
            continue
        policy_path = write_policy(plan, name, adjust(plan, default_policy(name)))
        add_sidecar(plan, name, policy_path)
    return plan


def add_sidecar(plan: Plan, name: str, policy_path: str) -> None:
    from sidecars.registry import sidecar_class

    cls = sidecar_class(name)
    port = free_port(cls.default_port)
    argv = warden_argv(
        "sidecar",
        "run",
        name,
        "--run-dir",
        plan.run_dir,
        "--policy",
        policy_path,
        "--port",
        str(port),
        "--poll-interval",
        "0.5",
    )
    log = os.path.join(plan.run_dir, "logs", f"{name}.log")
    plan.services.append(Service(name, argv, ready_url=f"http://127.0.0.1:{port}/healthz", log_path=log))
    plan.sidecars.append(SidecarPlan(name, port, policy_path, bool(cls.handles)))
    plan.urls[name] = f"http://127.0.0.1:{port}/metrics"


def scrape(port: int) -> dict[str, float]:
    """``{sample name + labels: value}`` from a local /metrics; empty when unreachable."""
    import urllib.request

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


def lag_of(sidecar: SidecarPlan) -> float | None:
    samples = scrape(sidecar.port)
    return samples.get(f"warden_sidecar_lag_events{{sidecar={sidecar.name}}}")


def one_shot_checks(plan: Plan, echo: Echo) -> dict[str, str]:
    """Runs each available one-shot check and returns a verdict line per check."""
    verdicts: dict[str, str] = {}
    for sc in plan.sidecars:
        samples = scrape(sc.port)
        processed = samples.get(f"warden_sidecar_events_processed_total{{sidecar={sc.name}}}", 0.0)
        errors = sum(v for k, v in samples.items() if k.startswith("warden_sidecar_errors_total"))
        verdicts[f"sidecar {sc.name}"] = f"{processed:.0f} events handled, {errors:.0f} errors"
    if "trusted_keys" in plan.settings:
        verdicts["signatures"] = verify_checkpoints(plan)
    if any(sc.name == "paths" for sc in plan.sidecars):
        policy = next(sc.policy_path for sc in plan.sidecars if sc.name == "paths")
        result = subprocess.run(warden_argv("paths", "check", "--policy", policy), capture_output=True, text=True)
        verdicts["paths"] = {0: "healthy", 1: "UNHEALTHY", 3: "could not check"}.get(result.returncode, "?")
    return verdicts


def verify_checkpoints(plan: Plan) -> str:
    """`warden checkpoint verify` on every checkpoint of the run, as the auditor would."""
    root = os.path.join(plan.run_dir, "checkpoints")
    names = (
        sorted(n for n in os.listdir(root) if n.startswith("step-") and os.path.isdir(os.path.join(root, n)))
        if os.path.isdir(root)
        else []
    )
    ok = 0
    for name in names:
        result = subprocess.run(
            warden_argv("checkpoint", "verify", os.path.join(root, name), "--trust", plan.settings["trusted_keys"]),
            capture_output=True,
            text=True,
        )
        ok += result.returncode == 0
    plan.next_steps.append(
        f"verify       warden checkpoint verify {root}/{names[-1] if names else 'step-N'} "
        f"--trust {plan.settings['trusted_keys']}"
    )
    return f"{ok}/{len(names)} checkpoints signed and verified (warden checkpoint verify)"


def firing_alerts(plan: Plan) -> str:
    if "alertmanager" not in plan.urls:
        return "Alertmanager not running in this demo (install prometheus-alertmanager)"
    return "none"


def which(binary: str) -> str | None:
    return shutil.which(binary)
