"""The bridge's Prometheus metrics, and verl's own metrics under mapped names.

Bridge health: ``warden_bridge_*`` (labels bounded: event type, source, error kind).
verl's latest value of each numeric metric: ``warden_verl_<name>`` gauges, ``<name>``
from :func:`warden.metric_names.prometheus_name` (``actor/pg_loss`` ->
``warden_verl_actor_pg_loss``); at most :data:`MAX_VERL_METRICS` distinct names.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, RUN_RESUMED, RUN_STARTED, STEP_COMPLETED

VERL_PREFIX = "warden_verl_"
MAX_VERL_METRICS = 2000


class VerlCollector(Collector):
    """Serves the latest verl metric values; updated by the bridge, read by scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[str, float]] = {}
        self.dropped = 0

    def update(self, mapped: Mapping[str, float], originals: Mapping[str, str]) -> None:
        """Records ``mapped`` name -> value; ``originals`` maps mapped names back for the help text."""
        with self._lock:
            for name, value in mapped.items():
                if name not in self._values and len(self._values) >= MAX_VERL_METRICS:
                    self.dropped += 1
                    continue
                self._values[name] = (originals.get(name, name), value)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            items = sorted(self._values.items())
        for name, (original, value) in items:
            yield GaugeMetricFamily(VERL_PREFIX + name, f"verl metric {original} (latest logged value)", value=value)


class BridgeMetrics:
    """``warden_bridge_*`` families and the verl collector, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge("warden_bridge_up", "1 while the bridge runs.", registry=registry)
        self.emitted = Counter(
            "warden_bridge_events_emitted", "Events written to the journal.", ["type"], registry=registry
        )
        self.restarts = Counter(
            "warden_bridge_log_restarts", "Times verl's file logger was found truncated or replaced.", registry=registry
        )
        self.skipped = Counter(
            "warden_bridge_skipped_lines",
            "Input lines or events that could not be used, by source (log, rollout, event).",
            ["source"],
            registry=registry,
        )
        self.pending = Gauge(
            "warden_bridge_pending_items",
            "Rollout dumps or checkpoints not complete yet.",
            ["source"],
            registry=registry,
        )
        self.last_step = Gauge("warden_bridge_last_step", "Highest step read from verl's log.", registry=registry)
        self.last_pass = Gauge(
            "warden_bridge_last_pass_timestamp_seconds", "Unix time of the last completed pass.", registry=registry
        )
        self.errors = Counter("warden_bridge_errors", "Failures by kind.", ["kind"], registry=registry)
        self.verl = VerlCollector()
        registry.register(self.verl)
        for source in ("rollout", "checkpoint"):
            self.pending.labels(source).set(0)
        for source in ("log", "rollout", "event"):
            self.skipped.labels(source)
        # At 0 from the start: a type's series first seen at 1 has increase() 0 until the next
        # event, so WardenVerlCheckpointOverdue fired for an hour after a run's first checkpoint.
        for etype in (RUN_STARTED, RUN_RESUMED, STEP_COMPLETED, REWARD_SNAPSHOT, CHECKPOINT_SAVED):
            self.emitted.labels(etype)
        self.up.set(1)
