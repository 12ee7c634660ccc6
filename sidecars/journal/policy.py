"""Schema of policies/journal.yaml."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JournalPolicy:
    """``stale_after_seconds``: a run with no event for this long is reported stale."""

    stale_after_seconds: float = 600.0
    check_interval_seconds: float = 15.0

    def __post_init__(self) -> None:
        if self.stale_after_seconds <= 0:
            raise ValueError("stale_after_seconds: must be > 0")
        if self.check_interval_seconds <= 0:
            raise ValueError("check_interval_seconds: must be > 0")
