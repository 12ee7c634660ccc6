"""The result of scanning one directory, and the exit code of several."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from warden.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_VIOLATION
from warden.tokenscan.findings import Finding, Severity
from warden.tokenscan.manifest import Manifest


@dataclass
class DirectoryScan:
    """The result for one directory. ``errors`` non-empty means the scan is incomplete."""

    root: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    duration_seconds: float = 0.0
    manifest: Manifest | None = None
    token_ids_digest: str | None = None
    review: dict[str, Any] | None = None  # what a person reviews before approving (:mod:`.review`)

    def blocking(self, fail_on: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity >= fail_on]

    def outcome(self, fail_on: Severity) -> int:
        """1 when a finding is at or above ``fail_on``, else 3 when incomplete, else 0."""
        if self.blocking(fail_on):
            return EXIT_VIOLATION
        return EXIT_INCOMPLETE if self.errors else EXIT_OK

    def to_dict(self, fail_on: Severity) -> dict[str, Any]:
        return {
            "path": self.root,
            "outcome": {0: "clean", 1: "violation", 3: "incomplete"}[self.outcome(fail_on)],
            "findings": [f.to_dict() for f in self.findings],
            "errors": list(self.errors),
            "files": self.files,
            "bytes": self.bytes,
            "duration_seconds": round(self.duration_seconds, 6),
            "manifest_digest": self.manifest.digest if self.manifest else None,
            "token_ids_digest": self.token_ids_digest,
            **({"review": self.review} if self.review is not None else {}),
        }


def worst_outcome(scans: Iterable[DirectoryScan], fail_on: Severity) -> int:
    """1 if any scan found a violation, else 3 if any was incomplete, else 0."""
    codes = {s.outcome(fail_on) for s in scans}
    return EXIT_VIOLATION if EXIT_VIOLATION in codes else (EXIT_INCOMPLETE if EXIT_INCOMPLETE in codes else EXIT_OK)
