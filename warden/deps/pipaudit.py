"""pip-audit as a second opinion, always fail-closed.

Offline: pip-audit queries our ``osv-serve`` (``-s osv --osv-url``) for the exact installed
versions (a generated ``name==version`` requirements file with ``--disable-pip --no-deps``,
so no index is contacted and any target works, even a mounted site-packages), and its
findings are compared with ours. Online (optional): pip-audit's own service. Either way a
service that cannot be reached is an error, never "no known vulnerabilities": pip-audit's
output must parse and account for every package, or the caller gets PipAuditError (exit 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from warden.deps.errors import DepsIncomplete
from warden.deps.installed import InstalledDist
from warden.deps.model import Finding


class PipAuditError(DepsIncomplete):
    """pip-audit failed or its service was unreachable (fail closed)."""


@dataclass(frozen=True)
class PipAuditResult:
    """``vulns``: canonical package name -> set of id groups (each group: id and aliases)."""

    vulns: dict[str, list[frozenset[str]]]
    audited: int
    skipped: list[str]


def _requirements(dists: Sequence[InstalledDist]) -> tuple[str, list[str]]:
    lines, skipped = [], []
    for dist in sorted(dists, key=lambda d: d.canonical):
        try:
            Version(dist.version)
        except InvalidVersion:
            skipped.append(f"{dist.name} {dist.version}")
            continue
        lines.append(f"{dist.canonical}=={dist.version}")
    return "\n".join(dict.fromkeys(lines)) + "\n", skipped


def run_pip_audit(
    dists: Sequence[InstalledDist], osv_url: str | None, timeout: float = 300.0, service: str = "osv"
) -> PipAuditResult:
    """Runs pip-audit on the exact versions of ``dists``. ``osv_url`` None means pip-audit's own service."""
    text, skipped = _requirements(dists)
    if not text.strip():
        return PipAuditResult(vulns={}, audited=0, skipped=skipped)
    with tempfile.TemporaryDirectory(prefix="warden-pip-audit-") as tmp:
        req = os.path.join(tmp, "requirements.txt")
        with open(req, "w", encoding="utf-8") as fh:
            fh.write(text)
        cmd = [sys.executable, "-m", "pip_audit", "-r", req, "--disable-pip", "--no-deps", "-f", "json"]
        cmd += ["--progress-spinner", "off", "--cache-dir", os.path.join(tmp, "cache"), "--aliases", "on"]
        cmd += ["-s", service] + (["--osv-url", osv_url] if osv_url else [])
        env = dict(os.environ)
        if osv_url:
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise PipAuditError(f"pip-audit did not finish within {timeout:.0f}s") from None
        except OSError as exc:
            raise PipAuditError(f"cannot run pip-audit: {exc}") from None
    return _parse_output(proc, expected=text.count("\n"), skipped=skipped)


def _parse_output(proc: subprocess.CompletedProcess[str], expected: int, skipped: list[str]) -> PipAuditResult:
    try:
        doc = json.loads(proc.stdout)
        deps = doc["dependencies"]
    except (ValueError, KeyError, TypeError):
        lines = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
        raise PipAuditError(
            f"pip-audit failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}"
        ) from None
    vulns: dict[str, list[frozenset[str]]] = {}
    for dep in deps:
        if "skip_reason" in dep:
            raise PipAuditError(f"pip-audit skipped {dep.get('name')}: {dep['skip_reason']}")
        groups = [frozenset([v["id"], *v.get("aliases", [])]) for v in dep.get("vulns", [])]
        if groups:
            vulns[canonicalize_name(dep["name"])] = groups
    if len(deps) < expected:
        raise PipAuditError(f"pip-audit reported {len(deps)} of {expected} packages")
    return PipAuditResult(vulns=vulns, audited=len(deps), skipped=skipped)


def compare(ours: Sequence[Finding], theirs: PipAuditResult) -> list[str]:
    """Disagreements between our vulnerability findings and pip-audit's (empty: they agree).

    Two findings agree when their id sets (id and aliases) intersect, per package.
    """
    mine: dict[str, list[frozenset[str]]] = {}
    for f in ours:
        if f.check == "vulns" and f.kind == "vulnerable":
            mine.setdefault(f.subject, []).append(frozenset(f.details.get("ids") or [f.details.get("id")]))
    out = []
    for name in sorted(set(mine) | set(theirs.vulns)):
        a, b = mine.get(name, []), theirs.vulns.get(name, [])
        for group in a:
            if not any(group & other for other in b):
                out.append(f"{name}: we report {min(group)}, pip-audit does not")
        for group in b:
            if not any(group & other for other in a):
                out.append(f"{name}: pip-audit reports {min(group)}, we do not")
    return out
