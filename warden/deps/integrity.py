"""Installed-file integrity: RECORD re-hash, unowned files, ``.pth`` allow-list, ``.pyc`` check.

:func:`check_integrity` walks the environment and ties the checks together, one module each:
records.py (RECORD rows, distributions remembered clean), filehash.py (the hashing pass),
unowned.py (unowned, special and escaping files), pth.py, bytecode.py (``.pyc``), interpreter.py
(what venv made, start-up hooks) and stdlib.py (the base interpreter); integrity_common.py holds
the options and stats they share.

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

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warden.deps import bytecode, filehash, records
from warden.deps.bytecode import CHUNK, PYC_TIMEOUT, derived_pyc_sources, pair_key
from warden.deps.cache import IntegrityCache
from warden.deps.closure import CLOSURE_KINDS, ClosureResult, collect_closure
from warden.deps.environment import Target
from warden.deps.installed import InstalledDist
from warden.deps.integrity_common import DEFAULT_UNHASHED, IntegrityOptions, IntegrityStats, lstat_or_none, workers
from warden.deps.interpreter import check_venv, check_venv_scripts, hook_dirs, startup_hooks, venv_made
from warden.deps.model import Finding
from warden.deps.pth import SETUPTOOLS_PTH, PthRule, pth_findings
from warden.deps.records import fingerprint
from warden.deps.stdlib import StdlibResult, collect_stdlib
from warden.deps.unowned import link_and_special_findings, unowned_findings
from warden.deps.walk import CHANGED, safe_digest, settled, walk_tree
from warden.safeio import stat_identity

__all__ = [
    "CHUNK",
    "DEFAULT_UNHASHED",
    "INTEGRITY_KINDS",
    "PYC_TIMEOUT",
    "SETUPTOOLS_PTH",
    "IntegrityOptions",
    "IntegrityResult",
    "IntegrityStats",
    "PthRule",
    "check_integrity",
    "derived_pyc_sources",
    "fingerprint",
    "pair_key",
    "record_digest",
    "walk_files",
]

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
    *CLOSURE_KINDS,
)


def walk_files(root: str) -> dict[str, os.stat_result]:
    """Every non-directory under ``root`` with its lstat (nothing followed; see walk.walk_tree)."""
    return walk_tree(root).files


def record_digest(path: str, algo: str) -> str:
    """``algo=urlsafe-b64-nopad`` as RECORD writes it, never following a link. Raises OSError."""
    return safe_digest(path, algo)


@dataclass
class IntegrityResult:
    """What :func:`check_integrity` found; ``environment`` digests feed the approved baseline."""

    findings: list[Finding]
    stats: IntegrityStats
    incomplete: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    stdlib: StdlibResult = field(default_factory=StdlibResult)
    closure: ClosureResult = field(default_factory=ClosureResult)


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
    approved: Mapping[str, str] | None = None,
) -> IntegrityResult:
    """Findings, stats and reasons the check is incomplete (every unreadable path) for ``dists``
    of ``target``: every file under the venv and site-packages is owned by a hashed RECORD row,
    made by venv (checked by interpreter.py), or a finding. ``approved``: the approved baseline's
    stdlib and closure files (path -> digest), None without a baseline. Updates ``cache``."""
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
    jobs, findings, owned = records.record_jobs(dists, walked, roots, options, stats, cache)
    hashed, unhashable = filehash.hash_all(jobs, cache, options, stats, cancel)
    findings.extend(hashed)
    unreadable.extend(unhashable)
    if not cancel.is_set():
        records.remember_clean(dists, walked, options, cache, findings, unreadable)
    pyc_sources = derived_pyc_sources(walked)
    findings.extend(_tree_findings(target, per_root, walked, owned, pyc_sources, options))
    findings.extend(_interpreter(target, walked, options, unreadable))
    environment = _environment_digests(target, per_root.get(target.venv or "", {}), cache, unreadable, options)
    verify = bytecode.can_verify(target) and options.check_pyc
    stdlib = _stdlib(target, cache, options, stats, unreadable, visited, verify)
    findings.extend(stdlib.findings)
    scope = collect_closure(
        target,
        dists,
        stdlib.roots,
        cache,
        options.full_pass,
        options.pth_allow,
        unreadable,
        visited,
        options.budget,
        verify,
    )
    findings.extend(scope.findings)
    stats.closure_roots, stats.closure_files = len(scope.roots), len(scope.files)
    stats.oversized = sum(1 for f in findings if f.kind == "oversized")
    # One .pyc pass: every pyc of site-packages, and those of the stdlib and the closure roots whose
    # digest is not the approved one (stdlib.py says why), each against its source.
    known = approved or {}
    fresh = {
        pyc: src
        for result in (stdlib, scope)
        for pyc, src in result.pyc_sources.items()
        if approved is not None and known.get(pyc) != result.files.get(pyc)
    }
    all_walked = {**stdlib.walked, **scope.walked, **walked}
    all_sources = {**fresh, **pyc_sources}
    findings.extend(bytecode.check_pycs(all_walked, all_sources, target, cache, options, stats, cancel, unreadable))
    if options.full_pass and not cancel.is_set():  # cache.prune forgets only after a full pass
        live = set(walked) | {j.path for j in jobs} | set(environment) | set(stdlib.files) | set(scope.files)
        cache.prune(live, True)
    cache.prune_listings(visited)
    stats.dirs_walked = len(visited)
    cache.prune_dists({d.meta_dir for d in dists})
    incomplete = [f"{'changed' if u.endswith(CHANGED) else 'unreadable'}: {u}" for u in unreadable]
    if cancel.is_set():
        incomplete.append("integrity check cancelled")
    return IntegrityResult(findings, stats, incomplete, environment, stdlib, scope)


def _tree_findings(
    target: Target,
    per_root: dict[str, dict[str, os.stat_result]],
    walked: dict[str, os.stat_result],
    owned: set[str],
    pyc_sources: dict[str, str],
    options: IntegrityOptions,
) -> list[Finding]:
    """Special files and escaping links, ``.pth`` files not allowed, and files no RECORD row owns
    (what venv made is exempt: interpreter.py checks it)."""
    venv = target.venv

    def exempt(path: str) -> bool:
        return venv is not None and venv_made(venv, path)

    out = link_and_special_findings(walked, tuple(per_root), exempt)
    for root in target.site_packages:
        out.extend(pth_findings(root, walked, options.pth_allow))
    for root, files in per_root.items():
        out.extend(unowned_findings(root, files, owned, pyc_sources, options.unowned_allow, exempt))
    return out


def _interpreter(
    target: Target, walked: dict[str, os.stat_result], options: IntegrityOptions, unreadable: list[str]
) -> list[Finding]:
    out, bad = startup_hooks(hook_dirs(target), options.startup_allow, options.budget)
    unreadable.extend(bad)
    for name, why in target.env_problems:
        message = f"{name}: set by an environment file ({why}; not on the modelled or inert list)"
        out.append(Finding("integrity", "environment_variable", name, message, True, {"variable": name}))
    for check in (check_venv(target, options.budget), check_venv_scripts(target, walked)):
        out.extend(check[0])
        unreadable.extend(check[1])
    return out


def _stdlib(
    target: Target,
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    unreadable: list[str],
    visited: set[str],
    verify_pycs: bool,
) -> StdlibResult:
    """The base interpreter's files (stdlib.py), counted in ``stats``."""
    stdlib = collect_stdlib(
        target,
        cache,
        options.full_pass,
        workers(options.workers),
        options.startup_allow,
        unreadable,
        visited,
        options.budget,
        verify_pycs,
    )
    stats.stdlib_files, stats.stdlib_hashed, stats.stdlib_cached = len(stdlib.files), stdlib.hashed, stdlib.cached
    if not stdlib.roots:
        stats.notes.append("the base interpreter's stdlib is not known for this target: not audited")
    return stdlib


def _environment_digests(
    target: Target,
    walked: dict[str, os.stat_result],
    cache: IntegrityCache,
    unreadable: list[str],
    options: IntegrityOptions,
) -> dict[str, str]:
    """sha256 (RECORD form; a link: of its target string) of what venv made and the base interpreter."""
    paths = [p for p in walked if target.venv and venv_made(target.venv, p)]
    if target.venv:
        paths.extend(os.path.realpath(p) for p in list(paths) if os.path.basename(p).startswith("python"))
    out: dict[str, str] = dict(target.env_files)  # read whole by discovery (syspath.py)
    now = time.time_ns()  # before any read: walk.settled
    for path in sorted(set(paths)):
        st = walked.get(path) or lstat_or_none(path)
        if st is None:
            continue
        cached = cache.digest(path, stat_identity(st), "sha256")
        try:
            out[path] = cached or safe_digest(path, "sha256", st, options.budget)  # of the file stat-ed
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        if cached or settled(st, now):
            cache.put_digest(path, stat_identity(st), out[path])
    return out
