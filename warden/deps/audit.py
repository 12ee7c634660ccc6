"""One audit of a target: lock hygiene, drift, integrity (+ baseline), vulnerabilities.

Exit code of a report: 3 if something could not be checked (``incomplete``; with
``strict`` also ``degraded``: a stale or partly corrupt OSV database, a pip-audit
cross-check that failed or disagrees), else 1 if a blocking finding remains, else 0.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warden.deps.baseline import (
    build_baseline,
    closure_approved,
    compare_baseline,
    file_digest,
    read_baseline,
    save_baseline,
    stdlib_approved,
)
from warden.deps.cache import IntegrityCache
from warden.deps.closure import closure_document
from warden.deps.drift import check_artifacts, check_drift
from warden.deps.environment import Target
from warden.deps.errors import DepsIncomplete
from warden.deps.ignores import apply_ignores
from warden.deps.installed import InstalledDist, scan_distributions
from warden.deps.integrity import IntegrityOptions, check_integrity
from warden.deps.locks import Lock, LockedPackage, load_lock
from warden.deps.locks.hygiene import HygieneRules, applicable_packages, check_lock, sdist_findings
from warden.deps.model import CHECKS, Finding
from warden.deps.osv.loader import OsvDatabase, database_signature, load_database
from warden.deps.osv.server import OsvServer
from warden.deps.pipaudit import PipAuditError, compare, run_pip_audit
from warden.deps.policy import DepsPolicy
from warden.deps.stdlib import stdlib_document
from warden.deps.syspath import PARTIAL
from warden.deps.vulns import check_vulnerabilities
from warden.deps.walk import Budget
from warden.deps.wheels import WheelOptions, check_wheels


@dataclass(frozen=True)
class AuditSettings:
    """Resolved inputs of an audit (absolute paths; None disables what needs them)."""

    policy: DepsPolicy
    lock_path: str | None
    osv_db: str | None
    state_dir: str | None
    baseline_path: str | None
    checks: frozenset[str] = frozenset(CHECKS)
    full_pass: bool = False
    pip_audit: bool = True
    online: bool = False
    strict: bool = True
    approve: bool = False
    auto_approve: bool = False
    wheel_dirs: tuple[str, ...] = ()  # lock.wheel_dirs, resolved


@dataclass
class AuditReport:
    target: Target
    started: float
    duration: float = 0.0
    lock: Lock | None = None
    findings: list[Finding] = field(default_factory=list)
    ignored: list[Finding] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    dists: list[InstalledDist] = field(default_factory=list)
    osv_db: str | None = None
    osv_age_seconds: float | None = None
    strict: bool = True
    checks: tuple[str, ...] = CHECKS
    # The approved baseline as read first, before anything else (read_baseline): doc, sha256, problem.
    baseline: tuple[dict[str, Any] | None, str | None, str | None] = (None, None, None)

    @property
    def exit_code(self) -> int:
        if self.incomplete or (self.strict and self.degraded):
            return 3
        return 1 if any(f.blocking for f in self.findings) else 0

    def locked_by_name(self) -> dict[str, LockedPackage]:
        return {p.canonical: p for p in (self.lock.packages if self.lock else ())}


class DatabaseCache:
    """Keeps the loaded OSV database between audits; reloads when the file changes."""

    def __init__(self) -> None:
        self._db: OsvDatabase | None = None

    def get(self, path: str) -> OsvDatabase:
        signature = database_signature(path) or (0, 0)
        if self._db is None or self._db.path != path or self._db.signature != signature:
            self._db = load_database(path)
        return self._db


def _lock_checks(report: AuditReport, settings: AuditSettings) -> None:
    if not settings.lock_path or not ({"lock", "drift"} & settings.checks):
        if {"lock", "drift"} & settings.checks:
            report.notes.append("no lock configured: lock hygiene and drift not checked")
        return
    lock = report.lock = load_lock(settings.lock_path)
    rules = settings.policy.lock
    target_env = dict(report.target.markers)
    if "lock" in settings.checks:
        hygiene = HygieneRules(
            rules.allow_url,
            rules.allow_vcs,
            rules.allow_editable,
            rules.allow_local,
            rules.allow_prereleases,
            rules.allowed_indexes,
            rules.allow_http,
        )
        platforms = [{**target_env, **dict(p)} for p in rules.platforms] or [target_env]
        report.findings.extend(check_lock(lock, hygiene, platforms))
        report.findings.extend(sdist_findings(applicable_packages(lock, target_env), rules.allow_sdist_only))
    report.stats["built_locally"] = built_locally(lock, report.dists, target_env)
    if "drift" in settings.checks:
        expected = applicable_packages(lock, target_env)
        drift = settings.policy.drift
        report.findings.extend(check_drift(expected, report.dists, drift.allow_extra, drift.ignore_missing))
        report.findings.extend(check_artifacts(expected, report.dists))


def built_locally(lock: Lock, dists: list[InstalledDist], env: dict[str, str]) -> list[dict[str, str]]:
    """Installed distributions built on this side and from what (pure): the lock pins only an sdist,
    or ``direct_url.json`` names an sdist archive (``.tar.gz``/``.zip``/``.tar.bz2``)."""
    pins = {p.canonical: p for p in applicable_packages(lock, env) if p.sdist_only}
    out = []
    for dist in dists:
        source = None
        if dist.canonical in pins:
            source = f"lock: {pins[dist.canonical].sdist_only}"
        elif dist.direct_url and dist.direct_url.endswith((".tar.gz", ".zip", ".tar.bz2", ".tgz")):
            source = f"direct_url.json: {dist.direct_url}"
        if source:
            out.append({"name": dist.name, "version": dist.version, "built_from": source})
    return out


def _integrity(
    report: AuditReport, settings: AuditSettings, cancel: threading.Event, now: float, cache: IntegrityCache
) -> None:
    rules = settings.policy.integrity
    full = settings.full_pass or (now - cache.last_full_pass >= rules.full_pass_interval_seconds)
    budget = Budget(rules.max_file_bytes, rules.max_file_seconds, rules.max_audit_bytes, rules.max_audit_seconds)
    options = IntegrityOptions(
        rules.pth_allow,
        rules.unowned_allow,
        rules.check_pyc,
        rules.workers,
        full,
        rules.unhashed_allow,
        rules.egg_info_allow,
        rules.startup_allow,
        budget,
    )
    doc = report.baseline[0]
    approved = None
    if doc is not None:
        approved = {**((doc.get("stdlib") or {}).get("files") or {}), **((doc.get("closure") or {}).get("files") or {})}
    result = check_integrity(report.target, report.dists, options, cache, cancel, approved=approved)
    findings, stats, incomplete = result.findings, result.stats, result.incomplete
    findings.extend(_locked_wheels(report, settings, cache))
    report.findings.extend(findings)
    report.incomplete.extend(incomplete)
    report.notes.extend(stats.notes)
    report.stats["integrity"] = {**stats.to_dict(), "full_pass": full, "cache": bool(cache.path)}
    report.stats["integrity"].pop("notes", None)
    if full and not incomplete:
        cache.mark_full_pass(now)
    try:
        cache.save()
    except OSError as exc:
        report.notes.append(f"integrity cache not saved: {exc}")
    clean = not any(f.blocking for f in findings) and not incomplete and not report.incomplete  # discovery too
    stdlib = stdlib_document(report.target, result.stdlib) if result.stdlib.roots else {}
    report.stats["closure"] = {
        "sys_path": [e[:4] for e in result.closure.entries],
        "roots": list(result.closure.roots),
        "files": len(result.closure.files),
        "hashed": result.closure.hashed,
        "notes": list(report.target.discovery_notes),
    }
    _baseline(report, settings, clean, now, result.environment, stdlib, closure_document(result.closure))


def _locked_wheels(report: AuditReport, settings: AuditSettings, cache: IntegrityCache) -> list[Finding]:
    """Installed RECORDs vs the locked wheels in ``lock.wheel_dirs`` (wheels.py)."""
    if not settings.wheel_dirs:
        return []
    if not settings.lock_path:
        report.notes.append("lock.wheel_dirs is set but no lock is: installed files not compared with locked wheels")
        return []
    lock = report.lock or load_lock(settings.lock_path)
    locked: dict[str, LockedPackage] = {}
    for pkg in applicable_packages(lock, dict(report.target.markers)):
        locked.setdefault(pkg.canonical, pkg)
    options = WheelOptions(settings.wheel_dirs, settings.policy.lock.require_wheels)
    findings, stats = check_wheels(report.dists, locked, options, cache)
    report.notes.extend(stats.notes)
    report.stats["wheels"] = stats.to_dict()
    return findings


def _baseline(
    report: AuditReport,
    settings: AuditSettings,
    clean: bool,
    now: float,
    environment: dict[str, str],
    stdlib: dict[str, Any],
    closure: dict[str, Any],
) -> None:
    path = settings.baseline_path
    if not path:
        return
    doc, digest, problem = report.baseline  # read before anything else (run_audit)
    if problem:
        raise DepsIncomplete(problem)
    if doc is not None and not settings.approve:
        report.findings.extend(compare_baseline(report.dists, doc, environment, stdlib, closure))
        if stdlib and not stdlib_approved(doc):
            report.incomplete.append(
                f"{path}: approved before the base interpreter's stdlib was covered; re-approve with --approve"
            )
        if not closure_approved(doc):
            report.incomplete.append(
                f"{path}: approved before the import closure (sys.path) was covered; re-approve with --approve"
            )
        report.stats["baseline"] = {"path": path, "approved_at": doc.get("approved_at"), "sha256": digest}
        return
    if not (settings.approve or settings.auto_approve):
        report.notes.append(f"no approved baseline at {path}: a rewritten RECORD cannot be detected; run --approve")
        return
    if not clean:
        report.notes.append(f"baseline not approved: the integrity check found problems ({path} unchanged)")
        return
    try:
        current = file_digest(path)
    except OSError as exc:
        raise DepsIncomplete(f"{path}: baseline unreadable ({exc}); not approved") from None
    if current != digest:
        raise DepsIncomplete(f"{path}: the baseline changed during the audit (read as {digest}): not approved")
    save_baseline(path, build_baseline(report.dists, now, environment, stdlib, closure))
    report.notes.append(f"baseline approved: {path}")
    report.stats["baseline"] = {"path": path, "approved_at": "now"}


def _vulnerabilities(report: AuditReport, settings: AuditSettings, dbs: DatabaseCache, now: float) -> None:
    rules = settings.policy.vulnerabilities
    if not settings.osv_db:
        report.notes.append("no OSV database configured (vulnerabilities.osv_db): vulnerabilities not checked")
    else:
        _offline_vulns(report, settings, dbs.get(settings.osv_db), now)
    if settings.online:
        _online_vulns(report, rules.pip_audit_timeout_seconds)


def _offline_vulns(report: AuditReport, settings: AuditSettings, db: OsvDatabase, now: float) -> None:
    rules = settings.policy.vulnerabilities
    report.osv_db = db.path
    report.osv_age_seconds = db.age_seconds(now)
    found, unevaluable = check_vulnerabilities(db, report.dists, rules.fail_on)
    report.stats["osv"] = {
        "records": len(db.records),
        "pypi_records": db.pypi_records,
        "future_records": db.future_records(now),
        "corrupt": len(db.errors),
        "age_seconds": report.osv_age_seconds,
        "downloaded_at": db.meta.downloaded_at if db.meta else None,
    }
    _osv_sanity(report, db, rules.max_db_age_seconds, now)
    if settings.pip_audit:
        _crosscheck(report, db, found, rules.pip_audit_timeout_seconds)
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    kept, suppressed, warnings = apply_ignores(found + unevaluable, settings.policy.ignore, today)
    report.findings.extend(f for f in kept + warnings if f.kind != "unevaluable")
    report.incomplete.extend(
        f"{f.message} (fail closed; ignore the id to accept)" for f in kept if f.kind == "unevaluable"
    )
    report.ignored.extend(suppressed)


def _osv_sanity(report: AuditReport, db: OsvDatabase, limit: float | None, now: float) -> None:
    """An export with no PyPI record checks nothing (incomplete); a stale or partly corrupt one is degraded."""
    if not db.pypi_records:
        report.incomplete.append(f"OSV database {db.path} holds no PyPI record: nothing could be checked")
    if db.errors:
        report.degraded.append(f"OSV database has {len(db.errors)} unreadable records, e.g. {db.errors[0]}")
    if db.meta_error:
        report.degraded.append(f"OSV download metadata not used: {db.meta_error}")
    elif db.meta is None:
        report.notes.append(f"OSV database {db.path}: no download metadata (osv-import): age from record dates only")
    elif db.meta_in_future(now):
        report.degraded.append(f"OSV download metadata of {db.path} is dated in the future: not used for its age")
    future = db.future_records(now)
    if future:
        report.notes.append(f"OSV database: {future} records dated in the future were not counted for its age")
    age = report.osv_age_seconds
    if limit is not None and (age is None or age > limit):
        report.degraded.append(
            f"OSV database {db.path}: downloaded or last modified {'never' if age is None else f'{age:.0f}s ago'}, "
            f"older than vulnerabilities.max_db_age_seconds ({limit:.0f}s)"
        )


def _crosscheck(report: AuditReport, db: OsvDatabase, found: list[Finding], timeout: float) -> None:
    server = OsvServer(db).start()
    try:
        theirs = run_pip_audit(report.dists, server.query_url, timeout)
    except PipAuditError as exc:
        report.degraded.append(f"pip-audit cross-check failed: {exc}")
        return
    finally:
        server.stop()
    disagreements = compare(found, theirs)
    report.stats["pip_audit"] = {"audited": theirs.audited, "disagreements": len(disagreements)}
    if disagreements:
        report.degraded.append("pip-audit disagrees: " + "; ".join(disagreements[:10]))


def _online_vulns(report: AuditReport, timeout: float) -> None:
    try:
        online = run_pip_audit(report.dists, None, timeout)
    except PipAuditError as exc:
        report.incomplete.append(f"online vulnerability service failed (fail closed): {exc}")
        return
    known = {i for f in report.findings + report.ignored if f.check == "vulns" for i in f.details.get("ids") or ()}
    for name, groups in sorted(online.vulns.items()):
        for group in groups:
            if not group & known:
                ident = min(group)
                message = f"{name}: {ident} reported by pip-audit's online service, missing from the offline database"
                details = {"id": ident, "ids": sorted(group), "severity": "unknown", "package": name}
                report.findings.append(Finding("vulns", "vulnerable", name, message, True, details))


def run_audit(
    settings: AuditSettings,
    target: Target,
    cancel: threading.Event | None = None,
    dbs: DatabaseCache | None = None,
    clock: Callable[[], float] = time.time,
) -> AuditReport:
    """Audits ``target``. Raises LockError (exit 2) for an unusable lock; every other
    failure is recorded in the report (``incomplete``/``degraded``), never raised."""
    cancel = cancel or threading.Event()
    started = time.monotonic()
    now = clock()
    report = AuditReport(target=target, started=now, strict=settings.strict, checks=tuple(sorted(settings.checks)))
    if settings.baseline_path:  # first: nothing of the audit has run yet
        report.baseline = read_baseline(settings.baseline_path)
    for note in target.discovery_notes:  # syspath.py: a partial discovery cannot vouch for the whole path
        if note.startswith(PARTIAL):
            report.incomplete.append(f"discovery partial: {note[len(PARTIAL) :]}")
        else:
            report.notes.append(f"discovery: {note}")
    cache = IntegrityCache.for_target(settings.state_dir, target.site_packages).load()
    known = cache.known_records() if "integrity" in settings.checks else frozenset()
    for root in target.site_packages:
        report.dists.extend(scan_distributions(root, known))
    report.stats["distributions"] = len(report.dists)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("lock", lambda: _lock_checks(report, settings)),
        ("integrity", lambda: _integrity(report, settings, cancel, now, cache)),
        ("vulns", lambda: _vulnerabilities(report, settings, dbs or DatabaseCache(), now)),
    ]
    for name, step in steps:
        if name != "lock" and name not in settings.checks:
            continue
        if cancel.is_set():
            report.incomplete.append("audit cancelled")
            break
        try:
            step()
        except DepsIncomplete as exc:
            report.incomplete.append(str(exc))
    report.duration = time.monotonic() - started
    return report
