"""The ``.pyc`` check, the auditor's side: every pyc the target would load equals a fresh compile of
its source, verified in worker processes running pyccheck.py (which says why processes).

Incremental: a pair whose two stat identities are unchanged keeps its verdict; otherwise (and on a
full pass) both files are hashed here in threads and a pair whose exact bytes were verified before
is not compiled again (pyccheck.verdict_key).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import operator
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

from warden.deps import pyccheck
from warden.deps.cache import IntegrityCache
from warden.deps.environment import Target, auditor_magic
from warden.deps.integrity_common import IntegrityOptions, IntegrityStats, workers
from warden.deps.model import Finding
from warden.deps.pyccheck import MISMATCH, OK
from warden.deps.walk import CHANGED, kind_of, map_in_threads, read_as, settled
from warden.safeio import stat_identity

CHUNK = 64  # at least this many .pyc files per worker process
PYC_TIMEOUT = 1800.0
_PYC_NAME = re.compile(r"^(?P<stem>[^.]+)\.(?P<tag>[a-z]+-[0-9]+)(?:\.opt-[0-9])?\.pyc\Z")


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


def _batches(pairs: list[tuple[str, str]], count: int) -> list[list[tuple[str, str]]]:
    """About four batches per worker (``count`` of them: so one slow batch does not hold the rest),
    at least CHUNK pairs each."""
    if not pairs:
        return []
    size = max(CHUNK, -(-len(pairs) // (4 * count)))
    return [pairs[i : i + size] for i in range(0, len(pairs), size)]


def _run_pyc_batches(
    pairs: list[tuple[str, str]], requested: int, cancel: threading.Event
) -> Iterable[tuple[str, str, str, str, str]]:
    batches = _batches(pairs, workers(requested))
    if not batches:
        return
    with cf.ThreadPoolExecutor(min(workers(requested), len(batches)), thread_name_prefix="deps-pyc") as pool:
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
    source_digest = cache.digest(source, stat_identity(walked[source]), "sha256")
    if source_digest is None:
        source_digest = pyccheck.record_form(read_as(source, pyccheck.MAX_BYTES, walked[source]))
    return data[:16], pyccheck.record_form(data), source_digest


def _pyc_finding(pyc: str, reason: str) -> Finding:
    return Finding("integrity", "pyc_mismatch", pyc, f"{pyc}: {reason}; Python would run this bytecode")


def check_pycs(
    walked: dict[str, os.stat_result],
    pyc_sources: dict[str, str],
    target: Target,
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    cancel: threading.Event,
    unreadable: list[str],
) -> list[Finding]:
    """Every pyc the target would load equals a fresh compile of its source (see the module doc).

    A verdict is kept under the pair's stat keys only for bytes read from the walked files (the
    worker's digests equal those read here, walk.read_as) and settled ones (walk.settled); a pair
    that changed since the walk goes to ``unreadable`` (the audit is incomplete)."""
    if not options.check_pyc or not _verifiable(walked, target, stats):
        return []
    findings: list[Finding] = []
    keys: dict[str, str] = {}
    todo = _uncached_pairs(walked, pyc_sources, target, cache, options, stats, keys, findings)
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


def can_verify(target: Target) -> bool:
    """Whether the auditor compiles bytecode the way the target does (same magic, a cache tag)."""
    return target.magic == auditor_magic() and bool(target.cache_tag)


def _verifiable(walked: dict[str, os.stat_result], target: Target, stats: IntegrityStats) -> bool:
    """Whether the auditor compiles the target's bytecode (same magic, a cache tag); else a note."""
    if target.magic == auditor_magic() and target.cache_tag:
        return True
    count = sum(1 for p in walked if p.endswith(".pyc"))
    stats.pyc_not_verifiable = count
    if count:
        stats.notes.append(
            f"{count} .pyc files not verified: target bytecode {target.cache_tag} is not the auditor's; "
            "run the auditor with the target's Python version"
        )
    return False


def _uncached_pairs(
    walked: dict[str, os.stat_result],
    pyc_sources: dict[str, str],
    target: Target,
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    keys: dict[str, str],
    findings: list[Finding],
) -> list[tuple[str, str]]:
    """The pairs whose verdict is not kept under both files' stat keys (all on a full pass); ``keys``
    gains each pair's key text, ``findings`` a finding for each pair that is not two regular files."""
    todo: list[tuple[str, str]] = []
    for pyc, source in _pyc_pairs(pyc_sources, target.cache_tag):
        p, src = walked[pyc], walked[source]
        if not (stat.S_ISREG(p.st_mode) and stat.S_ISREG(src.st_mode)):
            kinds = (kind_of(p.st_mode), kind_of(src.st_mode))
            what = "the .pyc" if kinds[0] != "file" else "its source"
            reason = f"{what} is a {kinds[0] if kinds[0] != 'file' else kinds[1]}, never read by the auditor"
            findings.append(_pyc_finding(pyc, reason))
            continue
        key = (
            f"{p.st_dev} {p.st_ino} {p.st_size} {p.st_mtime_ns} {p.st_ctime_ns} "
            f"{src.st_dev} {src.st_ino} {src.st_size} {src.st_mtime_ns} {src.st_ctime_ns}"
        )  # cache.key_text of both stat_identity keys, inline: this runs once per .pyc
        keys[pyc] = key
        if not options.full_pass and cache.pyc_ok(pyc, key):
            stats.pyc_cached += 1
        else:
            todo.append((pyc, source))
    return todo


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
    dropped. ``read`` gains the digests of each settled pair read as walked (check_pycs)."""

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
    for pyc, source, key, digests, changed in map_in_threads(one, todo, workers(options.workers), "deps-pyc-hash"):
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
