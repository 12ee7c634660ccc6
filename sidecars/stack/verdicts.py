"""The demo summary's one-shot checks: each returns one verdict line a newcomer can read."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from sidecars.stack.components import STAGED_FAULT_NAME, Plan, run_quiet, scrape, staged_fault_path, total

STAGED_ALERT = "WardenPathUnreachable"


def signatures(plan: Plan) -> str:
    """`warden checkpoint verify` on every checkpoint, as an auditor would."""
    root = os.path.join(plan.run_dir, "checkpoints")
    names = (
        sorted(n for n in os.listdir(root) if n.startswith("step-") and not n.endswith(".sig"))
        if os.path.isdir(root)
        else []
    )
    ok = sum(
        run_quiet("checkpoint", "verify", os.path.join(root, n), "--trust", plan.settings["pub"]).returncode == 0
        for n in names
    )
    if names:
        plan.next_steps.append(f"verify   warden checkpoint verify {root}/{names[-1]} --trust {plan.settings['pub']}")
    return f"{ok}/{len(names)} checkpoints signed and verified (warden checkpoint verify)"


def archive(plan: Plan, run_id: str, steps: list[int]) -> str:
    """Archived records and one audit query for a chosen step, verified, plus the whole chain."""
    if not steps or "archiver" not in plan.urls:
        return "no snapshots archived"
    store = plan.settings.get("store") or f"file://{os.path.join(plan.run_dir, 'archive')}"
    env = _s3_env(plan)
    step = steps[len(steps) // 2]
    one = run_quiet(
        "audit",
        "snapshot",
        "--run",
        run_id,
        "--step",
        str(step),
        "--store",
        store,
        "--trust",
        plan.settings["pub"],
        "--format",
        "json",
        env=env,
    )
    chain = run_quiet(
        "audit", "verify-run", "--run", run_id, "--store", store, "--trust", plan.settings["pub"], env=env
    )
    archived = total(scrape(plan.port("archiver")), "warden_archiver_records_archived_total")
    kept = export_archive(store, env, run_id, os.path.join(plan.run_dir, "archive-copy"))
    plan.next_steps.append(
        f"audit    warden audit snapshot --run {run_id} --step {step} --store {kept} --trust {plan.settings['pub']}"
    )
    plan.next_steps.append(
        f"chain    warden audit verify-run --run {run_id} --store {kept} --trust {plan.settings['pub']}"
    )
    best = ""
    if one.returncode == 0:
        try:
            record = json.loads(one.stdout)
            top = _first_sample(record)
            best = f"; step {step} top response {top!r}" if top else ""
        except ValueError:
            pass
    return (
        f"{archived:.0f} records archived to {store}; audit of step {step}: "
        f"{_outcome(one.returncode, 'verified', 'FAILED')}; "
        f"chain of the run: {_outcome(chain.returncode, 'verified', 'BROKEN')}{best}"
    )


def export_archive(store: str, env: dict[str, str], run_id: str, directory: str) -> str:
    """A file:// copy of the run's archived objects, so the printed audit commands work after
    the demo stopped its S3; ``store`` itself when it already is a file store. Signatures and
    the chain are what an audit checks, and they travel with the bytes."""
    if store.startswith("file://") or not env:
        return store
    from warden.archive.store import open_store

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        source, copy = open_store(store), open_store(f"file://{os.path.abspath(directory)}")
        for key in source.list_keys(f"runs/{run_id}/"):
            body = source.get(key)
            if body is not None:
                copy.put(key, body)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return f"file://{os.path.abspath(directory)}"


def _outcome(code: int, good: str, bad: str) -> str:
    return good if code == 0 else f"{bad} (exit {code})"


def _first_sample(record: Any) -> str:
    for key in ("record", "snapshot"):
        if isinstance(record, dict) and isinstance(record.get(key), dict):
            record = record[key]
    samples = record.get("samples") if isinstance(record, dict) else None
    if isinstance(samples, list) and samples and isinstance(samples[0], dict):
        return str(samples[0].get("response", ""))[:40]
    return ""


def _s3_env(plan: Plan) -> dict[str, str]:
    creds = plan.stack.s3_credentials if plan.stack else None
    if not creds or not plan.settings.get("store"):
        return {}
    return {
        "AWS_ENDPOINT_URL_S3": plan.urls["s3"],
        "AWS_ACCESS_KEY_ID": creds[0],
        "AWS_SECRET_ACCESS_KEY": creds[1],
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def tokenizer(plan: Plan, tokenizer_path: str | None) -> str:
    if not tokenizer_path:
        return "no tokenizer loaded"
    result = run_quiet("scan", "tokenizer", tokenizer_path)
    word = {0: "clean", 1: "FINDINGS", 3: "could not scan"}.get(result.returncode, "?")
    approved = total(scrape(plan.port("tokenscan")), "warden_tokenscan_approved_directories")
    return f"{word}: {tokenizer_path} (sidecar: {approved:.0f} approved directories)"


def deps(plan: Plan) -> str:
    s = scrape(plan.port("deps"))
    if not s:
        return "deps sidecar not running"
    drift = total(s, "warden_deps_drift_packages")
    tampered = s.get("warden_deps_tampered_files{}", 0.0)
    dists = s.get("warden_deps_installed_distributions{}", 0.0)
    word = "clean" if drift == 0 and tampered == 0 else "FINDINGS"
    return f"{word}: {dists:.0f} distributions checked against the lock; {drift:.0f} drifting, {tampered:.0f} tampered"


def paths(plan: Plan) -> str:
    s = scrape(plan.port("paths"))
    up = {k: v for k, v in s.items() if k.startswith("warden_path_up{")}
    healthy = sum(1 for v in up.values() if v == 1)
    return f"{healthy}/{len(up)} watched paths healthy" if up else "paths sidecar not running"


def alerts(plan: Plan) -> str:
    url = plan.urls.get("alertmanager")
    if not url:
        return "Alertmanager not running (Debian: prometheus prometheus-alertmanager)"
    try:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true", timeout=3) as resp:
            active = json.load(resp)
    except OSError as exc:
        return f"could not ask Alertmanager ({exc})"
    names = sorted({a["labels"].get("alertname", "?") for a in active} - {"Watchdog"})
    return "none fired (Watchdog heartbeat only)" if not names else "FIRING: " + ", ".join(names)


def _active_alerts(url: str) -> set[tuple[str, str]]:
    """(alertname, path label) of every alert Alertmanager holds active now."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true&silenced=false&inhibited=false", timeout=3) as resp:
        return {(a["labels"].get("alertname", "?"), a["labels"].get("path", "")) for a in json.load(resp)}


def _wait(condition: Callable[[], bool], deadline_s: float) -> float | None:
    """Seconds until ``condition()`` held, polling every 0.2 s; None after ``deadline_s``."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        try:
            if condition():
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.2)
    return None


def staged_alert(plan: Plan, deadline_s: float = 60.0) -> str:
    """Takes a watched directory away until WardenPathUnreachable (for that path) reaches
    Alertmanager, gives it back, and waits for the alert to resolve: the alert path end to end."""
    url = plan.urls.get("alertmanager")
    if not url:
        return "skipped: Alertmanager not running (Debian: prometheus prometheus-alertmanager)"
    path = staged_fault_path(plan.run_dir)
    ours = (STAGED_ALERT, STAGED_FAULT_NAME)  # the alert's path label is the watched path's name
    if _wait(lambda: ours not in _active_alerts(url), deadline_s) is None:
        return f"skipped: {STAGED_ALERT} for {path} was already firing"
    hidden = path + ".away"
    os.rename(path, hidden)
    try:
        fired = _wait(lambda: ours in _active_alerts(url), deadline_s)
    finally:
        os.rename(hidden, path)
    if fired is None:
        return f"{STAGED_ALERT} did NOT fire within {deadline_s:.0f} s of removing {path}"
    resolved = _wait(lambda: ours not in _active_alerts(url), deadline_s)
    ended = f"resolved {resolved:.1f} s after it was restored" if resolved is not None else "did NOT resolve"
    return f"{STAGED_ALERT} (critical) fired {fired:.1f} s after {path} was removed; {ended}"
