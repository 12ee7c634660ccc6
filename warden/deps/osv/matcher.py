"""OSV records and the matching algorithm (pure).

Implements the OSV schema's evaluation: a version is affected if it is listed in an
``affected[].versions`` list or lies in one of the ``ranges``: after ``BeforeLimits``
(any ``limit`` event above it, ``*`` meaning infinity), the events are walked in version
order, ``introduced`` (``0`` sorts first) switching on and ``fixed`` / after
``last_affected`` switching off. Comparisons use ``packaging.version.Version`` (so
``2.20.0rc1 < 2.20.0`` and ``1.24.1+local > 1.24.1``); a ``SpecifierSet`` would exclude
pre-releases and ignore local labels. GIT ranges cannot be evaluated without the
repository and are skipped. Withdrawn records never match.

A ``versions`` entry matches by PEP 440 equality, and a local build (``1.0+cu124``) also
matches its public release ``1.0`` when the list names no local version: it is built from
that release's code. For the same reason a local build of a ``last_affected`` release
(``3.6+local`` for ``last_affected: 3.6``) is affected, though it sorts after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from warden.deps.osv.cvss import bucket, cvss2_base_score, cvss3_base_score, cvss4_base_score

ECOSYSTEM = "PyPI"
_RANK = {"critical": 4, "high": 3, "medium": 2, "low": 1, "unknown": 0}
_GHSA_WORDS = {"CRITICAL": "critical", "HIGH": "high", "MODERATE": "medium", "MEDIUM": "medium", "LOW": "low"}


class RecordError(ValueError):
    """An OSV record is not usable (not an object, no id, bad affected list)."""


@dataclass(frozen=True)
class Affected:
    package: str  # canonical name
    ranges: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (type, ((event, version), ...))
    versions: tuple[str, ...]


@dataclass(frozen=True)
class VulnRecord:
    id: str
    aliases: tuple[str, ...]
    modified: str
    withdrawn: str | None
    summary: str
    affected: tuple[Affected, ...]
    severity: str
    score: float | None
    vector: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    def fixed_versions(self, package: str) -> list[str]:
        out = [v for a in self.affected if a.package == package for _, ev in a.ranges for k, v in ev if k == "fixed"]
        return sorted(set(out), key=_sort_key)


def _sort_key(v: str) -> tuple[int, Any]:
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


def severity_of(raw: Mapping[str, Any]) -> tuple[str, float | None, str | None]:
    """(bucket, score, vector) from the record's CVSS vectors (v4, v3, v2: the highest score); else the
    database's own word (GHSA ``database_specific.severity``); else ``unknown``."""
    entries = list(raw.get("severity") or [])
    for aff in raw.get("affected") or []:
        if isinstance(aff, dict):
            entries.extend(aff.get("severity") or [])
    scored: list[tuple[float, str]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kind, vector = entry.get("type"), str(entry.get("score") or "")
        try:
            if kind == "CVSS_V4":
                scored.append((cvss4_base_score(vector), vector))
            elif kind == "CVSS_V3":
                scored.append((cvss3_base_score(vector), vector))
            elif kind == "CVSS_V2":
                scored.append((cvss2_base_score(vector), vector))
        except ValueError:
            continue
    if scored:
        score, vector = max(scored)
        return bucket(score), score, vector
    word = str((raw.get("database_specific") or {}).get("severity") or "").upper()
    return _GHSA_WORDS.get(word, "unknown"), None, None


def _affected(raw: Any) -> Affected | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("package"), dict):
        raise RecordError("affected[]: expected an object with a package")
    pkg = raw["package"]
    if pkg.get("ecosystem") != ECOSYSTEM or not isinstance(pkg.get("name"), str):
        return None
    ranges = []
    for rng in raw.get("ranges") or []:
        if not isinstance(rng, dict) or not isinstance(rng.get("events"), list):
            raise RecordError("affected[].ranges[]: expected an object with events")
        events = []
        for ev in rng["events"]:
            if not isinstance(ev, dict) or len(ev) != 1:
                raise RecordError(f"affected[].ranges[].events[]: expected one key, got {ev!r}")
            ((kind, version),) = ev.items()
            events.append((str(kind), str(version)))
        ranges.append((str(rng.get("type")), tuple(events)))
    versions = tuple(str(v) for v in raw.get("versions") or [])
    return Affected(canonicalize_name(pkg["name"]), tuple(ranges), versions)


def parse_record(raw: Any) -> VulnRecord:
    """A VulnRecord of an OSV JSON object (PyPI entries only). Raises RecordError."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise RecordError("not an OSV record (no string id)")
    affected = [a for a in (_affected(x) for x in raw.get("affected") or []) if a is not None]
    sev, score, vector = severity_of(raw)
    return VulnRecord(
        id=raw["id"],
        aliases=tuple(str(a) for a in raw.get("aliases") or [] if a != raw["id"]),
        modified=str(raw.get("modified") or ""),
        withdrawn=str(raw["withdrawn"]) if raw.get("withdrawn") else None,
        summary=str(raw.get("summary") or raw.get("details") or "").strip().split("\n")[0][:200],
        affected=tuple(affected),
        severity=sev,
        score=score,
        vector=vector,
        raw=raw,
    )


def _event_order(event: tuple[str, str]) -> tuple[int, Any, int]:
    kind, version = event
    if kind == "introduced" and version == "0":
        return (0, 0, 0)
    # At one version, "introduced" applies before "fixed"/"last_affected".
    return (1, Version(version), 0 if kind == "introduced" else 1)


def in_range(v: Version, events: Sequence[tuple[str, str]]) -> bool:
    """The schema's per-range evaluation. Raises InvalidVersion for an unparsable event version."""
    limits = [ver for kind, ver in events if kind == "limit"]
    if limits and not any("*" in lim or v < Version(lim) for lim in limits):
        return False
    vulnerable = False
    for kind, version in sorted((e for e in events if e[0] != "limit"), key=_event_order):
        if kind == "introduced" and (version == "0" or v >= Version(version)):
            vulnerable = True
        elif (kind == "fixed" and v >= Version(version)) or (kind == "last_affected" and _past(v, Version(version))):
            vulnerable = False
    return vulnerable


def _past(v: Version, last: Version) -> bool:
    """Whether ``v`` is after ``last_affected``: a local build of the last affected release
    (``1.24.1+cu124`` for ``1.24.1``) is that release rebuilt, so affected too."""
    if v.local and not last.local and Version(v.public) == last:
        return False
    return v > last


def in_versions(v: Version, versions: Iterable[str]) -> bool:
    for listed in versions:
        try:
            lv = Version(listed)
        except InvalidVersion:
            continue
        if v == lv or (v.local and not lv.local and Version(v.public) == lv):
            return True
    return False


def is_affected(version: str, affected: Affected) -> bool:
    """Whether ``version`` of ``affected.package`` is affected. Raises InvalidVersion for a
    version we cannot order (the caller reports it as not evaluable)."""
    v = Version(version)
    if in_versions(v, affected.versions):
        return True
    return any(kind in ("ECOSYSTEM", "SEMVER") and in_range(v, events) for kind, events in affected.ranges)


def matching(records: Iterable[VulnRecord], package: str, version: str) -> tuple[list[VulnRecord], list[str]]:
    """(records affecting ``package`` at ``version``, ids whose ranges could not be evaluated)."""
    name = canonicalize_name(package)
    hits, errors = [], []
    for rec in records:
        if rec.withdrawn:
            continue
        try:
            if any(a.package == name and is_affected(version, a) for a in rec.affected):
                hits.append(rec)
        except InvalidVersion:
            errors.append(rec.id)
    return hits, errors


def group_aliases(records: Sequence[VulnRecord]) -> list[list[VulnRecord]]:
    """Records that share an id or alias, transitively, grouped (the same vulnerability)."""
    parent = list(range(len(records)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, rec in enumerate(records):
        for ident in (rec.id, *rec.aliases):
            if ident in owner:
                parent[find(i)] = find(owner[ident])
            else:
                owner[ident] = i
    groups: dict[int, list[VulnRecord]] = {}
    for i, rec in enumerate(records):
        groups.setdefault(find(i), []).append(rec)
    return list(groups.values())


def representative(group: Sequence[VulnRecord]) -> VulnRecord:
    """The record that names a group: the most severe, then PYSEC before GHSA before others, then by id."""
    prefix_rank = {"PYSEC": 0, "GHSA": 1}
    return min(group, key=lambda r: (-_RANK[r.severity], prefix_rank.get(r.id.split("-")[0], 2), r.id))


def rank(severity: str) -> int:
    return _RANK.get(severity, 0)
