"""Loads an OSV export: a directory of ``*.json`` records or an ``all.zip`` of them.

A corrupt member (bad JSON, not a record) is counted and named in ``errors``, never
fatal; a database where nothing could be read raises :class:`OsvDatabaseError` (exit 3).
The database's time comes from the export's own content only: the newest ``modified``
of its records that is not in the future (file mtimes are not evidence: copying an old
export makes them new, and one future-dated record must not make the rest look fresh).

Record dates are the exporter's word. The download's own time is kept beside the data by
``warden deps osv-import`` (commands.py): ``<db>.meta.json`` (``META_VERSION``; written atomically
after the data) holds ``downloaded_at`` (the server's ``Date`` header, else the importer's clock),
its source and, for a zip, the export's sha256. The age is taken from the *older* of the two (the
newest non-future record ``modified`` and a non-future ``downloaded_at``): the metadata can only
make an export older, never fresher. Metadata that does not describe the export (another sha256)
or cannot be read is ``meta_error`` (the audit is degraded) and is not used.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from warden.deps.errors import DepsIncomplete
from warden.deps.osv.matcher import RecordError, VulnRecord, matching, parse_record
from warden.safeio import open_regular, read_regular

MAX_MEMBER_BYTES = 16 * 1024 * 1024
FUTURE_SKEW_SECONDS = 3600.0
META_SUFFIX = ".meta.json"
META_VERSION = 1
MAX_META_BYTES = 64 * 1024


class OsvDatabaseError(DepsIncomplete):
    """The OSV database is missing or unreadable as a whole."""


def _parse_time(value: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class OsvMeta:
    """What the importer recorded about a download (see the module doc)."""

    downloaded_at: float
    date_source: str
    source: str
    export_sha256: str | None


def meta_path(path: str) -> str:
    """Where the metadata of the export at ``path`` (a zip or a directory) lives: beside it."""
    return path.rstrip(os.sep) + META_SUFFIX


def build_meta(source: str, downloaded_at: float, date_source: str, export_sha256: str | None) -> bytes:
    """The metadata document (pure)."""
    when = dt.datetime.fromtimestamp(downloaded_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {
        "version": META_VERSION,
        "downloaded_at": when,
        "date_source": date_source,
        "source": source,
        "export_sha256": export_sha256,
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def parse_meta(data: bytes) -> OsvMeta:
    """The metadata in ``data`` (pure). Raises ValueError."""
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("version") != META_VERSION:
        raise ValueError(f"not a version {META_VERSION} OSV metadata document")
    when = _parse_time(str(doc.get("downloaded_at") or ""))
    sha = doc.get("export_sha256")
    if when is None or (sha is not None and not isinstance(sha, str)):
        raise ValueError("downloaded_at or export_sha256 is not valid")
    return OsvMeta(when, str(doc.get("date_source") or ""), str(doc.get("source") or ""), sha)


def file_sha256(path: str) -> str:
    """Hex sha256 of the regular file ``path`` names, read without blocking. Raises OSError."""
    digest = hashlib.sha256()
    with open_regular(os.path.realpath(path)) as fh:  # the configured path may be a link to the export
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_meta(path: str) -> tuple[OsvMeta | None, str | None]:
    """(metadata, why it is not usable) of the export at ``path``; (None, None) when there is none."""
    where = meta_path(path)
    try:
        meta = parse_meta(read_regular(where, MAX_META_BYTES))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{where}: unreadable OSV metadata ({str(exc).splitlines()[0][:200]})"
    if os.path.isfile(path):
        try:
            actual = file_sha256(path)
        except OSError as exc:
            return None, f"{path}: cannot hash the export ({exc.strerror or exc})"
        if meta.export_sha256 != actual:
            return None, f"{where}: describes another export (sha256 {meta.export_sha256}, the export's is {actual})"
    return meta, None


@dataclass
class OsvDatabase:
    path: str
    records: dict[str, VulnRecord] = field(default_factory=dict)
    by_package: dict[str, list[VulnRecord]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    newest: float = 0.0
    signature: tuple[int, ...] = (0, 0)
    modified: list[float] = field(default_factory=list)
    pypi_records: int = 0
    meta: OsvMeta | None = None
    meta_error: str | None = None

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
        """Seconds since the older of the newest ``modified`` that is not after ``now`` (+ clock skew)
        and the download time of the metadata (unless it is after ``now``); None if neither is known."""
        past = [t for t in self.modified if t <= now + skew]
        times = [max(past)] if past else []
        if self.meta is not None and self.meta.downloaded_at <= now + skew:
            times.append(self.meta.downloaded_at)
        return max(0.0, now - min(times)) if times else None

    def meta_in_future(self, now: float, skew: float = FUTURE_SKEW_SECONDS) -> bool:
        return self.meta is not None and self.meta.downloaded_at > now + skew

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
    db = OsvDatabase(path=path, signature=database_signature(path) or (st.st_mtime_ns, st.st_size))
    db.meta, db.meta_error = _read_meta(path)
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


def database_signature(path: str) -> tuple[int, ...] | None:
    """What decides whether a loaded database is still current: the export's and its metadata's stat."""
    out: list[int] = []
    for where in (path, meta_path(path)):
        try:
            st = os.stat(where)
            out.extend((st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            out.extend((0, 0, 0))
        except OSError:
            return None
    return tuple(out)
