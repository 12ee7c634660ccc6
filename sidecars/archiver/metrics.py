"""The archiver's own metrics (beside the common ``warden_sidecar_*`` families).

No run ids, steps or sample text in labels: ``kind`` and ``reason`` take a few fixed values.
Spool depth and oldest age are computed from the spool at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warden.archive.spool import Spool

UPLOAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ArchiverMetrics:
    def __init__(self, registry: CollectorRegistry, spool: Spool) -> None:
        self.archived = Counter(
            "warden_archiver_records_archived",
            "Records confirmed in the store (new, or found already stored with equal bytes).",
            registry=registry,
        )
        self.spooled = Counter("warden_archiver_records_spooled", "Records signed and spooled.", registry=registry)
        self.spool_depth = Gauge(
            "warden_archiver_spool_depth", "Signed records waiting in the local spool for the store.", registry=registry
        )
        self.spool_depth.set_function(lambda: float(spool.depth()))
        self.oldest_age = Gauge(
            "warden_archiver_spool_oldest_age_seconds",
            "Seconds since the oldest record still in the spool was spooled (0 when empty).",
            registry=registry,
        )
        self.oldest_age.set_function(spool.oldest_age)
        self.store_errors = Counter(
            "warden_archiver_store_errors", "Failed store requests, by kind.", ["kind"], registry=registry
        )
        self.upload_seconds = Histogram(
            "warden_archiver_upload_duration_seconds",
            "Time to store one record (the conditional put, plus the read-back after a 412).",
            buckets=UPLOAD_BUCKETS,
            registry=registry,
        )
        self.conflicts = Counter(
            "warden_archiver_conflicts",
            "Records the store already held with different bytes (violations; set aside, never overwritten).",
            registry=registry,
        )
        self.event_problems = Counter(
            "warden_archiver_event_problems",
            "Problems in reward.snapshot events, by reason (dropped sample, truncated, repaired text, unusable).",
            ["reason"],
            registry=registry,
        )
        self.replayed = Counter(
            "warden_archiver_replayed_steps",
            "Snapshot events replayed after a restart for steps already chained; not archived again.",
            registry=registry,
        )
        self.superseded = Counter(
            "warden_archiver_superseded_snapshots",
            "New snapshot events for steps already chained (a run resumed from an earlier step, or two runs "
            "writing under one run id): not archived, the first record of the step stays.",
            registry=registry,
        )
        self.store_up = Gauge(
            "warden_archiver_store_up", "1 when the last store request succeeded, 0 after a failure.", registry=registry
        )
        self.last_step = Gauge(
            "warden_archiver_last_archived_step", "Step of the newest record confirmed in the store.", registry=registry
        )
        self.object_lock = Gauge(
            "warden_archiver_object_lock_ok",
            "1 when Object Lock is verified on the bucket or not required; 0 when required and missing.",
            registry=registry,
        )
        for kind in ("connect", "timeout", "server_error", "throttled", "access_denied", "checksum", "conflict"):
            self.store_errors.labels(kind)
        for reason in ("dropped_sample", "truncated_text", "repaired_text", "no_samples", "unusable_event"):
            self.event_problems.labels(reason)
