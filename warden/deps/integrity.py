"""Installed-file integrity: RECORD re-hash, unowned files, ``.pth`` allow-list, ``.pyc`` check.

Parallel (a thread pool hashes; ``hashlib`` releases the GIL) and incremental (a file
whose stat identity is unchanged keeps its cached digest or verdict, see cache.py), with a
full pass when the caller asks (the policy's ``full_pass_interval_seconds``).
``.pyc`` files are verified in worker processes (pyccheck.py says why).

A digest or ``.pyc`` verdict is cached under the stat key of the walk only when the bytes were
read from that very file (walk.safe_digest / walk.read_as compare the descriptor's ``fstat``
with the walk's ``lstat``) and the file had settled (walk.settled). A file that changed between
the walk and the read (renamed over, its directory swapped, written) is reported as incomplete
("changed during the audit": exit 3), nothing is cached for it and no distribution is remembered
clean in that audit; the next audit hashes whatever is then in place.
"""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import functools
import hashlib
import json
import operator
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from warden.deps import pyccheck
from warden.deps.cache import IntegrityCache, stat_key
from warden.deps.drift import matches_any
from warden.deps.environment import Target, auditor_magic
from warden.deps.installed import InstalledDist, RecordEntry
from warden.deps.interpreter import check_venv, check_venv_scripts, hook_dirs, startup_hooks, venv_made
from warden.deps.model import Finding
from warden.deps.pyccheck import MISMATCH, OK
from warden.deps.stdlib import StdlibResult, collect_stdlib
from warden.deps.walk import (
    CHANGED,
    kind_of,
    link_escapes,
    map_in_threads,
    read_as,
    read_small,
    safe_digest,
    settled,
    sha256_hex,
    stat_fingerprint,
    walk_tree,
)
from warden.errors import quote_untrusted

INTEGRITY_KINDS = (
    "tampered",
    "missing_file",
    "unowned",
    "unhashed",
    "pth_not_allowed",
    "pyc_mismatch",
    "no_record",
    "egg_info",
    "special_file",
    "link_outside",
    "record_mismatch",
    "wheel_missing",
    "wheel_unusable",
)
CHUNK = 64  # at least this many .pyc files per worker process
PYC_TIMEOUT = 1800.0
_PYC_NAME = re.compile(r"^(?P<stem>[^.]+)\.(?P<tag>[a-z]+-\d+)(?:\.opt-\d)?\.pyc$")


@dataclass(frozen=True)
class PthRule:
    """A ``.pth`` file allowed at start-up, by the sha256 of its content (``name`` documents it;
    a rule without ``sha256`` allows nothing: a name says nothing about what the file runs)."""

    name: str = ""
    sha256: str | None = None


# distutils-precedence.pth as setuptools ships it (65.5.0, ensurepip's bundle, and later).
SETUPTOOLS_PTH = (
    PthRule("distutils-precedence.pth", "2638ce9e2500e572a5e0de7faed6661eb569d1b696fcba07b0dd223da5f5d224"),
)
DEFAULT_UNHASHED = ("*.dist-info/RECORD", "*.dist-info/RECORD.jws", "*.dist-info/RECORD.p7s", "*__pycache__/*.pyc")


@dataclass(frozen=True)
class IntegrityOptions:
    pth_allow: tuple[PthRule, ...] = SETUPTOOLS_PTH
    unowned_allow: tuple[str, ...] = ()
    check_pyc: bool = True
    workers: int = 0
    full_pass: bool = False
    unhashed_allow: tuple[str, ...] = DEFAULT_UNHASHED
    egg_info_allow: tuple[str, ...] = ()
    startup_allow: tuple[str, ...] = ()


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
    pyc_verdict_cached: int = 0
    pyc_stale: int = 0
    pyc_not_verifiable: int = 0
    stdlib_files: int = 0
    stdlib_hashed: int = 0
    stdlib_cached: int = 0
    dirs_walked: int = 0
    dirs_listed: int = 0  # the others' listings came from the cache (walk.walk_tree)
    dists_cached: int = 0  # judged whole by their fingerprint (dist_state), RECORD not parsed
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def walk_files(root: str) -> dict[str, os.stat_result]:
    """Every non-directory under ``root`` with its lstat (nothing followed; see walk.walk_tree)."""
    return walk_tree(root).files


def record_digest(path: str, algo: str) -> str:
    """``algo=urlsafe-b64-nopad`` as RECORD writes it, never following a link. Raises OSError."""
    return safe_digest(path, algo)


def _workers(requested: int) -> int:
    return requested if requested > 0 else max(2, min(8, (os.cpu_count() or 2)))


@dataclass(frozen=True)
class _HashJob:
    path: str
    expected: str
    algo: str
    owner: InstalledDist
    st: os.stat_result


def _inside(path: str, roots: Sequence[str]) -> bool:
    return path.startswith(_prefixes(tuple(roots)))


@functools.lru_cache(maxsize=16)
def _prefixes(roots: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(root + os.sep for root in roots)


@functools.lru_cache(maxsize=16)
def _glob_matcher(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """One compiled regex for a policy's glob list (``fnmatchcase`` semantics, matched at once)."""
    if not patterns:
        return lambda _rel: None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def _legacy_findings(dist: InstalledDist, walked: dict[str, os.stat_result], allow: Sequence[str]) -> list[Finding]:
    """A distribution without RECORD hashes (no RECORD, or an egg-info) owns nothing it could prove."""
    legacy = dist.meta_dir.endswith(".egg-info")
    if legacy and matches_any(dist.canonical, allow):
        return []
    kind = "egg_info" if legacy else "no_record"
    message = dist.problem or f"{dist.meta_dir}: no RECORD"
    if legacy:
        message += "; not on integrity.egg_info_allow"
    return [Finding("integrity", kind, dist.canonical, message, True, {"meta_dir": dist.meta_dir})]


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (a slice when it lies below, as nearly every path does)."""
    prefix = root.rstrip(os.sep) + os.sep
    return path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, root)


@functools.lru_cache(maxsize=64)
def _is_normal(root: str) -> bool:
    return os.sep == "/" and root == os.path.normpath(root)


def _joined(root: str, rel: str) -> str:
    """``normpath(join(root, rel))``, without the cost for a plain relative RECORD path."""
    plain = rel and rel[0] not in "./" and "/." not in rel and "//" not in rel and not rel.endswith("/")
    if plain and _is_normal(root):
        return f"{root}/{rel}"
    return os.path.normpath(os.path.join(root, rel))


def _unhashed_ok(dist: InstalledDist, path: str, allow: Sequence[str]) -> bool:
    rel = _relative(path, dist.site_packages)
    if rel.endswith(".pyc") and not path.rpartition(os.sep)[0].endswith(os.sep + "__pycache__"):
        return False  # a sourceless .pyc beside the package is imported: it needs a hash
    return _glob_matcher(tuple(allow))(rel) is not None


def _cached_ok(entry: RecordEntry, st: os.stat_result | None, cached: str | None) -> bool:
    """Whether a row's file (walked, so inside the roots) is a regular file whose stat identity
    (size, mtime_ns, inode, ctime_ns: cache.py says why ctime) is the one it had when it was last
    hashed to exactly the row's sha256 (``cached``: the cache's entry for the path). Anything else
    goes the long way (_row)."""
    return (
        st is not None
        and cached is not None
        and entry.digest is not None
        and entry.digest.startswith("sha256=")
        and stat.S_ISREG(st.st_mode)
        and (entry.size is None or entry.size == st.st_size)
        and cached == f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_ctime_ns} {entry.digest}"
    )


def _policy_tag(options: IntegrityOptions) -> str:
    """What a distribution's clean verdict depends on besides its files: the rows allowed without a hash."""
    return hashlib.sha256("\0".join(options.unhashed_allow).encode()).hexdigest()[:16]


def fingerprint(hashed: str, other: str, walked: dict[str, os.stat_result]) -> str | None:
    """walk.stat_fingerprint of the NUL-joined ``hashed`` paths, given that each ``other`` path was
    walked too (their content is not what the fingerprint vouches for: .pyc rows are checked
    against their source, RECORD by its digest); None otherwise. Each hashed path was a regular
    file when the distribution was remembered, and the mode is in the fingerprint."""
    if other and not all(map(walked.__contains__, other.split("\0"))):
        return None
    return stat_fingerprint(hashed.split("\0") if hashed else (), walked)


def _remember_clean(
    dists: Sequence[InstalledDist],
    walked: dict[str, os.stat_result],
    options: IntegrityOptions,
    cache: IntegrityCache,
    findings: Sequence[Finding],
    unreadable: Sequence[str],
) -> None:
    """After hashing: remembers each distribution whose every row is verified (a regular file whose
    cached digest, for its current stat, is the row's sha256) or an allowed unhashed row present
    under the roots, with its paths and their fingerprint (dist_state). One not clean is not
    remembered, so it is judged row by row again. The fingerprint is of the walk's stats, which is
    sound because a digest is cached only under the stat of the descriptor it was read from and
    only once settled (_hash_all); a file that changed during the audit leaves ``unreadable``
    non-empty, and then nothing is remembered."""
    if unreadable or any(f.kind in ("missing_file", "special_file") for f in findings):
        return  # a partial walk or hash is not a verdict to keep
    tag = _policy_tag(options)
    dirty = {str(f.details.get("dist")) for f in findings if f.details.get("dist")}
    for dist in dists:
        if (
            dist.record is None
            or not dist.record_sha256
            or dist.meta_dir.endswith(".egg-info")
            or dist.canonical in dirty
            or cache.dist_state(dist.meta_dir, dist.record_sha256, tag) is not None
        ):
            continue
        hashed: list[str] = []
        other: list[str] = []
        for entry in dist.record:
            path = _joined(dist.site_packages, entry.path)
            st = walked.get(path)
            if st is None:
                break  # missing, or outside the roots (lstat-ed each audit by _row)
            if _cached_ok(entry, st, cache.entry(path)):
                hashed.append(path)
            elif entry.digest is None and _unhashed_ok(dist, path, options.unhashed_allow):
                other.append(path)
            else:
                break
        else:
            joined, rest = "\0".join(hashed), "\0".join(other)
            print_ = fingerprint(joined, rest, walked)
            if print_ is not None:
                cache.put_dist(dist.meta_dir, dist.record_sha256, tag, joined, rest, print_)


def _record_jobs(
    dists: Sequence[InstalledDist],
    walked: dict[str, os.stat_result],
    roots: Sequence[str],
    options: IntegrityOptions,
    stats: IntegrityStats,
    cache: IntegrityCache,
) -> tuple[list[_HashJob], list[Finding], set[str]]:
    """Hash jobs for RECORD rows with a digest whose file changed since it was hashed (every row
    on a full pass), findings needing no hashing, and the owned paths.

    A row owns its path only if it carries a strong hash (or the policy's ``unhashed_allow``
    names it): a row without one would otherwise switch the check off for that file."""
    jobs: list[_HashJob] = []
    findings: list[Finding] = []
    owned: set[str] = set()
    tag = _policy_tag(options)
    for dist in dists:
        state = None if options.full_pass else cache.dist_state(dist.meta_dir, dist.record_sha256, tag)
        if state is not None and fingerprint(state[0], state[1], walked) == state[2]:
            hashed = state[0].split("\0") if state[0] else []
            stats.dists_cached += 1
            stats.files_listed += len(hashed)
            stats.files_cached += len(hashed)
            owned.update(hashed)
            owned.update(state[1].split("\0") if state[1] else ())
            continue
        cache.drop_dist(dist.meta_dir)  # judged again below; remembered again once clean (_remember_clean)
        if dist.record is None or dist.meta_dir.endswith(".egg-info"):
            found = _legacy_findings(dist, walked, options.egg_info_allow)
            findings.extend(found)
            owned.update(p for p in walked if p.startswith(dist.meta_dir + os.sep) or p == dist.meta_dir)
            if not found:  # an allowed egg-info owns what it lists, by name
                owned.update(os.path.normpath(os.path.join(dist.site_packages, e.path)) for e in dist.record or ())
            continue
        site = dist.site_packages
        for entry in dist.record:
            path = _joined(site, entry.path)
            if not options.full_pass and _cached_ok(entry, walked.get(path), cache.entry(path)):
                stats.files_listed += 1
                stats.files_cached += 1
                owned.add(path)
                continue
            job, finding = _row(dist, entry, path, walked, roots, options, stats)
            if finding is not None:
                findings.append(finding)
            if job is not None:
                jobs.append(job)
            if finding is None or finding.kind != "unhashed":
                owned.add(path)
    return jobs, findings, owned


def _row(
    dist: InstalledDist,
    entry: RecordEntry,
    path: str,
    walked: dict[str, os.stat_result],
    roots: Sequence[str],
    options: IntegrityOptions,
    stats: IntegrityStats,
) -> tuple[_HashJob | None, Finding | None]:
    inside = _inside(path, roots)
    st = walked.get(path) if inside else _lstat(path)
    if st is None:
        if inside:
            message = f"{path}: listed in {dist.name} {dist.version} RECORD but missing"
            return None, Finding("integrity", "missing_file", path, message, True, {"dist": dist.canonical})
        stats.outside_missing += 1
        return None, None
    algo = (entry.digest or "").partition("=")[0]
    if not entry.digest or algo not in hashlib.algorithms_guaranteed or algo in ("md5", "sha1"):
        if not entry.digest and _unhashed_ok(dist, path, options.unhashed_allow):
            return None, None
        why = "has no hash" if not entry.digest else f"has a weak or unknown hash {quote_untrusted(algo, 20)!r}"
        message = f"{path}: its row in {dist.name} {dist.version} RECORD {why}, so nothing vouches for its content"
        return None, Finding("integrity", "unhashed", path, message, True, {"dist": dist.canonical})
    stats.files_listed += 1
    kind = kind_of(st.st_mode)
    if kind not in ("file", "symlink"):
        return None, _special(path, kind)
    if entry.size is not None and entry.size != st.st_size and kind == "file":
        return None, _tampered(path, dist, f"size {st.st_size} differs from RECORD's {entry.size}")
    return _HashJob(path, entry.digest, algo, dist, st), None


def _special(path: str, kind: str) -> Finding:
    message = f"{path}: a {kind} in the environment (never opened: reading it could block or run nothing we can hash)"
    return Finding("integrity", "special_file", path, message, True, {"type": kind})


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _tampered(path: str, dist: InstalledDist, why: str) -> Finding:
    message = f"{path}: {why} (owned by {dist.name} {dist.version}); the installed file was modified"
    return Finding("integrity", "tampered", path, message, True, {"dist": dist.canonical})


def _mismatch(job: _HashJob) -> Finding:
    if stat.S_ISLNK(job.st.st_mode):
        return _tampered(job.path, job.owner, "is a symbolic link where RECORD lists a file")
    return _tampered(job.path, job.owner, "content hash differs from RECORD")


def _job_size(job: _HashJob) -> int:
    return int(job.st.st_size)


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
            findings.append(_mismatch(job))

    def one(job: _HashJob) -> tuple[_HashJob, str | None, str | None]:
        if cancel.is_set():
            return job, None, "cancelled"
        try:  # the walked file only (job.st): anything else raises walk.Changed
            return job, safe_digest(job.path, job.algo, job.st), None
        except OSError as exc:
            return job, None, exc.strerror or str(exc)

    now = time.time_ns()  # before any read: walk.settled

    todo.sort(key=lambda j: -j.st.st_size)  # the largest first, each alone: the threads finish together
    for job, digest, error in map_in_threads(one, todo, _workers(options.workers), "deps-hash", 32, _job_size):
        if digest is None:
            unreadable.append(f"{job.path}: {error}")
            continue
        stats.files_hashed += 1
        stats.bytes_hashed += job.st.st_size
        if settled(job.st, now):
            cache.put_digest(job.path, stat_key(job.st), digest)
        if digest != job.expected:
            findings.append(_mismatch(job))
    return findings, unreadable


def derived_pyc_sources(walked: dict[str, os.stat_result]) -> dict[str, str]:
    """``__pycache__/*.pyc`` files -> their source path, for every such pyc whose source exists."""
    out = {}
    sep = os.sep
    for path in filter(operator.methodcaller("endswith", ".pyc"), walked):  # the filter runs in C
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
    marker = f".{cache_tag}."
    for pyc, source in pyc_sources.items():
        name = pyc.rpartition(os.sep)[2]
        if marker not in name:
            continue  # another interpreter's pyc (the regex below decides the rest)
        m = _PYC_NAME.match(name)
        if m and m.group("tag") == cache_tag:
            pairs.append((pyc, source))
    return pairs


def _worker_batch(pairs: list[tuple[str, str]], timeout: float) -> list[tuple[str, str, str, str, str]]:
    """Verifies ``pairs`` in a fresh interpreter running pyccheck.py as a script.

    A process, not a thread or multiprocessing: hostile bytecode that crashes ``marshal``
    kills that worker only, and nothing of the caller's ``__main__`` is re-imported.
    """
    cmd = [sys.executable, "-I", "-B", pyccheck.__file__]
    try:
        proc = subprocess.run(cmd, input=json.dumps(pairs), capture_output=True, text=True, timeout=timeout)
        rows = json.loads(proc.stdout)
        return [(str(p), str(v), str(r), str(dp), str(ds)) for p, v, r, dp, ds in rows]
    except subprocess.TimeoutExpired:
        why = f"the .pyc checker did not finish within {timeout:.0f}s"
    except (ValueError, TypeError):
        why = f"the .pyc checker died (exit {proc.returncode}) on this batch: {proc.stderr.strip()[-200:]}"
    return [(p, MISMATCH, why, "", "") for p, _ in pairs]


def _batches(pairs: list[tuple[str, str]], workers: int) -> list[list[tuple[str, str]]]:
    """About four batches per worker (so one slow batch does not hold the rest), at least CHUNK pairs each."""
    if not pairs:
        return []
    size = max(CHUNK, -(-len(pairs) // (4 * workers)))
    return [pairs[i : i + size] for i in range(0, len(pairs), size)]


def _run_pyc_batches(
    pairs: list[tuple[str, str]], workers: int, cancel: threading.Event
) -> Iterable[tuple[str, str, str, str, str]]:
    batches = _batches(pairs, _workers(workers))
    if not batches:
        return
    with cf.ThreadPoolExecutor(min(_workers(workers), len(batches)), thread_name_prefix="deps-pyc") as pool:
        futures = [pool.submit(_worker_batch, batch, PYC_TIMEOUT) for batch in batches]
        try:
            for fut in cf.as_completed(futures):
                if cancel.is_set():
                    return
                yield from fut.result()
        finally:
            for fut in futures:
                fut.cancel()


def pair_key(header: bytes, pyc_digest: str, source_digest: str, source_st: os.stat_result, pyc: str) -> str | None:
    """Pure: None when the header says the import system would not load the pyc (stale), else the
    key of its verdict. A checked-hash header is not judged here: the worker compares its hash
    with the source bytes (and the body with a compile all the same)."""
    if pyccheck.is_loaded(header, None, int(source_st.st_mtime), source_st.st_size) is False:
        return None
    return pyccheck.verdict_key(pyc_digest, source_digest, pyccheck.interpreter_id(), pyccheck.optimize_level(pyc))


def _pair_digests(
    pyc: str, source: str, walked: dict[str, os.stat_result], cache: IntegrityCache
) -> tuple[bytes, str, str]:
    """(pyc header, pyc digest, source digest) of the walked files (their stat identities, see
    walk.read_as), read here without following links; the source's digest comes from the cache
    when its stat is unchanged. Raises OSError (walk.Changed: not the walked file)."""
    data = read_as(pyc, pyccheck.MAX_BYTES, walked[pyc])
    source_digest = cache.digest(source, stat_key(walked[source]), "sha256")
    if source_digest is None:
        source_digest = pyccheck.record_form(read_as(source, pyccheck.MAX_BYTES, walked[source]))
    return data[:16], pyccheck.record_form(data), source_digest


def _pyc_finding(pyc: str, reason: str) -> Finding:
    return Finding("integrity", "pyc_mismatch", pyc, f"{pyc}: {reason}; Python would run this bytecode")


def _check_pycs(
    walked: dict[str, os.stat_result],
    pyc_sources: dict[str, str],
    target: Target,
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    cancel: threading.Event,
    unreadable: list[str],
) -> list[Finding]:
    """Every pyc the target would load equals a fresh compile of its source. Incremental: a pair
    whose two stat identities are unchanged keeps its verdict; otherwise (and on a full pass) both
    files are hashed and a pair whose exact bytes were verified before is not compiled again.

    A verdict is kept under the pair's stat keys only for bytes read from the walked files (the
    worker's digests equal those read here, walk.read_as) and settled ones (walk.settled); a pair
    that changed since the walk goes to ``unreadable`` (the audit is incomplete)."""
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
    findings: list[Finding] = []
    keys: dict[str, str] = {}
    todo: list[tuple[str, str]] = []
    for pyc, source in _pyc_pairs(pyc_sources, target.cache_tag):
        p, src = walked[pyc], walked[source]
        if not (stat.S_ISREG(p.st_mode) and stat.S_ISREG(src.st_mode)):
            kinds = (kind_of(p.st_mode), kind_of(src.st_mode))
            what = "the .pyc" if kinds[0] != "file" else "its source"
            reason = f"{what} is a {kinds[0] if kinds[0] != 'file' else kinds[1]}, never read by the auditor"
            findings.append(_pyc_finding(pyc, reason))
            continue
        # stat_key of both, inline: this runs once per .pyc
        key = (
            f"{p.st_size} {p.st_mtime_ns} {p.st_ino} {p.st_ctime_ns} "
            f"{src.st_size} {src.st_mtime_ns} {src.st_ino} {src.st_ctime_ns}"
        )  # cache.key_text of both stat keys, inline: this runs once per .pyc
        keys[pyc] = key
        if not options.full_pass and cache.pyc_ok(pyc, key):
            stats.pyc_cached += 1
        else:
            todo.append((pyc, source))
    read: dict[str, tuple[str, str]] = {}  # pyc -> digests of the walked pair's bytes, if settled
    compile_todo = _triage_all(todo, walked, cache, options, stats, keys, read, unreadable)
    for pyc, verdict, reason, pyc_digest, source_digest in _run_pyc_batches(compile_todo, options.workers, cancel):
        stats.pyc_checked += 1
        if verdict == OK:
            if read.get(pyc) == (pyc_digest, source_digest):  # the worker compiled the walked bytes
                cache.put_pyc_ok(pyc, keys[pyc])
            opt = pyccheck.optimize_level(pyc)
            cache.put_verdict_ok(pyccheck.verdict_key(pyc_digest, source_digest, pyccheck.interpreter_id(), opt))
        elif verdict == MISMATCH:
            findings.append(_pyc_finding(pyc, reason))
        elif verdict == pyccheck.ERROR:
            stats.notes.append(f"{pyc}: {reason}")
        else:
            stats.pyc_stale += 1
    return findings


def _triage_all(
    todo: list[tuple[str, str]],
    walked: dict[str, os.stat_result],
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    keys: dict[str, str],
    read: dict[str, tuple[str, str]],
    unreadable: list[str],
) -> list[tuple[str, str]]:
    """The pairs a worker must compile: hashed here in threads, known-``ok`` bytes and stale headers
    dropped. ``read`` gains the digests of each settled pair read as walked (_check_pycs)."""

    def one(pair: tuple[str, str]) -> tuple[str, str, str | bool | None, tuple[str, str] | None, str | None]:
        pyc, source = pair
        try:
            header, pyc_digest, source_digest = _pair_digests(pyc, source, walked, cache)
        except OSError as exc:  # the worker reads it again and reports why; walk.Changed: incomplete
            return pyc, source, False, None, (exc.strerror if exc.strerror == CHANGED else None)
        key = pair_key(header, pyc_digest, source_digest, walked[source], pyc)
        return pyc, source, key, (pyc_digest, source_digest), None

    now = time.time_ns()  # before any read: walk.settled
    out = []
    for pyc, source, key, digests, changed in map_in_threads(one, todo, _workers(options.workers), "deps-pyc-hash"):
        if changed:
            unreadable.append(f"{pyc}: {changed}")
        keep = digests is not None and settled(walked[pyc], now) and settled(walked[source], now)
        if keep and digests is not None:
            read[pyc] = digests
        if key is None:
            stats.pyc_stale += 1
        elif isinstance(key, str) and cache.verdict_ok(key):
            stats.pyc_verdict_cached += 1
            if keep:
                cache.put_pyc_ok(pyc, keys[pyc])
        else:
            out.append((pyc, source))
    return out


def _pth_findings(root: str, walked: dict[str, os.stat_result], rules: Sequence[PthRule]) -> list[Finding]:
    """Every ``.pth`` at ``root`` (site.py runs them all) must be allowed by its content digest."""
    out = []
    allowed = {r.sha256 for r in rules if r.sha256}
    for path in sorted(p for p in walked if p.endswith(".pth") and os.path.dirname(p) == root):
        kind = kind_of(walked[path].st_mode)
        if kind not in ("file", "symlink"):
            continue  # reported as special_file; never opened
        try:
            content = read_small(path, 1024 * 1024) if kind == "file" else b""
        except OSError:
            content = b""
        digest = hashlib.sha256(content).hexdigest() if kind == "file" else sha256_hex(path)
        if digest in allowed:
            continue
        executes = any(line.startswith((b"import ", b"import\t")) for line in content.splitlines())
        why = "runs code at every interpreter start-up" if executes else "adds paths at start-up"
        if kind == "symlink":
            why = "a symbolic link site.py would follow"
        message = f"{path}: .pth file whose content is not on integrity.pth_allow ({why}); sha256 {digest}"
        out.append(Finding("integrity", "pth_not_allowed", path, message, True, {"sha256": digest}))
    return out


def _unowned_findings(
    root: str,
    walked: dict[str, os.stat_result],
    owned: set[str],
    derived: dict[str, str],
    allow: Sequence[str],
    exempt: Callable[[str], bool],
) -> list[Finding]:
    out = []
    for path in sorted(p for p in walked if p not in owned and p not in derived):
        if exempt(path) or kind_of(walked[path].st_mode) not in ("file", "symlink"):
            continue  # special files are reported as such, never as unowned
        rel = _relative(path, root)
        if _glob_matcher(tuple(allow))(rel) is not None:
            continue
        if os.path.basename(os.path.dirname(path)) == "__pycache__" and path.endswith(".pyc"):
            message = f"{path}: bytecode without a source file, owned by no distribution (never imported)"
            out.append(Finding("integrity", "unowned", path, message, False))
            continue
        what = "symbolic link" if stat.S_ISLNK(walked[path].st_mode) else "file"
        message = f"{path}: no installed distribution's RECORD lists this {what}"
        out.append(Finding("integrity", "unowned", path, message))
    return out


def _link_and_special_findings(
    walked: dict[str, os.stat_result], roots: Sequence[str], exempt: Callable[[str], bool]
) -> list[Finding]:
    """Special files (never opened) and symbolic links whose target leaves the environment
    (except venv's own ``bin/python*`` links, which interpreter.py checks against the base)."""
    out = []
    for path, st in sorted((p, st) for p, st in walked.items() if not stat.S_ISREG(st.st_mode)):
        kind = kind_of(st.st_mode)
        if kind == "symlink":
            if exempt(path):
                continue
            escaped = link_escapes(path, roots)
            if escaped is not None:
                message = f"{path}: symbolic link to {quote_untrusted(escaped)}, outside the audited environment"
                out.append(Finding("integrity", "link_outside", path, message, True, {"target": escaped}))
        elif kind != "file":
            out.append(_special(path, kind))
    return out


@dataclass
class IntegrityResult:
    """What :func:`check_integrity` found; ``environment`` digests feed the approved baseline."""

    findings: list[Finding]
    stats: IntegrityStats
    incomplete: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    stdlib: StdlibResult = field(default_factory=StdlibResult)


def _walk(
    target: Target, listings: dict[str, list[Any]], visited: set[str]
) -> tuple[dict[str, dict[str, os.stat_result]], list[str], int]:
    """Entries under each of the environment's roots (the venv minus its site-packages, each
    site-packages), the unreadable paths and how many directories were listed (the others came
    from ``listings``); ``visited`` gains every directory walked."""
    per_root: dict[str, dict[str, os.stat_result]] = {}
    unreadable: list[str] = []
    relisted = 0
    roots = [target.venv] if target.venv else []
    for root in [*roots, *target.site_packages]:
        result = walk_tree(root, prune=target.site_packages if root == target.venv else (), listings=listings)
        per_root[root] = result.files
        unreadable.extend(result.unreadable)
        visited.update(result.dirs)
        relisted += result.relisted
    return per_root, unreadable, relisted


def check_integrity(
    target: Target,
    dists: Sequence[InstalledDist],
    options: IntegrityOptions,
    cache: IntegrityCache,
    cancel: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
) -> IntegrityResult:
    """Findings, stats and reasons the check is incomplete (every unreadable path) for ``dists``
    of ``target``: every file under the venv and site-packages is owned by a hashed RECORD row,
    made by venv (checked by interpreter.py), or a finding. Updates ``cache``."""
    cancel = cancel or threading.Event()
    stats = IntegrityStats()
    visited: set[str] = set()
    per_root, unreadable, relisted = _walk(target, cache.listings_for(options.full_pass), visited)
    cache.walked(relisted)
    stats.dirs_listed = relisted
    roots = tuple(per_root)
    walked: dict[str, os.stat_result] = {}
    for files in per_root.values():
        walked.update(files)
    stats.files_walked = len(walked)
    jobs, findings, owned = _record_jobs(dists, walked, roots, options, stats, cache)
    hashed, unhashable = _hash_all(jobs, cache, options, stats, cancel)
    findings.extend(hashed)
    unreadable.extend(unhashable)
    if not cancel.is_set():
        _remember_clean(dists, walked, options, cache, findings, unreadable)
    venv = target.venv

    def exempt(path: str) -> bool:
        return venv is not None and venv_made(venv, path)

    findings.extend(_link_and_special_findings(walked, roots, exempt))
    pyc_sources = derived_pyc_sources(walked)
    for root in target.site_packages:
        findings.extend(_pth_findings(root, walked, options.pth_allow))
    for root, files in per_root.items():
        findings.extend(_unowned_findings(root, files, owned, pyc_sources, options.unowned_allow, exempt))
    findings.extend(_interpreter(target, walked, options, unreadable))
    findings.extend(_check_pycs(walked, pyc_sources, target, cache, options, stats, cancel, unreadable))
    environment = _environment_digests(target, per_root.get(target.venv or "", {}), cache, unreadable)
    stdlib = collect_stdlib(
        target, cache, options.full_pass, _workers(options.workers), options.startup_allow, unreadable, visited
    )
    findings.extend(stdlib.findings)
    stats.stdlib_files, stats.stdlib_hashed, stats.stdlib_cached = len(stdlib.files), stdlib.hashed, stdlib.cached
    if not stdlib.roots:
        stats.notes.append("the base interpreter's stdlib is not known for this target: not audited")
    if options.full_pass and not cancel.is_set():  # cache.prune forgets only after a full pass
        cache.prune(set(walked) | {j.path for j in jobs} | set(environment) | set(stdlib.files), True)
    cache.prune_listings(visited)
    stats.dirs_walked = len(visited)
    cache.prune_dists({d.meta_dir for d in dists})
    incomplete = [f"{'changed' if u.endswith(CHANGED) else 'unreadable'}: {u}" for u in unreadable]
    if cancel.is_set():
        incomplete.append("integrity check cancelled")
    return IntegrityResult(findings, stats, incomplete, environment, stdlib)


def _interpreter(
    target: Target, walked: dict[str, os.stat_result], options: IntegrityOptions, unreadable: list[str]
) -> list[Finding]:
    out, bad = startup_hooks(hook_dirs(target), options.startup_allow)
    unreadable.extend(bad)
    for check in (check_venv(target), check_venv_scripts(target, walked)):
        out.extend(check[0])
        unreadable.extend(check[1])
    return out


def _environment_digests(
    target: Target, walked: dict[str, os.stat_result], cache: IntegrityCache, unreadable: list[str]
) -> dict[str, str]:
    """sha256 (RECORD form; a link: of its target string) of what venv made and the base interpreter."""
    paths = [p for p in walked if target.venv and venv_made(target.venv, p)]
    if target.venv:
        paths.extend(os.path.realpath(p) for p in list(paths) if os.path.basename(p).startswith("python"))
    out: dict[str, str] = {}
    now = time.time_ns()  # before any read: walk.settled
    for path in sorted(set(paths)):
        st = walked.get(path) or _lstat(path)
        if st is None:
            continue
        cached = cache.digest(path, stat_key(st), "sha256")
        try:
            out[path] = cached or safe_digest(path, "sha256", st)  # of the file stat-ed, else walk.Changed
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        if cached or settled(st, now):
            cache.put_digest(path, stat_key(st), out[path])
    return out
