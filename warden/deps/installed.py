"""Installed distributions of a target, read from ``*.dist-info`` (and legacy ``*.egg-info``).

Nothing is imported: METADATA headers and RECORD rows are parsed as text. A broken
distribution (unreadable METADATA, no Name/Version) is returned with ``problem`` set,
never raised, so one broken package cannot stop an audit.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

from packaging.utils import canonicalize_name

from warden.deps.walk import read_small


class RecordEntry(NamedTuple):
    """One RECORD row. ``path`` is as written (relative to site-packages, may start ``../``);
    ``digest`` is ``algo=urlsafe-b64`` or None; ``size`` None when absent. (A tuple: an
    environment has ~50k rows, parsed at every audit.)"""

    path: str
    digest: str | None
    size: int | None


class LazyRecord(Sequence[RecordEntry]):
    """RECORD rows parsed on first use. Only for a RECORD whose exact bytes (its sha256) parsed
    before (the integrity cache knows it), so parsing cannot fail here; an incremental audit whose
    files are all unchanged never needs the rows (records.py compares whole distributions)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._rows: tuple[RecordEntry, ...] | None = None

    def _parsed(self) -> tuple[RecordEntry, ...]:
        if self._rows is None:
            self._rows = parse_record(self._data)
        return self._rows

    def __len__(self) -> int:
        return len(self._parsed())

    @overload
    def __getitem__(self, index: int) -> RecordEntry: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[RecordEntry]: ...
    def __getitem__(self, index: int | slice) -> RecordEntry | Sequence[RecordEntry]:
        return self._parsed()[index]

    def __iter__(self) -> Iterator[RecordEntry]:
        return iter(self._parsed())


@dataclass(frozen=True)
class InstalledDist:
    name: str
    canonical: str
    version: str
    meta_dir: str
    site_packages: str
    record: Sequence[RecordEntry] | None
    record_sha256: str | None
    installer: str | None = None
    problem: str | None = None
    direct_url: str | None = None
    archive_hashes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Stable identity for baselines and caches: ``name==version@meta_dir_basename``."""
        return f"{self.canonical}=={self.version}@{os.path.basename(self.meta_dir)}"


def _read_text(path: str, limit: int = 16 * 1024 * 1024) -> str:
    """Never follows a link or blocks on a FIFO planted as METADATA/RECORD (walk.read_small)."""
    return read_small(path, limit).decode("utf-8", errors="replace")


def header_values(text: str, wanted: tuple[str, ...]) -> dict[str, str]:
    """The first value of each ``wanted`` header (lower-case names) of an RFC 822 header block, as
    ``email.parser.HeaderParser`` gives it for METADATA (continuation lines joined), without its
    cost (pure). Headers end at the first empty line."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line:
            break
        if line[0] in " \t":
            if current is not None:
                out[current] += "\n" + line
            continue
        name, sep, value = line.partition(":")
        key = name.strip().lower()
        current = key if sep and key in wanted and key not in out else None
        if current is not None:
            out[current] = value.lstrip(" \t")
    return out


def _metadata(meta_dir: str, filename: str) -> tuple[str, str]:
    """(Name, Version) from the METADATA/PKG-INFO headers. Raises ValueError."""
    text = _read_text(os.path.join(meta_dir, filename), limit=1024 * 1024)
    headers = header_values(text, ("name", "version"))
    name, version = headers.get("name"), headers.get("version")
    if not name or not version:
        raise ValueError(f"{filename} has no Name or Version header")
    return str(name).strip(), str(version).strip()


def _plain_rows(text: str) -> list[RecordEntry] | None:
    """The rows of a RECORD without quotes or carriage returns, split as csv.reader splits them
    (every comma separates, every newline ends a row), at a fraction of its cost; None when the
    text needs the csv module. Raises ValueError for a size that is not an integer."""
    if '"' in text or "\r" in text or "\0" in text:
        return None
    rows = []
    limit = csv.field_size_limit()
    for line in text.split("\n"):
        if not line or line[0] == ",":
            continue
        if len(line) > limit:
            return None  # csv.reader refuses an over-long field; let it say so
        fields = line.split(",")
        n = len(fields)
        digest = fields[1] if n > 1 and fields[1] else None
        size = int(fields[2]) if n > 2 and fields[2] else None
        rows.append(RecordEntry(fields[0], digest, size))
    return rows


def parse_record(data: bytes) -> tuple[RecordEntry, ...]:
    """RECORD rows as entries. Raises ValueError on malformed CSV."""
    try:
        plain = _plain_rows(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"RECORD is not valid CSV: {exc}") from None
    if plain is not None:
        return tuple(plain)
    rows = []
    try:
        for row in csv.reader(io.StringIO(data.decode("utf-8"))):
            if not row or not row[0]:
                continue
            digest = row[1] if len(row) > 1 and row[1] else None
            size = int(row[2]) if len(row) > 2 and row[2] else None
            rows.append(RecordEntry(row[0], digest, size))
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"RECORD is not valid CSV: {exc}") from None
    return tuple(rows)


def parse_direct_url(data: bytes) -> tuple[str | None, tuple[str, ...]]:
    """(url, ``algo:hex`` archive hashes) of a PEP 610 ``direct_url.json`` (pure; bad JSON gives (None, ()))."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None, ()
    if not isinstance(doc, dict):
        return None, ()
    raw_info = doc.get("archive_info")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    hashes = {f"{k}:{v}" for k, v in (info.get("hashes") or {}).items() if isinstance(v, str)}
    legacy = info.get("hash")
    if isinstance(legacy, str) and "=" in legacy:
        algo, _, value = legacy.partition("=")
        hashes.add(f"{algo}:{value}")
    url = doc.get("url")
    return (url if isinstance(url, str) else None), tuple(sorted(hashes))


def _direct_url(meta_dir: str) -> tuple[str | None, tuple[str, ...]]:
    try:
        return parse_direct_url(read_small(os.path.join(meta_dir, "direct_url.json"), 1024 * 1024))
    except OSError:
        return None, ()


def _dist_info(site_packages: str, name: str, known: Container[str]) -> InstalledDist:
    meta_dir = os.path.join(site_packages, name)
    stem = name[: -len(".dist-info")]
    fallback_name, _, fallback_version = stem.partition("-")
    record: Sequence[RecordEntry] | None = None
    record_sha = installer = problem = None
    try:
        dist_name, version = _metadata(meta_dir, "METADATA")
    except (OSError, ValueError) as exc:
        dist_name, version = fallback_name, fallback_version or "?"
        problem = f"{meta_dir}: unreadable METADATA ({exc})"
    try:
        data = read_small(os.path.join(meta_dir, "RECORD"))
        record_sha = hashlib.sha256(data).hexdigest()
        record = LazyRecord(data) if record_sha in known else parse_record(data)
    except FileNotFoundError:
        problem = problem or f"{meta_dir}: no RECORD, so its files cannot be verified"
    except (OSError, ValueError) as exc:
        problem = problem or f"{meta_dir}/RECORD: {exc}"
    with contextlib.suppress(OSError):
        installer = _read_text(os.path.join(meta_dir, "INSTALLER"), 256).strip() or None
    url, hashes = _direct_url(meta_dir)
    return InstalledDist(
        dist_name,
        canonicalize_name(dist_name),
        version,
        meta_dir,
        site_packages,
        record,
        record_sha,
        installer,
        problem,
        url,
        hashes,
    )


def _egg_info(site_packages: str, name: str) -> InstalledDist:
    """A legacy egg-info: its files come from ``installed-files.txt`` (no hashes)."""
    meta_dir = os.path.join(site_packages, name)
    problem = f"{meta_dir}: legacy egg-info without RECORD hashes, files cannot be verified"
    try:
        pkg_info = "PKG-INFO" if os.path.isdir(meta_dir) else ""
        if pkg_info:
            dist_name, version = _metadata(meta_dir, pkg_info)
        else:
            dist_name, version = _metadata(site_packages, name)
    except (OSError, ValueError) as exc:
        dist_name, version = name.split("-", 1)[0], "?"
        problem = f"{meta_dir}: unreadable PKG-INFO ({exc})"
    entries: list[RecordEntry] = []
    try:
        listing = _read_text(os.path.join(meta_dir, "installed-files.txt"))
        rel = os.path.relpath(meta_dir, site_packages)
        entries = [RecordEntry(os.path.normpath(os.path.join(rel, line)), None, None) for line in listing.splitlines()]
        entries.extend(RecordEntry(os.path.join(rel, f), None, None) for f in os.listdir(meta_dir))
    except OSError:
        pass
    return InstalledDist(
        dist_name, canonicalize_name(dist_name), version, meta_dir, site_packages, tuple(entries), None, None, problem
    )


def scan_distributions(site_packages: str, known_records: Container[str] = frozenset()) -> list[InstalledDist]:
    """Every distribution whose metadata lies directly in ``site_packages``, sorted by name.
    ``known_records``: sha256 digests of RECORD files that parsed before (parsed only when used)."""
    try:
        names = sorted(os.listdir(site_packages))
    except OSError:
        return []
    dists = []
    for name in names:
        if name.endswith(".dist-info") and os.path.isdir(os.path.join(site_packages, name)):
            dists.append(_dist_info(site_packages, name, known_records))
        elif name.endswith(".egg-info"):
            dists.append(_egg_info(site_packages, name))
    return sorted(dists, key=lambda d: (d.canonical, d.version))
