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
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any

from packaging.utils import canonicalize_name

from sidecars.deps.walk import read_small


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row. ``path`` is as written (relative to site-packages, may start ``../``);
    ``digest`` is ``algo=urlsafe-b64`` or None; ``size`` None when absent."""

    path: str
    digest: str | None
    size: int | None


@dataclass(frozen=True)
class InstalledDist:
    name: str
    canonical: str
    version: str
    meta_dir: str
    site_packages: str
    record: tuple[RecordEntry, ...] | None
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


def _metadata(meta_dir: str, filename: str) -> tuple[str, str]:
    """(Name, Version) from the METADATA/PKG-INFO headers. Raises ValueError."""
    text = _read_text(os.path.join(meta_dir, filename), limit=1024 * 1024)
    headers = HeaderParser().parsestr(text.split("\n\n", 1)[0] + "\n\n")
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise ValueError(f"{filename} has no Name or Version header")
    return str(name).strip(), str(version).strip()


def parse_record(data: bytes) -> tuple[RecordEntry, ...]:
    """RECORD rows as entries. Raises ValueError on malformed CSV."""
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


def _dist_info(site_packages: str, name: str) -> InstalledDist:
    meta_dir = os.path.join(site_packages, name)
    stem = name[: -len(".dist-info")]
    fallback_name, _, fallback_version = stem.partition("-")
    record: tuple[RecordEntry, ...] | None = None
    record_sha = installer = problem = None
    try:
        dist_name, version = _metadata(meta_dir, "METADATA")
    except (OSError, ValueError) as exc:
        dist_name, version = fallback_name, fallback_version or "?"
        problem = f"{meta_dir}: unreadable METADATA ({exc})"
    try:
        data = read_small(os.path.join(meta_dir, "RECORD"))
        record_sha = hashlib.sha256(data).hexdigest()
        record = parse_record(data)
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


def scan_distributions(site_packages: str) -> list[InstalledDist]:
    """Every distribution whose metadata lies directly in ``site_packages``, sorted by name."""
    try:
        names = sorted(os.listdir(site_packages))
    except OSError:
        return []
    dists = []
    for name in names:
        if name.endswith(".dist-info") and os.path.isdir(os.path.join(site_packages, name)):
            dists.append(_dist_info(site_packages, name))
        elif name.endswith(".egg-info"):
            dists.append(_egg_info(site_packages, name))
    return sorted(dists, key=lambda d: (d.canonical, d.version))
