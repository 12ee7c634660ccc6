"""The import closure: everything the target interpreter would import from, audited as one scope.

syspath.py computes the target's ``sys.path`` by reading files (venv, stdlib, ``._pth``, user site,
site directories and their ``.pth`` path lines, editable finders' targets, environment files). The
stdlib roots (stdlib.py), site-packages and the venv (integrity.py) are walked by their own checks;
every other directory or file on the path, and every editable finder's target, is a *closure
root*, walked and hashed here (bounded by walk.Budget) into the baseline's ``closure`` document.
Findings, all blocking:

- ``syspath_changed``: the computed ``sys.path`` (each entry as the interpreter writes it *and*
  resolved, with its origin) or the editable targets differ from the approved ones: a link that
  moves a stdlib root, a new ``.pth`` path line, the user site appearing;
- ``closure_added`` / ``closure_changed`` / ``closure_removed``: a file of a closure root since
  approval (its ``__pycache__`` pycs excepted when the auditor can compile the target's bytecode:
  one not as approved is checked against its source, as in the stdlib);
- ``shadowing``: a module or package importable from a path entry that comes before the site
  directory of an installed distribution (or before the stdlib) under one of that distribution's
  top-level names (or a stdlib module's), or any entry on the path that provides an editable
  finder's name (the path finder runs before the finder setuptools appends);
- ``path_config``: a ``._pth`` file beside the interpreter (it replaces the whole path and turns
  ``site`` off), unless its content digest is on ``integrity.pth_allow``;
- ``oversized``: a closure file over the per-file cap (never read).

``startup_hook`` covers every directory of the closure (interpreter.py) and an editable finder
mapping ``sitecustomize``/``usercustomize``.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warden.deps.bytecode import derived_pyc_sources
from warden.deps.cache import IntegrityCache
from warden.deps.environment import Target
from warden.deps.installed import InstalledDist
from warden.deps.integrity_common import oversized_finding
from warden.deps.interpreter import HOOK_NAMES
from warden.deps.model import Finding
from warden.deps.pth import PthRule
from warden.deps.stdlib import is_derived_pyc_name
from warden.deps.syspath import zip_entry
from warden.deps.walk import Budget, Oversized, kind_of, safe_digest, settled, sha256_hex, walk_tree
from warden.errors import quote_untrusted
from warden.safeio import stat_identity

CLOSURE_KINDS = (
    "syspath_changed",
    "closure_added",
    "closure_changed",
    "closure_removed",
    "shadowing",
    "path_config",
    "oversized",
)
ABSENT = "absent"
STDLIB_ORIGINS = ("stdlib", "lib-dynload", "stdlib-zip")
_MODULE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\.py|\.pyc|(?:\.[A-Za-z0-9_-]+)?\.so)\Z")
MAX_NAMES = 100_000


@dataclass
class ClosureResult:
    """``entries``: [path, resolved, origin, coverage] per sys.path entry and editable target;
    ``files``: closure roots' files -> digest (``special:<kind>``, ``oversized:<size>``)."""

    roots: tuple[str, ...] = ()
    entries: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    walked: dict[str, os.stat_result] = field(default_factory=dict)
    pyc_sources: dict[str, str] = field(default_factory=dict)
    hashed: int = 0
    verified: bool = False  # pycs: checked against their source when not as approved (stdlib.py's rule)


def _f(kind: str, path: str, message: str, **details: object) -> Finding:
    return Finding("integrity", kind, path, message, True, details)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def coverage(real: str, target: Target, stdlib_roots: Sequence[str]) -> str:
    """Which check walks the resolved path ``real`` (pure but for nothing: string tests only):
    ``site-packages``, ``venv``, ``stdlib``, or ``closure`` (walked here)."""
    if any(_inside(real, sp) for sp in target.site_packages):
        return "site-packages"
    if target.venv and _inside(real, target.venv):
        return "venv"
    pruned = [os.path.join(r, n) for r in stdlib_roots for n in ("site-packages", "dist-packages")]
    pruned.extend(target.base_site)
    if any(_inside(real, r) for r in stdlib_roots) and not any(_inside(real, p) for p in pruned):
        return "stdlib"
    return "closure"


def closure_entries(target: Target, stdlib_roots: Sequence[str]) -> list[list[str]]:
    """[path, resolved, origin, coverage] of each sys.path entry, then each editable target (pure
    but for realpath/exists)."""
    out: list[list[str]] = []
    items = [(p, o) for p, o in target.closure] + [(p, f"editable:{name}") for name, p, _ in target.editable]
    for path, origin in items:
        real = os.path.realpath(path)
        if not origin.startswith("editable:") and zip_entry(path):
            covered = "zip"  # stdlib.py: every zip on sys.path, by digest (or absent), and its start-up hooks
        else:
            covered = coverage(real, target, stdlib_roots) if os.path.lexists(path) else ABSENT
        out.append([path, real, origin, covered])
    return out


def closure_roots(entries: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The resolved closure entries, one inside another dropped (pure)."""
    roots: list[str] = []
    for real in sorted({e[1] for e in entries if e[3] == "closure"}):
        if not any(_inside(real, r) for r in roots):
            roots.append(real)
    return tuple(roots)


def collect_closure(
    target: Target,
    dists: Sequence[InstalledDist],
    stdlib_roots: Sequence[str],
    cache: IntegrityCache,
    full_pass: bool,
    pth_allow: Sequence[PthRule],
    unreadable: list[str],
    visited: set[str],
    budget: Budget | None = None,
    verify_pycs: bool = False,
) -> ClosureResult:
    """Walks and hashes the closure roots, and the path findings that need no baseline. Updates ``cache``."""
    result = ClosureResult()
    result.entries = closure_entries(target, stdlib_roots)
    result.roots = closure_roots(result.entries)
    prune = [*stdlib_roots, *target.site_packages, *([target.venv] if target.venv else [])]
    for root in result.roots:
        try:
            st = os.lstat(root)
        except OSError as exc:
            unreadable.append(f"{root}: cannot stat ({exc.strerror or exc})")
            continue
        if stat.S_ISDIR(st.st_mode):
            found = walk_tree(root, prune=[p for p in prune if _inside(p, root)], budget=budget)
            result.walked.update(found.files)
            unreadable.extend(found.unreadable)
            visited.update(found.dirs)
        else:
            result.walked[root] = st  # a zip or egg file on the path
    if verify_pycs:
        result.verified = True
        result.pyc_sources = derived_pyc_sources(result.walked)
    _hash(result.walked, cache, full_pass, budget, result, unreadable)
    result.findings.extend(pth_config_findings(target.pth_config, pth_allow, budget))
    result.findings.extend(editable_hooks(target))
    result.findings.extend(shadowing_findings(target, dists, result.entries))
    return result


def _hash(
    walked: Mapping[str, os.stat_result],
    cache: IntegrityCache,
    full_pass: bool,
    budget: Budget | None,
    result: ClosureResult,
    unreadable: list[str],
) -> None:
    now = time.time_ns()  # before any read: walk.settled
    for path, st in walked.items():
        kind = kind_of(st.st_mode)
        if kind not in ("file", "symlink"):
            result.files[path] = f"special:{kind}"
            continue
        cached = None if full_pass else cache.digest(path, stat_identity(st), "sha256")
        if cached is not None:
            result.files[path] = cached
            continue
        try:
            digest = safe_digest(path, "sha256", st, budget)
        except Oversized as exc:
            result.files[path] = f"oversized:{exc.size}"
            result.findings.append(oversized_finding(path, exc.size, budget.max_file_bytes if budget else 0))
            continue
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        result.files[path] = digest
        result.hashed += 1
        if settled(st, now):
            cache.put_digest(path, stat_identity(st), digest)


def pth_config_findings(paths: Iterable[str], allow: Sequence[PthRule], budget: Budget | None) -> list[Finding]:
    """``path_config`` for each ``._pth`` file beside the interpreter not allowed by its digest."""
    allowed = {r.sha256 for r in allow if r.sha256}
    out = []
    for path in paths:
        try:
            digest = sha256_hex(os.path.realpath(path), budget)
        except OSError as exc:
            digest = f"unreadable ({exc.strerror or exc})"
        if digest in allowed:
            continue
        message = (
            f"{path}: a ._pth file beside the interpreter replaces its whole import path (and turns site off "
            f"unless it says 'import site'); sha256 {digest}, not on integrity.pth_allow"
        )
        out.append(_f("path_config", path, message, sha256=digest))
    return out


def editable_hooks(target: Target) -> list[Finding]:
    """``startup_hook`` for an editable finder that maps a start-up hook module name."""
    out = []
    for name, path, finder in target.editable:
        if name in HOOK_NAMES:
            message = f"{finder}: maps {name} to {quote_untrusted(path)}: a startup hook imported at every start-up"
            out.append(_f("startup_hook", path, message, finder=finder))
    return out


def top_level_names(dist: InstalledDist) -> set[str]:
    """Top-level module names a distribution installs, from its RECORD paths (pure)."""
    out: set[str] = set()
    for entry in dist.record or ():
        head = entry.path.replace("\\", "/").split("/", 1)
        first = head[0]
        if len(head) == 2 and not first.endswith((".dist-info", ".data", ".egg-info")) and first != "__pycache__":
            if first.isidentifier() and not first.startswith(".."):
                out.add(first)
        elif len(head) == 1 and (m := _MODULE.match(first)) and not first.startswith("__editable__"):
            out.add(m.group(1))
    return out


def importable_names(directory: str) -> dict[str, str]:
    """Top-level name -> path of each module or regular package in ``directory`` (a namespace
    portion never shadows a regular package, so is not listed)."""
    out: dict[str, str] = {}
    try:
        with os.scandir(directory) as it:
            for count, entry in enumerate(it):
                if count > MAX_NAMES:
                    break
                name = entry.name
                if entry.is_dir():
                    if name.isidentifier() and any(
                        os.path.exists(os.path.join(entry.path, f"__init__.{s}")) for s in ("py", "pyc")
                    ):
                        out.setdefault(name, entry.path)
                elif m := _MODULE.match(name):
                    out.setdefault(m.group(1), entry.path)
    except OSError:
        pass
    return out


def shadowing_findings(
    target: Target, dists: Sequence[InstalledDist], entries: Sequence[Sequence[str]]
) -> list[Finding]:
    """``shadowing`` (see the module doc). A distribution's RECORD is read only when an entry ahead
    of its site directory provides modules at all (a plain venv has none: only the stdlib is ahead)."""
    path_entries = [e for e in entries if not e[2].startswith("editable:") and e[3] != ABSENT]
    position: dict[str, int] = {}
    for i, e in enumerate(path_entries):
        position.setdefault(e[1], i)
    provided = {
        i: names
        for i, e in enumerate(path_entries)
        if e[2] not in STDLIB_ORIGINS and os.path.isdir(e[1]) and (names := importable_names(e[1]))
    }
    if not provided:
        return []
    first = min(provided)
    owners: dict[str, list[tuple[int, str]]] = {}  # name -> (position of its site dir, owner)
    for dist in dists:
        where = position.get(os.path.realpath(dist.site_packages))
        if where is None or where <= first:
            continue
        for name in top_level_names(dist):
            owners.setdefault(name, []).append((where, f"{dist.name} {dist.version}"))
    stdlib_at = [i for i, e in enumerate(path_entries) if e[2] == "stdlib"]
    if stdlib_at and target.stdlib and stdlib_at[0] > first:
        for name in importable_names(target.stdlib):
            owners.setdefault(name, []).append((stdlib_at[0], "the stdlib"))
    editable = {name: path for name, path, _ in target.editable if "." not in name}
    out: list[Finding] = []
    for i, names in sorted(provided.items()):
        e = path_entries[i]
        for name, path in sorted(names.items()):
            ahead = [owner for where, owner in owners.get(name, ()) if where > i]
            if name in editable and os.path.realpath(path) != os.path.realpath(editable[name]):
                ahead.append(f"the editable install mapping {name} to {editable[name]}")
            if ahead:
                message = (
                    f"{path}: importable as {name} from {e[0]} ({e[2]}), ahead of {', '.join(sorted(set(ahead)))}: "
                    "it is the one Python imports"
                )
                out.append(_f("shadowing", path, message, module=name, entry=e[0], shadows=sorted(set(ahead))))
    return out


def closure_document(result: ClosureResult) -> dict[str, Any]:
    """What the approved baseline keeps of the closure (pure)."""
    return {
        "sys_path": [list(e[:3]) for e in result.entries],
        "roots": list(result.roots),
        "files": dict(result.files),
        "pyc": "verified" if result.verified else "hashed",
    }


def compare_closure(approved: Mapping[str, Any], now: Mapping[str, Any]) -> list[Finding]:
    """``syspath_changed`` and ``closure_*`` findings of the closure now against the approved one (pure)."""
    out: list[Finding] = []
    before_path = [list(e) for e in approved.get("sys_path") or ()]
    after_path = [list(e) for e in now.get("sys_path") or ()]
    if before_path != after_path:
        added = [e for e in after_path if e not in before_path]
        removed = [e for e in before_path if e not in after_path]
        subject = (added or removed or after_path or [["sys.path"]])[0][0]
        shown = "; ".join(f"+{e[0]} -> {e[1]} ({e[2]})" for e in added[:5])
        shown += ("; " if shown and removed else "") + "; ".join(f"-{e[0]} -> {e[1]} ({e[2]})" for e in removed[:5])
        message = (
            f"the interpreter's import path differs from the approved one ({shown or 'reordered'}); "
            "re-approve with --approve if intended"
        )
        out.append(_f("syspath_changed", subject, message, added=added, removed=removed))
    before: Mapping[str, str] = approved.get("files") or {}
    after: Mapping[str, str] = now.get("files") or {}
    if now.get("pyc") == "verified":  # one not as approved is checked against its source (bytecode.py)
        before = {p: d for p, d in before.items() if not is_derived_pyc_name(p)}
        after = {p: d for p, d in after.items() if not is_derived_pyc_name(p)}
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ABSENT), after.get(path, ABSENT)
        if old == new:
            continue
        if old == ABSENT:
            kind, why = "closure_added", "appeared in a directory on the import path since approval"
        elif new == ABSENT:
            kind, why = "closure_removed", "was removed from a directory on the import path since approval"
        else:
            kind, why = "closure_changed", "changed in a directory on the import path since approval"
        out.append(_f(kind, path, f"{path}: {why}", approved=old, now=new))
    return out
