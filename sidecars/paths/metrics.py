"""The ``warden_path_*`` metric families, labelled ``path`` = the policy's name for it.

Values are set from :class:`~warden.paths.scheduler.PathState` objects only, so a
scrape renders memory and never waits for a probe. Label values are bounded: path names
come from the policy, reasons from the fixed set :data:`warden.paths.probe.REASONS`,
mount labels from the mount table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from warden.paths.probe import REASONS
from warden.paths.scheduler import PathState

PROBE_RESULTS = ("ok", "failed", "stuck", "incomplete")


class PathMetrics:
    """Registers the families for ``names`` and updates them from states."""

    def __init__(self, registry: CollectorRegistry, names: Sequence[str]) -> None:
        p = ["path"]
        self.up = Gauge(
            "warden_path_up", "1 when the last probe of the path met every expectation.", p, registry=registry
        )
        self.stuck = Gauge(
            "warden_path_stuck",
            "1 while a probe of the path is past its deadline without an answer.",
            p,
            registry=registry,
        )
        self.duration = Gauge(
            "warden_path_probe_duration_seconds",
            "Duration of the last finished probe; while stuck, the age of the hung probe.",
            p,
            registry=registry,
        )
        self.free_bytes = Gauge(
            "warden_path_free_bytes", "Bytes available to unprivileged users (statvfs f_bavail).", p, registry=registry
        )
        self.size_bytes = Gauge(
            "warden_path_size_bytes", "Size of the filesystem holding the path.", p, registry=registry
        )
        self.free_inodes = Gauge(
            "warden_path_free_inodes",
            "Inodes available (statvfs f_favail; absent if not reported).",
            p,
            registry=registry,
        )
        self.inodes = Gauge("warden_path_inodes", "Inodes of the filesystem (statvfs f_files).", p, registry=registry)
        self.read_only = Gauge(
            "warden_path_read_only", "1 when the path's mount is read-only (ST_RDONLY or ro).", p, registry=registry
        )
        self.failure = Gauge(
            "warden_path_failure",
            "1 for the reason the path is unhealthy now, 0 for the other reasons.",
            [*p, "reason"],
            registry=registry,
        )
        self.last_success = Gauge(
            "warden_path_last_success_timestamp_seconds",
            "Unix time of the last probe that met every expectation.",
            p,
            registry=registry,
        )
        self.probes = Counter(
            "warden_path_probes",
            "Probe verdicts by result (ok, failed, stuck, incomplete).",
            [*p, "result"],
            registry=registry,
        )
        self.processes = Gauge(
            "warden_path_probe_processes",
            "Probe processes of the path not yet reaped (at most 1, hung ones included).",
            p,
            registry=registry,
        )
        self.mount_info = Gauge(
            "warden_path_mount_info",
            "1, labelled with the mount that holds the path.",
            [*p, "fstype", "mount_point"],
            registry=registry,
        )
        self._mount_labels: dict[str, tuple[str, str]] = {}
        for name in names:
            for gauge in (self.up, self.stuck, self.read_only, self.processes):
                gauge.labels(name).set(0)
            for reason in REASONS:
                self.failure.labels(name, reason).set(0)
            for result in PROBE_RESULTS:
                self.probes.labels(name, result)

    def update(self, st: PathState) -> None:
        """Publishes a new verdict."""
        name = st.name
        self.up.labels(name).set(1 if st.healthy else 0)
        self.stuck.labels(name).set(1 if st.stuck else 0)
        for reason in REASONS:
            self.failure.labels(name, reason).set(1 if st.reason == reason else 0)
        if st.duration_seconds is not None:
            self.duration.labels(name).set(st.duration_seconds)
        for gauge, value in (
            (self.free_bytes, st.free_bytes),
            (self.size_bytes, st.total_bytes),
            (self.free_inodes, st.free_inodes),
            (self.inodes, st.total_inodes),
        ):
            if value is not None and not st.stuck:
                gauge.labels(name).set(value)
        if st.read_only is not None:
            self.read_only.labels(name).set(1 if st.read_only else 0)
        if st.last_success is not None:
            self.last_success.labels(name).set(st.last_success)
        result = "incomplete" if st.incomplete else "stuck" if st.stuck else "ok" if st.healthy else "failed"
        self.probes.labels(name, result).inc()
        self._set_mount(st)

    def _set_mount(self, st: PathState) -> None:
        if st.mount is None:
            return
        labels = (st.mount.fstype, st.mount.mount_point)
        old = self._mount_labels.get(st.name)
        if old == labels:
            return
        if old is not None:
            self.mount_info.remove(st.name, *old)
        self.mount_info.labels(st.name, *labels).set(1)
        self._mount_labels[st.name] = labels

    def tick(self, states: Mapping[str, PathState], live: Mapping[str, int]) -> None:
        """Refreshes the values that move between verdicts: process counts, a stuck probe's age."""
        for name, count in live.items():
            self.processes.labels(name).set(count)
        for name, st in states.items():
            if st.stuck and st.duration_seconds is not None:
                self.duration.labels(name).set(st.duration_seconds)
