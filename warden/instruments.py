"""The shapes of the metric instruments a library counts with: not prometheus_client itself.

A library under ``warden/`` never imports prometheus_client; it names the instruments it needs
as a protocol built from these (:class:`~warden.signer.instruments.SignerInstruments`,
:class:`~warden.archive.instruments.ArchiveMetrics`). A sidecar's metrics class of
prometheus_client counters, gauges and histograms fits them; a test may pass anything shaped alike.
"""

from __future__ import annotations

from typing import Protocol


class Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *labelvalues: str) -> Counter: ...


class LabelledGauge(Protocol):
    def labels(self, *labelvalues: str) -> Gauge: ...


class LabelledHistogram(Protocol):
    def labels(self, *labelvalues: str) -> Histogram: ...
