"""The ``warden_tokenscan_*`` families. ``path`` labels are the watched directories: the
policy's paths and those of ``model.loading`` events, at most ``max_watched_paths`` of them
(any further directory is reported as ``path="other"``), so label values stay bounded."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warden.tokenscan.findings import count_by_severity
from warden.tokenscan.scanner import DirectoryScan

RESULTS = ("clean", "violation", "incomplete")


class TokenscanMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = ["path"]
        self.findings = Gauge(
            "warden_tokenscan_findings",
            "Findings of the last scan of a directory, by severity.",
            [*p, "severity"],
            registry=registry,
        )
        self.duration = Gauge(
            "warden_tokenscan_last_scan_duration_seconds",
            "Duration of the last scan of the directory.",
            p,
            registry=registry,
        )
        self.histogram = Histogram(
            "warden_tokenscan_scan_duration_seconds",
            "Duration of directory scans.",
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.last_scan = Gauge(
            "warden_tokenscan_last_scan_timestamp_seconds",
            "Unix time the last scan of the directory ended.",
            p,
            registry=registry,
        )
        self.incomplete = Gauge(
            "warden_tokenscan_scan_incomplete", "1 when the last scan could not read everything.", p, registry=registry
        )
        self.approved = Gauge(
            "warden_tokenscan_approved",
            "1 when the directory has an approved manifest on record.",
            p,
            registry=registry,
        )
        self.approved_dirs = Gauge(
            "warden_tokenscan_approved_directories", "Watched directories with an approved manifest.", registry=registry
        )
        self.drift = Gauge(
            "warden_tokenscan_drift", "1 while the directory differs from its approved manifest.", p, registry=registry
        )
        self.drift_detected = Counter(
            "warden_tokenscan_drift_detected",
            "Times a directory was seen drifting from its approval.",
            registry=registry,
        )
        self.scans = Counter("warden_tokenscan_scans", "Directory scans by result.", ["result"], registry=registry)
        self.watched = Gauge("warden_tokenscan_watched_directories", "Directories being watched.", registry=registry)
        for result in RESULTS:
            self.scans.labels(result)
        self.approved_dirs.set(0)

    def record(self, label: str, scan: DirectoryScan, code: int, end_time: float) -> None:
        for severity, n in count_by_severity(scan.findings).items():
            self.findings.labels(label, severity).set(n)
        self.duration.labels(label).set(scan.duration_seconds)
        self.histogram.observe(scan.duration_seconds)
        self.last_scan.labels(label).set(end_time)
        self.incomplete.labels(label).set(1 if scan.errors else 0)
        self.scans.labels({0: "clean", 1: "violation", 3: "incomplete"}[code]).inc()

    def state(self, label: str, approved: bool, drifting: bool) -> None:
        self.approved.labels(label).set(1 if approved else 0)
        self.drift.labels(label).set(1 if drifting else 0)
