"""What the integrity check's modules share (integrity.py ties them): its options and stats, the
worker count, path and glob helpers, and the findings more than one of them makes."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from warden.deps.installed import InstalledDist
from warden.deps.model import Finding
from warden.deps.pth import SETUPTOOLS_PTH, PthRule
from warden.deps.walk import Budget

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
    budget: Budget | None = field(default=None, compare=False)  # walk.Budget: what the audit may read


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
    dists_cached: int = 0
    closure_roots: int = 0  # import-path directories outside the stdlib, site-packages and venv (closure.py)
    closure_files: int = 0
    oversized: int = 0  # judged whole by their fingerprint (dist_state), RECORD not parsed
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def workers(requested: int) -> int:
    return requested if requested > 0 else max(2, min(8, (os.cpu_count() or 2)))


@functools.lru_cache(maxsize=16)
def glob_matcher(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """One compiled regex for a policy's glob list (``fnmatchcase`` semantics, matched at once)."""
    if not patterns:
        return lambda _rel: None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (a slice when it lies below, as nearly every path does)."""
    prefix = root.rstrip(os.sep) + os.sep
    return path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, root)


def lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def special_finding(path: str, kind: str) -> Finding:
    message = f"{path}: a {kind} in the environment (never opened: reading it could block or run nothing we can hash)"
    return Finding("integrity", "special_file", path, message, True, {"type": kind})


def tampered_finding(path: str, dist: InstalledDist, why: str) -> Finding:
    message = f"{path}: {why} (owned by {dist.name} {dist.version}); the installed file was modified"
    return Finding("integrity", "tampered", path, message, True, {"dist": dist.canonical})


def oversized_finding(path: str, size: int, cap: int) -> Finding:
    message = (
        f"{path}: {size} bytes, over the per-file cap of {cap} (integrity.max_file_bytes): never read, "
        "so nothing vouches for its content"
    )
    return Finding("integrity", "oversized", path, message, True, {"size": size, "cap": cap})
