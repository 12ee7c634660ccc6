"""The ``deps`` sidecar: audits the target environment at start, on a period, and after
changes under its site-packages (watchdog; a change is audited once things are quiet for
``change_debounce_seconds``, since one ``pip install`` touches thousands of files).

The first audit runs inside the first :meth:`DepsSidecar.check` (so ``--once`` reports and
exits 0/1/3); later ones run in a worker thread and :meth:`check` collects the result, so
``/metrics`` and ``/healthz`` never wait for an audit. Nothing here raises out of ``check``
for a broken environment: a failure is an ``incomplete`` audit, a metric and a log line.
"""

from __future__ import annotations

import os
import threading
import time

from sidecars.deps.commands import build_settings, pick_target
from sidecars.deps.metrics import DepsMetrics
from sidecars.runtime import Outcome, Sidecar, SidecarContext
from warden.deps.audit import AuditReport, DatabaseCache, run_audit
from warden.deps.policy import DepsPolicy, resolve
from warden.deps.report import summary_counts
from warden.errors import WardenError
from warden.logs import log_fields
from warden.watching import Change, TreeWatcher

MAX_LOGGED_FINDINGS = 50
# Events a reader causes (open, close without write) must not trigger audits: the audit reads every file.


class DepsSidecar(Sidecar[DepsPolicy]):
    name = "deps"
    description = "audits the Python environment: lock drift, installed-file integrity, known vulnerabilities (OSV)"
    default_port = 9464
    policy_schema = DepsPolicy
    handles = frozenset()
    needs_run_dir = False

    def __init__(self, ctx: SidecarContext) -> None:
        super().__init__(ctx)
        self.metrics = DepsMetrics(ctx.registry)
        self.dbs = DatabaseCache()
        self._first = True
        self._next_audit = 0.0
        self._changed_at: float | None = None
        self._worker: threading.Thread | None = None
        self._result: tuple[Outcome, AuditReport | None] | None = None
        self._last_outcome = Outcome.OK
        self._seen: set[tuple[str, str, str]] = set()
        self._watcher: TreeWatcher | None = None
        self._lock = threading.Lock()

    # -- audits ------------------------------------------------------------------------
    def _target_args(self) -> tuple[str | None, str | None]:
        python = os.environ.get("WARDEN_PYTHON") or resolve(self.policy.target.python, self.ctx.policy_path)
        site = os.environ.get("WARDEN_SITE_PACKAGES") or resolve(self.policy.target.site_packages, self.ctx.policy_path)
        return python, site

    def audit(self) -> tuple[Outcome, AuditReport | None]:
        """One audit; never raises. Returns the outcome and the report (None if it failed early)."""
        try:
            python, site = self._target_args()
            target = pick_target(python, site, self.policy)
            settings = build_settings(
                self.policy, self.ctx.policy_path, self.ctx.state_dir, auto_approve=self.policy.integrity.auto_approve
            )
            report = run_audit(settings, target, cancel=self.ctx.stop, dbs=self.dbs, clock=self.ctx.clock)
        except WardenError as exc:
            self.metrics.failed()
            self.ctx.log.error(f"deps audit failed: {exc}", extra=log_fields(sidecar=self.name, kind="audit_failed"))
            return Outcome.INCOMPLETE, None
        except Exception:  # a bug or a broken environment must not kill the sidecar
            self.metrics.failed()
            self.ctx.log.exception("deps audit crashed", extra=log_fields(sidecar=self.name, kind="internal"))
            return Outcome.INCOMPLETE, None
        self.metrics.update(report)
        self._log(report)
        return Outcome(report.exit_code), report

    def _log(self, report: AuditReport) -> None:
        counts = summary_counts(report)
        fields = log_fields(
            sidecar=self.name,
            exit_code=report.exit_code,
            duration_seconds=round(report.duration, 3),
            findings=counts["findings"],
            vulnerabilities=counts["vulnerabilities"],
            incomplete=report.incomplete + (report.degraded if report.strict else []),
        )
        self.ctx.log.info("deps audit finished", extra=fields)
        now = {(f.check, f.kind, f.subject) for f in report.findings if f.blocking}
        fresh = [f for f in report.findings if f.blocking and (f.check, f.kind, f.subject) not in self._seen]
        for f in fresh[:MAX_LOGGED_FINDINGS]:
            self.ctx.log.warning(f.message, extra=log_fields(sidecar=self.name, check=f.check, kind=f.kind))
        self._seen = now

    def _run_worker(self) -> None:
        result = self.audit()
        with self._lock:
            self._result = result

    def _due(self, now: float) -> bool:
        if now >= self._next_audit:
            return True
        changed = self._changed_at
        return changed is not None and now - changed >= self.policy.change_debounce_seconds

    def _schedule_next(self, now: float) -> None:
        self._next_audit = now + self.policy.audit_interval_seconds
        self._changed_at = None

    def check(self) -> Outcome:
        now = time.monotonic()
        if self._first:
            self._first = False
            self._schedule_next(now)
            self._start_watch()
            outcome, _ = self.audit()
            self._last_outcome = outcome
            return outcome
        with self._lock:
            result, self._result = self._result, None
        if result is not None:
            self._worker = None
            self._last_outcome = result[0]
            return result[0]
        if self._worker is None and self._due(now):
            self._schedule_next(now)
            self._worker = threading.Thread(target=self._run_worker, name="deps-audit", daemon=True)
            self._worker.start()
        return Outcome.INCOMPLETE if self._last_outcome is Outcome.INCOMPLETE else Outcome.OK

    # -- watching ----------------------------------------------------------------------
    def _watch_paths(self) -> list[str]:
        python, site = self._target_args()
        if site:
            return [site]
        try:
            return list(pick_target(python, None, self.policy).site_packages)
        except WardenError:
            return []

    def _start_watch(self) -> None:
        if not self.policy.watch:
            return
        self._watcher = TreeWatcher(self._on_change)
        if not self._watcher.active:
            self.ctx.log.warning("watchdog missing: auditing on the period only", extra=log_fields(sidecar=self.name))
            return
        failed = [path for path in self._watch_paths() if not self._watcher.watch(path)]
        if failed:  # inotify limits, a vanished directory
            self.ctx.log.warning(
                f"cannot watch {', '.join(failed)[:300]}; auditing on the period only there",
                extra=log_fields(sidecar=self.name),
            )

    def _on_change(self, change: Change) -> None:
        self._changed_at = time.monotonic()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self._worker is not None:
            self._worker.join(timeout=30)
