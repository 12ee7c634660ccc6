"""Schema of policies/archiver.yaml (field reference: the comments in that file).

Two environment variables override the file, so one policy serves several machines:
``WARDEN_STORE`` replaces ``store`` (the same variable ``warden audit --store`` reads) and
``$VARS`` / ``~`` in ``signing_key`` are expanded (default ``$WARDEN_SIGNING_KEY``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from warden.lease import LeaseSettings

RETENTION_MODES = ("none", "GOVERNANCE", "COMPLIANCE")
ADDRESSING_STYLES = ("auto", "path", "virtual")
STORE_ENV = "WARDEN_STORE"


@dataclass(frozen=True)
class RetentionPolicy:
    """Object Lock retention put on every record.

    ``mode`` none, GOVERNANCE or COMPLIANCE; ``days`` how long each record version is
    locked; ``require_object_lock`` refuses to start on a bucket without Object Lock even
    when ``mode`` is none (e.g. a bucket whose default retention does the locking).
    """

    mode: str = "none"
    days: int = 0
    require_object_lock: bool = False

    def __post_init__(self) -> None:
        if self.mode not in RETENTION_MODES:
            raise ValueError(f"mode: must be one of {', '.join(RETENTION_MODES)}, got {self.mode!r}")
        if self.mode != "none" and self.days < 1:
            raise ValueError("days: must be >= 1 when a retention mode is set")
        if self.days < 0:
            raise ValueError("days: must be >= 0")

    @property
    def needs_object_lock(self) -> bool:
        return self.require_object_lock or self.mode != "none"


@dataclass(frozen=True)
class BackoffPolicy:
    """Retry delays after a store failure: ``initial_seconds`` doubling up to ``max_seconds``, with jitter."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.initial_seconds <= 0 or self.max_seconds < self.initial_seconds:
            raise ValueError("initial_seconds: must be > 0 and <= max_seconds")


@dataclass(frozen=True)
class ArchiverPolicy:
    """What the archiver keeps and where; see policies/archiver.yaml."""

    store: str = "s3://warden-archive"
    addressing_style: str = "auto"
    signing_key: str = "$WARDEN_SIGNING_KEY"
    top_k: int = 4
    min_reward: float | None = None
    max_text_bytes: int = 16384
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    upload_concurrency: int = 8
    request_timeout_seconds: float = 10.0
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    check_interval_seconds: float = 5.0
    lease: LeaseSettings = field(
        default_factory=lambda: LeaseSettings(duration_seconds=30.0, renew_seconds=5.0, act_margin_seconds=10.0)
    )
    """One archiver per run across nodes (warden/lease.py; docs/deploy.md "Multi-node"); the act margin
    covers one request_timeout_seconds."""

    def __post_init__(self) -> None:
        if self.lease.enabled and self.lease.act_margin_seconds < self.request_timeout_seconds:
            raise ValueError(
                "lease.act_margin_seconds: must be >= request_timeout_seconds when the lease is enabled "
                "(a put in flight must end before the lease can pass to another node)"
            )
        if self.addressing_style not in ADDRESSING_STYLES:
            raise ValueError(f"addressing_style: must be one of {', '.join(ADDRESSING_STYLES)}")
        if not 1 <= self.top_k <= 1000:
            raise ValueError("top_k: must be between 1 and 1000")
        if self.max_text_bytes < 64:
            raise ValueError("max_text_bytes: must be >= 64")
        if not 1 <= self.upload_concurrency <= 128:
            raise ValueError("upload_concurrency: must be between 1 and 128")
        if self.request_timeout_seconds <= 0 or self.check_interval_seconds <= 0:
            raise ValueError("request_timeout_seconds: and check_interval_seconds must be > 0")

    def store_url(self) -> str:
        """``$WARDEN_STORE`` when set, else ``store``."""
        return os.environ.get(STORE_ENV) or self.store

    def signing_key_path(self) -> str | None:
        """``signing_key`` with ``~`` and ``$VARS`` expanded; None when it stays unresolved."""
        path = os.path.expanduser(os.path.expandvars(self.signing_key))
        return None if not path or "$" in path else path
