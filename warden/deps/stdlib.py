"""The base interpreter's own files: its stdlib, the start-up files of its site directories, zips on sys.path.

Every Python a venv starts runs the base interpreter's stdlib: an edited ``json/__init__.py``, a
planted ``sitecustomize.py`` or a ``python3X.zip`` placed on the default ``sys.path`` (it comes
before the stdlib directory) runs in the audited environment without touching a distribution.
Nothing installed vouches for those files (the lock and RECORDs cover site-packages only), so
they are hashed and compared with the approved baseline (baseline.py stores this module's
:func:`stdlib_document`), by absolute path:

- ``stdlib_changed``: a file's content differs from the approved one (or the stdlib is now another
  interpreter's: other directories or another Python version, one finding for the whole stdlib);
- ``stdlib_added``: a file that was not there at approval (a new module, ``.pth``, ``.pyc``, zip);
- ``stdlib_removed``: an approved file is gone.

What is covered: every entry below ``sysconfig.get_paths()`` ``stdlib`` and ``platstdlib`` of the
target's base interpreter (links hashed as their target string, never followed; ``site-packages``
/ ``dist-packages`` below them, the target's site-packages and venv are not descended), the
``.pth`` files and ``sitecustomize``/``usercustomize`` modules at the top of the base
interpreter's site directories, and each ``.zip`` on ``sys.path`` (its digest, or ``absent``).
A ``sitecustomize``/``usercustomize`` member of such a zip is a ``startup_hook`` without any
baseline, as the same file in a directory is (interpreter.py).

Bytecode: when the auditor can compile the target's bytecode (same magic; the document says
``"pyc": "verified"``), a ``__pycache__/*.pyc`` is never ``stdlib_*`` (Python writes and removes those
on its own: a stdlib shipped without them gets one on each first import). Its digest is still kept,
and each one the target would load whose digest is not the approved one (written, regenerated or
replaced since approval) is checked against a compile of its source, as in site-packages
(bytecode.py): an absent or regenerated pyc is never a finding, a planted one is ``pyc_mismatch``,
and the approved ones cost no compile. Otherwise (``"pyc": "hashed"``) they are compared like any
other file.

A file over the per-file cap (walk.Budget) is never read: ``oversized`` (its digest in the document
is ``oversized:<size>``); a budget spent makes the audit incomplete.

Incremental like the rest of integrity: a file whose stat identity is unchanged keeps its cached
digest (cache.py); a full pass re-hashes everything. A digest is cached (and the whole set
remembered, ``stdlib_state``) only when it was read from the walked file itself and that file had
settled (walk.safe_digest with the walk's stat, walk.settled); a file that changed between the walk
and the read is ``unreadable`` ("changed during the audit": the audit is incomplete).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warden.deps.bytecode import derived_pyc_sources
from warden.deps.cache import IntegrityCache
from warden.deps.environment import Target
from warden.deps.integrity_common import oversized_finding
from warden.deps.interpreter import is_hook_name
from warden.deps.model import Finding
from warden.deps.syspath import zip_entry
from warden.deps.walk import (
    Budget,
    Oversized,
    kind_of,
    map_in_threads,
    safe_digest,
    settled,
    stat_fingerprint,
    walk_tree,
)
from warden.errors import quote_untrusted
from warden.safeio import open_regular, stat_identity

STDLIB_KINDS = ("stdlib_changed", "stdlib_added", "stdlib_removed")
ABSENT = "absent"
SITE_DIR_NAMES = ("site-packages", "dist-packages")
ZIP_LIMIT = 512 * 1024 * 1024


@dataclass
class StdlibResult:
    """``files``: path -> digest (RECORD form, ``absent`` for a sys.path zip that does not exist,
    ``special:<kind>`` for an entry never opened); ``findings``: zip start-up hooks."""

    roots: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    hashed: int = 0
    cached: int = 0
    pyc: str = "hashed"  # or "verified": derived pycs left to bytecode.py (the module doc)
    walked: dict[str, os.stat_result] = field(default_factory=dict)  # every entry walked, pycs too
    pyc_sources: dict[str, str] = field(default_factory=dict)  # derived pyc -> source, for bytecode.py


def stdlib_roots(target: Target) -> tuple[str, ...]:
    """The base interpreter's stdlib directories, a directory inside another one dropped (pure)."""
    candidates = sorted({p for p in (target.stdlib, target.platstdlib) if p})
    roots: list[str] = []
    for path in candidates:
        if not any(path == r or path.startswith(r + os.sep) for r in roots):
            roots.append(path)
    return tuple(roots)


def pruned_dirs(roots: Sequence[str], target: Target) -> tuple[str, ...]:
    """Directories below the stdlib roots that are not the stdlib: site directories (audited as the
    target's site-packages, or by their start-up files) and the target's venv (pure)."""
    own = [os.path.join(r, name) for r in roots for name in SITE_DIR_NAMES]
    return tuple(sorted({*own, *target.site_packages, *target.base_site, *([target.venv] if target.venv else [])}))


def stdlib_document(target: Target, result: StdlibResult) -> dict[str, Any]:
    """What the approved baseline keeps of the base interpreter (pure)."""
    return {
        "roots": list(result.roots),
        "python": python_identity(target),
        "files": dict(result.files),
        "pyc": result.pyc,
    }


def python_identity(target: Target) -> str:
    m = target.markers
    return f"{m.get('implementation_name')} {m.get('python_full_version')} {target.cache_tag}"


def _f(kind: str, path: str, message: str, **details: object) -> Finding:
    return Finding("integrity", kind, path, message, True, details)


def compare_stdlib(approved: Mapping[str, Any], now: Mapping[str, Any]) -> list[Finding]:
    """``stdlib_*`` findings of the base interpreter's files now against the approved ones (pure)."""
    roots_now = list(now.get("roots") or ())
    if approved.get("roots") != roots_now or approved.get("python") != now.get("python"):
        subject = roots_now[0] if roots_now else "stdlib"
        message = (
            f"{subject}: the base interpreter is {now.get('python')} with stdlib {roots_now}, approved as "
            f"{approved.get('python')} with {approved.get('roots')}; re-approve with --approve if intended"
        )
        return [_f("stdlib_changed", subject, message, approved=approved.get("roots"), now=roots_now)]
    before: Mapping[str, str] = approved.get("files") or {}
    after: Mapping[str, str] = now.get("files") or {}
    if now.get("pyc") == "verified":  # one not as approved is checked against its source (bytecode.py)
        before = {p: d for p, d in before.items() if not is_derived_pyc_name(p)}
        after = {p: d for p, d in after.items() if not is_derived_pyc_name(p)}
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ABSENT), after.get(path, ABSENT)
        if old == new:
            continue
        if old == ABSENT:
            kind, why = "stdlib_added", "appeared in the base interpreter since approval"
        elif new == ABSENT:
            kind, why = "stdlib_removed", "was removed from the base interpreter since approval"
        else:
            kind, why = "stdlib_changed", "changed in the base interpreter since approval"
        message = f"{path}: {why} (imported by every Python of this environment)"
        out.append(_f(kind, path, message, approved=old, now=new))
    return out


def is_derived_pyc_name(path: str) -> bool:
    """Whether ``path`` is named as a ``__pycache__`` pyc (pure)."""
    parent, _, name = path.rpartition(os.sep)
    return name.endswith(".pyc") and parent.rpartition(os.sep)[2] == "__pycache__"


def _startup_entries(site_dir: str) -> tuple[dict[str, os.stat_result], list[str]]:
    """``.pth`` files and start-up hook modules at the top of a base site directory (a hook
    package walked whole)."""
    files: dict[str, os.stat_result] = {}
    unreadable: list[str] = []
    try:
        with os.scandir(site_dir) as it:
            entries = list(it)
    except FileNotFoundError:
        return files, unreadable
    except OSError as exc:
        return files, [f"{site_dir}: cannot list directory ({exc.strerror or exc})"]
    for entry in entries:
        if not (entry.name.endswith(".pth") or is_hook_name(entry.name)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            unreadable.append(f"{entry.path}: cannot stat ({exc.strerror or exc})")
            continue
        if stat.S_ISDIR(st.st_mode):
            sub = walk_tree(entry.path)
            files.update(sub.files)
            unreadable.extend(sub.unreadable)
        else:
            files[entry.path] = st
    return files, unreadable


def zip_hooks(path: str, names: Sequence[str], digest_of: Callable[[str], str], allow: Sequence[str]) -> list[Finding]:
    """``startup_hook`` for each member of the sys.path zip ``path`` Python would import as
    ``sitecustomize``/``usercustomize`` (pure but for ``digest_of``, which reads a member)."""
    out = []
    for name in names:
        head, _, rest = name.partition("/")
        if not is_hook_name(head) or (rest and rest not in ("__init__.py", "__init__.pyc")):
            continue
        if not rest and "." not in head:
            continue  # a directory entry; its __init__ is a member of its own
        digest = digest_of(name)
        if digest in allow:
            continue
        subject = f"{path}/{name}"
        message = (
            f"{subject}: startup hook inside a zip on sys.path, imported at every interpreter start-up "
            f"(sha256 {digest}); not on startup_allow"
        )
        out.append(_f("startup_hook", subject, message, sha256=digest))
    return out


def _zip_findings(path: str, allow: Sequence[str], unreadable: list[str]) -> list[Finding]:
    try:
        with open_regular(path, max_bytes=ZIP_LIMIT) as fh, zipfile.ZipFile(fh) as zf:
            names = zf.namelist()

            def digest_of(name: str) -> str:
                return hashlib.sha256(zf.read(name)).hexdigest()

            return zip_hooks(path, names, digest_of, allow)
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError) as exc:
        unreadable.append(f"{path}: zip on sys.path not readable ({quote_untrusted(str(exc), 200)})")
        return []


def collect_stdlib(
    target: Target,
    cache: IntegrityCache,
    full_pass: bool,
    workers: int,
    startup_allow: Sequence[str],
    unreadable: list[str],
    visited: set[str] | None = None,
    budget: Budget | None = None,
    verify_pycs: bool = False,
) -> StdlibResult:
    """Digests of the base interpreter's files (see the module doc) and zip start-up hooks.
    Unreadable paths go to ``unreadable`` (the audit is then incomplete). Updates ``cache``.
    ``verify_pycs``: derived pycs are left to bytecode.py (``result.pyc_sources``)."""
    roots = stdlib_roots(target)
    result = StdlibResult(roots=roots)
    if not roots:
        return result
    walked: dict[str, os.stat_result] = {}
    prune = pruned_dirs(roots, target)
    for root in roots:  # the cache's listings are reset by the caller's walk on a full pass
        found = walk_tree(root, prune=prune, listings=cache.listings, budget=budget)
        walked.update(found.files)
        unreadable.extend(found.unreadable)
        cache.walked(found.relisted)
        if visited is not None:
            visited.update(found.dirs)
    own_sites = set(target.site_packages)
    for site_dir in [*(os.path.join(r, n) for r in roots for n in SITE_DIR_NAMES), *target.base_site]:
        if site_dir not in own_sites:
            files, bad = _startup_entries(site_dir)
            walked.update(files)
            unreadable.extend(bad)
    for entry in target.sys_path:
        if zip_entry(entry):
            path = os.path.realpath(entry)
            try:
                walked[path] = os.lstat(path)
            except FileNotFoundError:
                result.files[path] = ABSENT
            except OSError as exc:
                unreadable.append(f"{path}: cannot stat ({exc.strerror or exc})")
                continue
            if path in walked and stat.S_ISREG(walked[path].st_mode):
                result.findings.extend(_zip_findings(path, startup_allow, unreadable))
    result.walked = walked
    if verify_pycs:
        result.pyc = "verified"
        result.pyc_sources = derived_pyc_sources(walked)
    _digests(walked, cache, full_pass, workers, result, unreadable, budget)
    return result


def _digests(
    walked: Mapping[str, os.stat_result],
    cache: IntegrityCache,
    full_pass: bool,
    workers: int,
    result: StdlibResult,
    unreadable: list[str],
    budget: Budget | None = None,
) -> None:
    paths = list(walked)
    joined = "\0".join(paths)
    state = None if full_pass else cache.stdlib_state
    if state and state[0] == joined and state[2] == stat_fingerprint(paths, walked):
        digests = state[1].split("\0")  # every file as it was when all were last hashed
        result.files.update(zip(paths, digests, strict=True))
        result.cached += sum(1 for d in digests if not d.startswith("special:"))
        return
    bad = len(unreadable)
    todo: list[str] = []
    for path, st in walked.items():
        kind = kind_of(st.st_mode)
        if kind not in ("file", "symlink"):
            result.files[path] = f"special:{kind}"  # never opened: it could block
            continue
        cached = None if full_pass else cache.digest(path, stat_identity(st), "sha256")
        if cached is None:
            todo.append(path)
        else:
            result.files[path] = cached
            result.cached += 1

    def one(path: str) -> tuple[str, str | None, str | None]:
        try:  # the walked file only: anything else raises walk.Changed
            return path, safe_digest(path, "sha256", walked[path], budget), None
        except Oversized as exc:
            return path, f"oversized:{exc.size}", None
        except OSError as exc:
            return path, None, exc.strerror or str(exc)

    now = time.time_ns()  # before any read: walk.settled
    racy = False
    for path, digest, error in map_in_threads(one, todo, workers, "deps-stdlib"):
        if digest is not None and digest.startswith("oversized:") and budget is not None:
            result.files[path] = digest
            result.findings.append(oversized_finding(path, int(digest.partition(":")[2]), budget.max_file_bytes))
            racy = True  # never cached: read (or refused) again next time
            continue
        if digest is None:
            unreadable.append(f"{path}: {error}")
            continue
        result.files[path] = digest
        result.hashed += 1
        if settled(walked[path], now):
            cache.put_digest(path, stat_identity(walked[path]), digest)
        else:
            racy = True  # valid for this audit, not under its stat key: read again next time
    fingerprint = stat_fingerprint(paths, walked)
    if not racy and len(unreadable) == bad and fingerprint is not None and all(p in result.files for p in paths):
        cache.set_stdlib_state(joined, "\0".join(result.files[p] for p in paths), fingerprint)
