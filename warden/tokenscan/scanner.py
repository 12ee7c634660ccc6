"""Scans directories: the entry points, :func:`scan_directory` and :func:`scan_paths`.

:func:`scan_directory` lists and hashes a directory, serves the stored verdict when nothing it
depends on changed (:mod:`.verdict`), else builds a :class:`~.snapshot.Snapshot`
(:mod:`.analysis`: :mod:`.reader`, :mod:`.declared`, :mod:`.exercise`) and runs every check of
:data:`~.checks.CHECKS` over it. It never raises for a problem of the directory itself: an
unreadable root or file makes the result *incomplete* (``errors``), everything else is a
finding. Exit-code semantics live in :meth:`DirectoryScan.outcome` (:mod:`.result`).

Caches, the parse budget and the tokenizer-request pool are a :class:`~.resources.ScanResources`
passed as ``resources``; callers that pass none share the process's default, made on first
use (:func:`~.resources.default_resources`). Importing this module builds none of them.

The names callers use stay importable from here: :class:`DirectoryScan`, :func:`worst_outcome`,
:func:`build_snapshot`, :func:`directory_manifest`, :func:`run_checks`, :func:`verdict_key`, ...
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from warden.tokenscan import analysis
from warden.tokenscan.analysis import build_snapshot, directory_manifest, key_line, open_path, run_checks
from warden.tokenscan.findings import Severity, finding, with_root
from warden.tokenscan.manifest import HashCache
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.resources import ScanResources, default_resources
from warden.tokenscan.result import DirectoryScan, worst_outcome
from warden.tokenscan.review import review_of
from warden.tokenscan.tree import TreeError
from warden.tokenscan.verdict import (
    VERDICT_FORMAT,
    ScanVerdict,
    hashed_as_listed,
    policy_fingerprint,
    reusable,
    stat_keys,
    verdict_key,
)

__all__ = [
    "SCAN_THREADS",
    "VERDICT_FORMAT",
    "DirectoryScan",
    "ScanResources",
    "ScanVerdict",
    "build_snapshot",
    "default_resources",
    "directory_manifest",
    "hashed_as_listed",
    "key_line",
    "open_path",
    "policy_fingerprint",
    "reusable",
    "run_checks",
    "scan_directory",
    "scan_paths",
    "stat_keys",
    "verdict_key",
    "worst_outcome",
]

SCAN_THREADS = 8


def scan_directory(
    path: str,
    policy: TokenscanPolicy,
    with_manifest: bool = True,
    hash_cache: HashCache | None = None,
    resources: ScanResources | None = None,
) -> DirectoryScan:
    """Scans ``path``; never raises for problems of the directory (see the module docstring).
    ``resources``: the caches and pools to use (the process's default when None)."""
    res = resources or default_resources()
    held: list[int] = []
    try:
        return _scan_directory(path, policy, with_manifest, hash_cache, held, res)
    finally:
        res.parse_budget.release(sum(held))


def _scan_directory(
    path: str,
    policy: TokenscanPolicy,
    with_manifest: bool,
    hash_cache: HashCache | None,
    held: list[int],
    res: ScanResources,
) -> DirectoryScan:
    start = time.perf_counter()
    deadline = time.monotonic() + policy.scan_budget_seconds
    root = os.path.abspath(path)
    try:
        snap, files = analysis.listing(root, policy)
        seen: dict[str, tuple[int, ...]] | None = None  # the files' stat_keys before hashing
        now = 0
        if analysis.wants_manifest(snap, policy, with_manifest):
            now, seen = time.time_ns(), stat_keys(files)
            analysis.hash_listing(snap, files, hash_cache)
        key = verdict_key(snap, policy) if hashed_as_listed(snap, seen) else None
        known: ScanVerdict | None = res.scans.peek(key) if key else None
        if known is not None:  # nothing the verdict depends on changed: no read, parse or sandbox
            return known.scan(root, snap.manifest, time.perf_counter() - start)
        snap = analysis.analyse(snap, files, policy, deadline, held, res)
    except TreeError as exc:
        return DirectoryScan(root, errors=[str(exc)], duration_seconds=time.perf_counter() - start)
    except (RecursionError, MemoryError) as exc:  # a defect, but never a traceback for a hostile input
        hit = finding("TS910", ".", f"analysis stopped: {type(exc).__name__}", severity=Severity.HIGH)
        return DirectoryScan(root, with_root([hit], root), duration_seconds=time.perf_counter() - start)
    result = DirectoryScan(root, run_checks(snap, policy), list(snap.errors), manifest=snap.manifest)
    result.token_ids_digest = snap.token_ids_digest
    result.review = review_of(snap)
    result.files = len(snap.facts)
    result.bytes = sum(f.size for f in snap.facts.values())
    if key and seen is not None and reusable(snap, seen, stat_keys(files), now):
        review = json.dumps(result.review, sort_keys=True)
        verdict = ScanVerdict(tuple(result.findings), result.token_ids_digest, result.files, result.bytes, review)
        res.scans.put(key, verdict, verdict.weight())
    result.duration_seconds = time.perf_counter() - start
    return result


def scan_paths(
    paths: Iterable[str],
    policy: TokenscanPolicy,
    with_manifest: bool = True,
    hash_cache: HashCache | None = None,
    resources: ScanResources | None = None,
) -> list[DirectoryScan]:
    """Scans each of ``paths`` (results in order). Up to :data:`SCAN_THREADS` directories are
    scanned at once, so one directory's wait for a sandbox child overlaps the hashing and
    parsing of the next; identical contents are still parsed, loaded and rendered once.
    ``resources``: the caches and pools to use (the process's default when None)."""
    items = list(paths)
    res = resources or default_resources()
    if len(items) < 2:
        return [scan_directory(p, policy, with_manifest, hash_cache, res) for p in items]
    with ThreadPoolExecutor(min(SCAN_THREADS, len(items)), thread_name_prefix="tokenscan-scan") as pool:
        return list(pool.map(lambda p: scan_directory(p, policy, with_manifest, hash_cache, res), items))
