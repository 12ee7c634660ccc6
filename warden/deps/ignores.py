"""The policy's ignore list (pure): each entry has an id, a reason and an expiry date.

An entry suppresses a vulnerability finding whose id or any alias equals its ``id`` (and,
if the entry names a ``package``, only for that package) until the end of its
``expires`` day (UTC). An expired entry suppresses nothing and is reported, so an
exception granted for a month cannot silently become permanent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from warden.deps.model import Finding


@dataclass(frozen=True)
class IgnoreRule:
    """``expires``: a date (YAML ``2026-12-31``) or an ISO date string; required, like ``reason``."""

    id: str
    reason: str
    expires: Any
    package: str | None = None

    def __post_init__(self) -> None:
        if not self.id.strip():
            raise ValueError("id: must not be empty")
        if not self.reason.strip():
            raise ValueError(f"reason: say why {self.id} is ignored")
        object.__setattr__(self, "expires", parse_expiry(self.expires, self.id))

    def active(self, today: dt.date) -> bool:
        return bool(today <= self.expires)


def parse_expiry(value: Any, ident: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expires: {ident}: expected a date like 2026-12-31, got {value!r}")


def _matches(rule: IgnoreRule, finding: Finding) -> bool:
    ids = set(finding.details.get("ids") or [finding.details.get("id")])
    if rule.id not in ids:
        return False
    return rule.package is None or canonicalize_name(rule.package) == finding.subject


def apply_ignores(
    findings: Sequence[Finding], rules: Sequence[IgnoreRule], today: dt.date
) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """(kept findings, suppressed findings, warnings about expired entries that matched or exist)."""
    kept, suppressed = [], []
    for f in findings:
        rule = next((r for r in rules if f.check == "vulns" and r.active(today) and _matches(r, f)), None)
        if rule is None:
            kept.append(f)
        else:
            suppressed.append(
                Finding(f.check, f.kind, f.subject, f.message, False, {**f.details, "ignored_by": rule.id})
            )
    warnings = []
    for r in rules:
        if not r.active(today):
            hit = any(_matches(r, f) for f in findings)
            message = f"ignore entry {r.id} expired on {r.expires.isoformat()}" + (
                " and no longer suppresses a finding" if hit else ""
            )
            warnings.append(Finding("vulns", "ignore_expired", r.id, message, False, {"reason": r.reason}))
    return kept, suppressed, warnings
