"""Drift (pure): installed distributions vs the lock entries that apply to the target.

Names compare by PEP 503 canonical form; versions by ``packaging.version.Version``
equality, which keeps local labels: ``2.13.0+cpu`` differs from ``2.13.0`` (a
``SpecifierSet("==2.13.0")`` would accept both). pip, setuptools and wheel are compared
like any other package (``pip freeze`` hides them).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from warden.deps.installed import InstalledDist
from warden.deps.locks import LockedPackage
from warden.deps.model import Finding

DRIFT_KINDS = ("missing", "extra", "wrong_version", "duplicate_install", "broken", "not_locked_artifact")


def same_version(a: str, b: str) -> bool:
    """PEP 440 equality including the local label; plain string equality for non-PEP 440 versions."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.strip() == b.strip()


def matches_any(name: str, patterns: Sequence[str]) -> bool:
    """Whether canonical ``name`` matches one of the (canonicalized) glob patterns."""
    return any(fnmatch.fnmatchcase(name, canonicalize_name(p) if "*" not in p else p.lower()) for p in patterns)


def check_drift(
    expected: Sequence[LockedPackage],
    installed: Sequence[InstalledDist],
    allow_extra: Sequence[str] = (),
    ignore_missing: Sequence[str] = (),
) -> list[Finding]:
    """Findings of kinds ``missing``, ``extra``, ``wrong_version``, ``duplicate_install``, ``broken``."""
    out: list[Finding] = []
    by_name: dict[str, list[InstalledDist]] = {}
    for dist in installed:
        by_name.setdefault(dist.canonical, []).append(dist)
        if dist.problem and dist.version == "?":
            out.append(Finding("drift", "broken", dist.canonical, dist.problem))
    locked: dict[str, LockedPackage] = {}
    for pkg in expected:
        locked.setdefault(pkg.canonical, pkg)
    for name, dists in sorted(by_name.items()):
        if len(dists) > 1:
            places = ", ".join(f"{d.version} in {d.meta_dir}" for d in dists)
            out.append(Finding("drift", "duplicate_install", name, f"{name} is installed {len(dists)} times: {places}"))
        pin = locked.get(name)
        for dist in dists:
            if pin is None:
                if not matches_any(name, allow_extra):
                    message = f"{dist.name} {dist.version} is installed but not in the lock (nor in drift.allow_extra)"
                    out.append(Finding("drift", "extra", name, message, True, {"installed": dist.version}))
            elif pin.version is not None and not same_version(dist.version, pin.version):
                message = f"{dist.name} {dist.version} is installed, the lock pins {pin.version} ({pin.where})"
                details = {"installed": dist.version, "locked": pin.version}
                out.append(Finding("drift", "wrong_version", name, message, True, details))
    for name, pkg in sorted(locked.items()):
        if name not in by_name and not matches_any(name, ignore_missing):
            message = f"{pkg.name} {pkg.version or pkg.spec} is in the lock ({pkg.where}) but not installed"
            out.append(Finding("drift", "missing", name, message, True, {"locked": pkg.version}))
    return out


def normal_hash(value: str) -> str:
    algo, _, digest = value.replace("=", ":", 1).partition(":")
    return f"{algo.lower()}:{digest.lower()}"


def check_artifacts(expected: Sequence[LockedPackage], installed: Sequence[InstalledDist]) -> list[Finding]:
    """``not_locked_artifact``: a distribution installed from an archive whose hash
    (``direct_url.json``, PEP 610) is none of the lock's hashes for it: a rebuilt wheel of
    the right name and version. Index installs record no archive hash; the approved baseline
    covers them. Pure."""
    locked = {p.canonical: p for p in expected}
    out: list[Finding] = []
    for dist in installed:
        pin = locked.get(dist.canonical)
        if pin is None or not dist.archive_hashes or not pin.hashes:
            continue
        ours = {normal_hash(h) for h in dist.archive_hashes}
        if ours & {normal_hash(h) for h in pin.hashes}:
            continue
        message = (
            f"{dist.name} {dist.version} was installed from {dist.direct_url} whose hash "
            f"({', '.join(sorted(ours))}) is not in the lock ({pin.where})"
        )
        details = {"installed": sorted(ours), "locked": list(pin.hashes), "url": dist.direct_url}
        out.append(Finding("drift", "not_locked_artifact", dist.canonical, message, True, details))
    return out
