"""What the archive library needs of the sidecar's metrics: shapes, not prometheus_client itself.

The ``archiver`` sidecar's :class:`~sidecars.archiver.metrics.ArchiverMetrics` (prometheus_client
counters, gauges and a histogram) has exactly these attributes; a test may pass anything shaped alike.
The instruments' own shapes are :mod:`warden.instruments`.
"""

from __future__ import annotations

from typing import Protocol

from warden.instruments import Counter, Gauge, Histogram, LabelledCounter


class UploadMetrics(Protocol):
    """What :class:`~warden.archive.uploader.Uploader` counts and sets."""

    @property
    def archived(self) -> Counter: ...
    @property
    def upload_seconds(self) -> Histogram: ...
    @property
    def conflicts(self) -> Counter: ...
    @property
    def store_errors(self) -> LabelledCounter: ...
    @property
    def store_up(self) -> Gauge: ...
    @property
    def last_step(self) -> Gauge: ...
    @property
    def object_lock(self) -> Gauge: ...


class ArchiveMetrics(UploadMetrics, Protocol):
    """What :class:`~warden.archive.service.Archive` counts besides the uploads."""

    @property
    def spooled(self) -> Counter: ...
    @property
    def replayed(self) -> Counter: ...
    @property
    def superseded(self) -> Counter: ...
    @property
    def event_problems(self) -> LabelledCounter: ...
