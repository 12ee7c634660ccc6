"""Installed-file integrity: RECORD re-hash, unowned files, ``.pth`` allow-list, ``.pyc`` check.

Parallel (a thread pool hashes; ``hashlib`` releases the GIL) and incremental (a file
whose stat identity is unchanged keeps its cached digest or verdict, see cache.py), with a
full pass when the caller asks (the policy's ``full_pass_interval_seconds``).
``.pyc`` files are verified in worker processes (pyccheck.py says why).
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sidecars.deps import pyccheck
from sidecars.deps.cache import IntegrityCache, stat_key
from sidecars.deps.environment import Target, auditor_magic
from sidecars.deps.installed import InstalledDist
from sidecars.deps.model import Finding
from sidecars.deps.pyccheck import MISMATCH, OK

INTEGRITY_KINDS = ("tampered", "missing_file", "unowned", "pth_not_allowed", "pyc_mismatch", "no_record")
CHUNK = 64  # at least this many .pyc files per worker process
PYC_TIMEOUT = 1800.0
_PYC_NAME = re.compile(r"^(?P<stem>[^.]+)\.(?P<tag>[a-z]+-\d+)(?:\.opt-\d)?\.pyc$")


@dataclass(frozen=True)
class PthRule:
    """A ``.pth`` file allowed at start-up: a name glob, optionally pinned to a sha256 of its content."""

    name: str
    sha256: str | None = None


@dataclass(frozen=True)
class IntegrityOptions:
    pth_allow: tuple[PthRule, ...] = (PthRule("distutils-precedence.pth"),)
    unowned_allow: tuple[str, ...] = ()
    check_pyc: bool = True
    workers: int = 0
    full_pass: bool = False


@dataclass
class IntegrityStats:
    files_walked: int = 0
    files_listed: int = 0
    files_hashed: int = 0
    files_cached: int = 0
    bytes_hashed: int = 0
    outside_missing: int = 0
    pyc_checked: int = 0
    pyc_cached: int = 0
    pyc_stale: int = 0
    pyc_not_verifiable: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def walk_files(root: str) -> dict[str, os.stat_result]:
    """Every non-directory under ``root`` (symlinked directories are not followed), with its lstat."""
    out: dict[str, os.stat_result] = {}
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    out[entry.path] = entry.stat(follow_symlinks=False)
            except OSError:
                continue
    return out


def record_digest(path: str, algo: str) -> str:
    """``algo=urlsafe-b64-nopad`` of the file, as RECORD writes it. Raises OSError."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, algo).digest()
    return f"{algo}=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _workers(requested: int) -> int:
    return requested if requested > 0 else max(2, min(8, (os.cpu_count() or 2)))


@dataclass(frozen=True)
class _HashJob:
    path: str
    expected: str
    algo: str
    owner: InstalledDist
    st: os.stat_result


def _record_jobs(
    dists: Sequence[InstalledDist], walked: dict[str, os.stat_result], stats: IntegrityStats
) -> tuple[list[_HashJob], list[Finding], set[str]]:
    """Hash jobs for RECORD rows with a digest, findings needing no hashing, and the owned paths."""
    jobs: list[_HashJob] = []
    findings: list[Finding] = []
    owned: set[str] = set()
    for dist in dists:
        if dist.record is None:
            owned.update(p for p in walked if p.startswith(dist.meta_dir + os.sep))
            legacy = dist.meta_dir.endswith(".egg-info")
            message = dist.problem or f"{dist.meta_dir}: no RECORD"
            findings.append(Finding("integrity", "no_record", dist.canonical, message, not legacy))
            continue
        for entry in dist.record:
            path = os.path.normpath(os.path.join(dist.site_packages, entry.path))
            owned.add(path)
            if not entry.digest:
                continue
            stats.files_listed += 1
            inside = path.startswith(dist.site_packages + os.sep)
            st = walked.get(path) if inside else _lstat(path)
            if st is None:
                if inside:
                    message = f"{path}: listed in {dist.name} {dist.version} RECORD but missing"
                    findings.append(Finding("integrity", "missing_file", path, message, True, {"dist": dist.canonical}))
                else:
                    stats.outside_missing += 1
                continue
            algo = entry.digest.partition("=")[0]
            if algo not in hashlib.algorithms_guaranteed or algo in ("md5", "sha1"):
                stats.notes.append(f"{path}: RECORD uses hash {algo!r}, not verified")
                continue
            if entry.size is not None and entry.size != st.st_size:
                findings.append(_tampered(path, dist, f"size {st.st_size} differs from RECORD's {entry.size}"))
                continue
            jobs.append(_HashJob(path, entry.digest, algo, dist, st))
    return jobs, findings, owned


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _tampered(path: str, dist: InstalledDist, why: str) -> Finding:
    message = f"{path}: {why} (owned by {dist.name} {dist.version}); the installed file was modified"
    return Finding("integrity", "tampered", path, message, True, {"dist": dist.canonical})


def _hash_all(
    jobs: list[_HashJob],
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    cancel: threading.Event,
) -> tuple[list[Finding], list[str]]:
    findings: list[Finding] = []
    unreadable: list[str] = []
    todo: list[_HashJob] = []
    for job in jobs:
        cached = None if options.full_pass else cache.digest(job.path, stat_key(job.st), job.algo)
        if cached is None:
            todo.append(job)
            continue
        stats.files_cached += 1
        if cached != job.expected:
            findings.append(_tampered(job.path, job.owner, "content hash differs from RECORD"))

    def one(job: _HashJob) -> tuple[_HashJob, str | None, str | None]:
        if cancel.is_set():
            return job, None, "cancelled"
        try:
            return job, record_digest(job.path, job.algo), None
        except OSError as exc:
            return job, None, exc.strerror or str(exc)

    with cf.ThreadPoolExecutor(_workers(options.workers), thread_name_prefix="deps-hash") as pool:
        for job, digest, error in pool.map(one, todo, chunksize=32):
            if digest is None:
                unreadable.append(f"{job.path}: {error}")
                continue
            stats.files_hashed += 1
            stats.bytes_hashed += job.st.st_size
            cache.put_digest(job.path, stat_key(job.st), digest)
            if digest != job.expected:
                findings.append(_tampered(job.path, job.owner, "content hash differs from RECORD"))
    return findings, unreadable


def derived_pyc_sources(walked: dict[str, os.stat_result]) -> dict[str, str]:
    """``__pycache__/*.pyc`` files -> their source path, for every such pyc whose source exists."""
    out = {}
    sep = os.sep
    for path in walked:
        if not path.endswith(".pyc"):
            continue
        parent, _, name = path.rpartition(sep)
        grand, _, last = parent.rpartition(sep)
        if last != "__pycache__":
            continue
        source = f"{grand}{sep}{name.split('.', 1)[0]}.py"
        if source in walked:
            out[path] = source
    return out


def _pyc_pairs(pyc_sources: dict[str, str], cache_tag: str | None) -> list[tuple[str, str]]:
    """(pyc, source) for the pycs the target's interpreter would load (its own cache tag)."""
    pairs = []
    for pyc, source in pyc_sources.items():
        m = _PYC_NAME.match(pyc.rpartition(os.sep)[2])
        if m and m.group("tag") == cache_tag:
            pairs.append((pyc, source))
    return pairs


def _worker_batch(pairs: list[tuple[str, str]], timeout: float) -> list[tuple[str, str, str]]:
    """Verifies ``pairs`` in a fresh interpreter running pyccheck.py as a script (stdlib only).

    A process, not a thread or multiprocessing: hostile bytecode that crashes ``marshal``
    kills that worker only, and nothing of the caller's ``__main__`` is re-imported.
    """
    cmd = [sys.executable, "-I", "-B", pyccheck.__file__]
    try:
        proc = subprocess.run(cmd, input=json.dumps(pairs), capture_output=True, text=True, timeout=timeout)
        rows = json.loads(proc.stdout)
        return [(str(p), str(v), str(r)) for p, v, r in rows]
    except subprocess.TimeoutExpired:
        why = f"the .pyc checker did not finish within {timeout:.0f}s"
    except (ValueError, TypeError):
        why = f"the .pyc checker died (exit {proc.returncode}) on this batch: {proc.stderr.strip()[-200:]}"
    return [(p, MISMATCH, why) for p, _ in pairs]


def _run_pyc_batches(
    pairs: list[tuple[str, str]], workers: int, cancel: threading.Event
) -> Iterable[tuple[str, str, str]]:
    if not pairs:
        return
    count = min(_workers(workers), max(1, len(pairs) // CHUNK))
    parts = [pairs[i::count] for i in range(count)]
    with cf.ThreadPoolExecutor(count, thread_name_prefix="deps-pyc") as pool:
        futures = [pool.submit(_worker_batch, part, PYC_TIMEOUT) for part in parts]
        for fut in cf.as_completed(futures):
            if cancel.is_set():
                return
            yield from fut.result()


def _check_pycs(
    walked: dict[str, os.stat_result],
    pyc_sources: dict[str, str],
    target: Target,
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    cancel: threading.Event,
) -> list[Finding]:
    if not options.check_pyc:
        return []
    if target.magic != auditor_magic() or not target.cache_tag:
        count = sum(1 for p in walked if p.endswith(".pyc"))
        stats.pyc_not_verifiable = count
        if count:
            stats.notes.append(
                f"{count} .pyc files not verified: target bytecode {target.cache_tag} is not the auditor's; "
                "run the auditor with the target's Python version"
            )
        return []
    keys: dict[str, list[int]] = {}
    todo = []
    for pyc, source in _pyc_pairs(pyc_sources, target.cache_tag):
        keys[pyc] = [*stat_key(walked[pyc]), *stat_key(walked[source])]
        if not options.full_pass and cache.pyc_ok(pyc, keys[pyc]):
            stats.pyc_cached += 1
        else:
            todo.append((pyc, source))
    findings = []
    for pyc, verdict, reason in _run_pyc_batches(todo, options.workers, cancel):
        stats.pyc_checked += 1
        if verdict == OK:
            cache.put_pyc_ok(pyc, keys[pyc])
        elif verdict == MISMATCH:
            findings.append(
                Finding("integrity", "pyc_mismatch", pyc, f"{pyc}: {reason}; Python would run this bytecode")
            )
        elif verdict == "error":
            stats.notes.append(f"{pyc}: {reason}")
        else:
            stats.pyc_stale += 1
    return findings


def _pth_findings(root: str, walked: dict[str, os.stat_result], rules: Sequence[PthRule]) -> list[Finding]:
    out = []
    for path in sorted(p for p in walked if os.path.dirname(p) == root and p.endswith(".pth")):
        name = os.path.basename(path)
        try:
            with open(path, "rb") as fh:
                content = fh.read(1024 * 1024)
        except OSError:
            content = b""
        digest = hashlib.sha256(content).hexdigest()
        if any(fnmatch.fnmatchcase(name, r.name) and r.sha256 in (None, digest) for r in rules):
            continue
        executes = any(line.startswith((b"import ", b"import\t")) for line in content.splitlines())
        why = "runs code at every interpreter start-up" if executes else "adds paths at start-up"
        message = f"{path}: .pth file not on integrity.pth_allow ({why}); sha256 {digest}"
        out.append(Finding("integrity", "pth_not_allowed", path, message, True, {"sha256": digest}))
    return out


def _unowned_findings(
    root: str, walked: dict[str, os.stat_result], owned: set[str], derived: dict[str, str], allow: Sequence[str]
) -> list[Finding]:
    out = []
    for path in sorted(walked):
        if path in owned or path in derived or (path.endswith(".pth") and os.path.dirname(path) == root):
            continue
        rel = os.path.relpath(path, root)
        if any(fnmatch.fnmatchcase(rel, pattern) for pattern in allow):
            continue
        if os.path.basename(os.path.dirname(path)) == "__pycache__":
            message = f"{path}: bytecode without a source file, owned by no distribution (never imported)"
            out.append(Finding("integrity", "unowned", path, message, False))
            continue
        message = f"{path}: no installed distribution's RECORD lists this file"
        out.append(Finding("integrity", "unowned", path, message))
    return out


def check_integrity(
    target: Target,
    dists: Sequence[InstalledDist],
    options: IntegrityOptions,
    cache: IntegrityCache,
    cancel: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Finding], IntegrityStats, list[str]]:
    """(findings, stats, reasons the check is incomplete) for ``dists`` of ``target``. Updates ``cache``."""
    cancel = cancel or threading.Event()
    stats = IntegrityStats()
    walked: dict[str, os.stat_result] = {}
    for root in target.site_packages:
        walked.update(walk_files(root))
    stats.files_walked = len(walked)
    jobs, findings, owned = _record_jobs(dists, walked, stats)
    hashed, unreadable = _hash_all(jobs, cache, options, stats, cancel)
    findings.extend(hashed)
    pyc_sources = derived_pyc_sources(walked)
    for root in target.site_packages:
        findings.extend(_pth_findings(root, walked, options.pth_allow))
        in_root = {p: s for p, s in walked.items() if p.startswith(root + os.sep)}
        findings.extend(_unowned_findings(root, in_root, owned, pyc_sources, options.unowned_allow))
    findings.extend(_check_pycs(walked, pyc_sources, target, cache, options, stats, cancel))
    cache.prune(set(walked) | {j.path for j in jobs})
    incomplete = [f"{len(unreadable)} files could not be read, e.g. {unreadable[0]}"] if unreadable else []
    if cancel.is_set():
        incomplete.append("integrity check cancelled")
    return findings, stats, incomplete
