"""Loads an OSV export: a directory of ``*.json`` records or an ``all.zip`` of them.

A corrupt member (bad JSON, not a record) is counted and named in ``errors``, never
fatal; a database where nothing could be read raises :class:`OsvDatabaseError` (exit 3).
The database's time comes from the export's own content only: the newest ``modified``
of its records that is not in the future (file mtimes are not evidence: copying an old
export makes them new, and one future-dated record must not make the rest look fresh).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from sidecars.deps.errors import DepsIncomplete
from sidecars.deps.osv.matcher import RecordError, VulnRecord, matching, parse_record

MAX_MEMBER_BYTES = 16 * 1024 * 1024
FUTURE_SKEW_SECONDS = 3600.0


class OsvDatabaseError(DepsIncomplete):
    """The OSV database is missing or unreadable as a whole."""


def _parse_time(value: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


@dataclass
class OsvDatabase:
    path: str
    records: dict[str, VulnRecord] = field(default_factory=dict)
    by_package: dict[str, list[VulnRecord]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    newest: float = 0.0
    signature: tuple[int, int] = (0, 0)
    modified: list[float] = field(default_factory=list)
    pypi_records: int = 0

    def add(self, rec: VulnRecord) -> None:
        if rec.id in self.records:
            self.errors.append(f"{rec.id}: duplicate record id, the later one is ignored")
            return
        self.records[rec.id] = rec
        for name in {a.package for a in rec.affected}:
            self.by_package.setdefault(name, []).append(rec)
        if rec.affected:
            self.pypi_records += 1
        modified = _parse_time(rec.modified)
        if modified:
            self.modified.append(modified)
            self.newest = max(self.newest, modified)

    def query(self, package: str, version: str) -> tuple[list[VulnRecord], list[str]]:
        """(records affecting it, ids not evaluable); see matcher.matching."""
        from packaging.utils import canonicalize_name

        return matching(self.by_package.get(canonicalize_name(package), []), package, version)

    def age_seconds(self, now: float, skew: float = FUTURE_SKEW_SECONDS) -> float | None:
        """Seconds since the newest ``modified`` that is not after ``now`` (+ clock skew); None if none is."""
        past = [t for t in self.modified if t <= now + skew]
        return max(0.0, now - max(past)) if past else None

    def future_records(self, now: float, skew: float = FUTURE_SKEW_SECONDS) -> int:
        return sum(1 for t in self.modified if t > now + skew)


def _members(path: str) -> Iterator[tuple[str, bytes | None, float, str | None]]:
    """(name, bytes or None, mtime, error) of each JSON member."""
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".json"):
                    full = os.path.join(root, name)
                    try:
                        with open(full, "rb") as fh:
                            yield full, fh.read(MAX_MEMBER_BYTES + 1), os.fstat(fh.fileno()).st_mtime, None
                    except OSError as exc:
                        yield full, None, 0.0, exc.strerror or str(exc)
        return
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.endswith(".json"):
                continue
            when = dt.datetime(*info.date_time).timestamp()
            if info.file_size > MAX_MEMBER_BYTES:
                yield info.filename, None, when, f"member larger than {MAX_MEMBER_BYTES} bytes"
                continue
            try:
                yield info.filename, zf.read(info), when, None
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # bad CRC, truncated member
                yield info.filename, None, when, str(exc)


def load_database(path: str) -> OsvDatabase:
    """Reads every record under ``path``. Raises OsvDatabaseError if ``path`` is unusable."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise OsvDatabaseError(
            f"{path}: OSV database not readable ({exc.strerror}); set vulnerabilities.osv_db"
        ) from None
    db = OsvDatabase(path=path, signature=(st.st_mtime_ns, st.st_size))
    try:
        for name, data, _mtime, error in _members(path):
            if error or data is None:
                db.errors.append(f"{name}: {error}")
                continue
            try:
                db.add(parse_record(json.loads(data)))
            except (ValueError, RecordError) as exc:  # JSONDecodeError is a ValueError
                db.errors.append(f"{name}: {str(exc).splitlines()[0][:200]}")
    except (zipfile.BadZipFile, OSError) as exc:
        raise OsvDatabaseError(f"{path}: not a directory or zip of OSV records ({exc})") from None
    if not db.records and db.errors:
        raise OsvDatabaseError(f"{path}: no readable OSV record ({len(db.errors)} corrupt, e.g. {db.errors[0]})")
    return db
