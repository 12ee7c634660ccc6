"""Findings: the one shape every check reports in (pure data, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("critical", "high", "medium", "low", "unknown")
CHECKS = ("lock", "drift", "integrity", "vulns")


@dataclass(frozen=True)
class Finding:
    """One thing an audit found.

    ``check`` is one of CHECKS, ``kind`` a short snake_case word (a bounded metric label),
    ``subject`` the package or file it is about. ``blocking`` findings are policy
    violations (exit 1); the others are reported as warnings.
    """

    check: str
    kind: str
    subject: str
    message: str
    blocking: bool = True
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "kind": self.kind,
            "subject": self.subject,
            "message": self.message,
            "blocking": self.blocking,
            "details": dict(self.details),
        }


def count_by_kind(findings: list[Finding], check: str) -> dict[str, int]:
    """Blocking and non-blocking findings of ``check``, counted per kind."""
    out: dict[str, int] = {}
    for f in findings:
        if f.check == check:
            out[f.kind] = out.get(f.kind, 0) + 1
    return out
