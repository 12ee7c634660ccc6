"""Prometheus families of the deps sidecar (DESIGN section 8: warden_ prefix, base units, bounded labels)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from warden.deps.audit import AuditReport
from warden.deps.closure import CLOSURE_KINDS
from warden.deps.drift import DRIFT_KINDS
from warden.deps.locks.hygiene import LOCK_KINDS
from warden.deps.model import SEVERITIES
from warden.deps.report import summary_counts

INTEGRITY_KINDS = (
    "tampered",
    "record_changed",
    "pyc_mismatch",
    "missing_file",
    "unowned",
    "pth_not_allowed",
    "no_record",
    "not_in_baseline",
    "removed_from_baseline",
    "environment_changed",
    "unhashed",
    "egg_info",
    "special_file",
    "link_outside",
    "startup_hook",
    "venv_config",
    "interpreter_replaced",
    "venv_script_changed",
    "stdlib_changed",
    "stdlib_added",
    "stdlib_removed",
    "record_mismatch",
    "wheel_missing",
    "wheel_unusable",
    *CLOSURE_KINDS,
)
# Everything that means "the environment is not what was installed and approved" pages as
# tampering (WardenDepsTamperedFiles): start-up hooks and interpreter changes included.
TAMPER_KINDS = (
    "tampered",
    "record_changed",
    "pyc_mismatch",
    "unhashed",
    "not_in_baseline",
    "removed_from_baseline",
    "environment_changed",
    "pth_not_allowed",
    "special_file",
    "link_outside",
    "startup_hook",
    "venv_config",
    "interpreter_replaced",
    "venv_script_changed",
    "stdlib_changed",
    "stdlib_added",
    "stdlib_removed",
    "record_mismatch",
    *CLOSURE_KINDS,  # the import path changed, a file on it, a shadowing module, a ._pth, an oversized file
)
RESULTS = ("clean", "violation", "incomplete")


class DepsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.drift = Gauge(
            "warden_deps_drift_packages", "Packages that drift from the lock, by kind.", ["kind"], registry=r
        )
        self.lock = Gauge("warden_deps_lock_findings", "Lock hygiene findings, by kind.", ["kind"], registry=r)
        self.integrity = Gauge(
            "warden_deps_integrity_findings", "Installed-file integrity findings, by kind.", ["kind"], registry=r
        )
        self.tampered = Gauge(
            "warden_deps_tampered_files", "Files differing from RECORD, the baseline or their source.", registry=r
        )
        self.unowned = Gauge("warden_deps_unowned_files", "Files in site-packages no distribution owns.", registry=r)
        self.vulns = Gauge(
            "warden_deps_vulnerabilities", "Known vulnerabilities not ignored, by severity.", ["severity"], registry=r
        )
        self.ignored = Gauge(
            "warden_deps_vulnerabilities_ignored", "Vulnerabilities suppressed by the policy.", registry=r
        )
        self.last_audit = Gauge(
            "warden_deps_last_audit_timestamp_seconds", "Unix time the last audit started.", registry=r
        )
        self.last_complete = Gauge(
            "warden_deps_last_complete_audit_timestamp_seconds", "Unix time of the last complete audit.", registry=r
        )
        self.duration = Gauge("warden_deps_audit_duration_seconds", "Duration of the last audit.", registry=r)
        self.osv_age = Gauge(
            "warden_deps_osv_database_age_seconds", "Age of the OSV database used (-1: none loaded).", registry=r
        )
        self.incomplete = Gauge(
            "warden_deps_audit_incomplete", "1 when the last audit could not check everything.", registry=r
        )
        self.audits = Counter("warden_deps_audits", "Audits run, by result.", ["result"], registry=r)
        self.files_hashed = Counter("warden_deps_files_hashed", "Installed files re-hashed.", registry=r)
        self.dists = Gauge("warden_deps_installed_distributions", "Distributions installed in the target.", registry=r)
        for kind in DRIFT_KINDS:
            self.drift.labels(kind)
        for kind in LOCK_KINDS:
            self.lock.labels(kind)
        for kind in INTEGRITY_KINDS:
            self.integrity.labels(kind)
        for sev in SEVERITIES:
            self.vulns.labels(sev)
        for result in RESULTS:
            self.audits.labels(result)
        self.osv_age.set(-1)

    def update(self, report: AuditReport) -> None:
        counts = summary_counts(report)
        found = counts["findings"]
        for family, kinds, check in (
            (self.drift, DRIFT_KINDS, "drift"),
            (self.lock, LOCK_KINDS, "lock"),
            (self.integrity, INTEGRITY_KINDS, "integrity"),
        ):
            for kind in kinds:
                family.labels(kind).set(found.get(check, {}).get(kind, 0))
        integ = found.get("integrity", {})
        self.tampered.set(sum(integ.get(k, 0) for k in TAMPER_KINDS))
        self.unowned.set(integ.get("unowned", 0))
        for sev, n in counts["vulnerabilities"].items():
            self.vulns.labels(sev).set(n)
        self.ignored.set(counts["ignored"])
        self.last_audit.set(report.started)
        self.duration.set(report.duration)
        self.osv_age.set(report.osv_age_seconds if report.osv_age_seconds is not None else -1)
        code = report.exit_code
        self.incomplete.set(1 if code == 3 else 0)
        if code != 3:
            self.last_complete.set(report.started)
        self.audits.labels({0: "clean", 1: "violation"}.get(code, "incomplete")).inc()
        self.files_hashed.inc(int((report.stats.get("integrity") or {}).get("files_hashed", 0)))
        self.dists.set(len(report.dists))

    def failed(self) -> None:
        """An audit that raised before producing a report."""
        self.incomplete.set(1)
        self.audits.labels("incomplete").inc()
