"""Lock hygiene (pure): exact pins, sha256 hashes, no URL/VCS/editable entries unless
allowed, duplicates and conflicting pins, markers evaluated for each target platform.

``platforms`` are marker environments (``python_version``, ``sys_platform``,
``platform_machine``...), each completed from the target's own environment, so a lock
meant for linux x86_64 is judged for linux x86_64 even when audited on another machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from warden.deps.locks import Lock, LockedPackage
from warden.deps.model import Finding
from warden.errors import quote_untrusted

LOCK_KINDS = (
    "malformed",
    "not_pinned",
    "missing_hash",
    "weak_hash",
    "url",
    "vcs",
    "editable",
    "directory",
    "duplicate",
    "conflicting_pins",
    "prerelease",
    "extras",
    "requires_python",
    "unsupported_platform",
    "unsupported_include",
    "index_option",
    "insecure_url",
    "sdist_only",
)
_SOURCE_RULE = {"url": "allow_url", "vcs": "allow_vcs", "editable": "allow_editable", "directory": "allow_local"}


@dataclass(frozen=True)
class HygieneRules:
    allow_url: bool = False
    allow_vcs: bool = False
    allow_editable: bool = False
    allow_local: bool = False
    allow_prereleases: bool = False
    allowed_indexes: tuple[str, ...] = ("https://pypi.org/simple",)
    allow_http: bool = False


def evaluate_marker(marker: str | None, env: Mapping[str, str]) -> bool:
    """Whether ``marker`` holds in ``env`` (``extra`` is empty). Raises ValueError if it cannot be evaluated."""
    if not marker:
        return True
    try:
        return Marker(marker).evaluate({**env, "extra": ""})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName, InvalidVersion) as exc:
        raise ValueError(f"marker {marker!r} cannot be evaluated: {exc}") from None


def _lock(kind: str, pkg: LockedPackage, message: str, blocking: bool = True, **details: object) -> Finding:
    return Finding("lock", kind, pkg.canonical, f"{pkg.where}: {message}", blocking, {"name": pkg.name, **details})


def _entry_findings(pkg: LockedPackage, rules: HygieneRules) -> list[Finding]:
    out: list[Finding] = []
    allowed = pkg.source == "registry" or getattr(rules, _SOURCE_RULE.get(pkg.source, ""), False)
    if not allowed:
        out.append(_lock(pkg.source, pkg, f"{pkg.name} comes from a {pkg.source} entry ({pkg.url}), not an index"))
    if pkg.version is None and pkg.source == "registry":
        why = "=== is arbitrary equality, not a version pin" if "===" in pkg.spec else "not pinned"
        out.append(_lock("not_pinned", pkg, f"{pkg.name}{pkg.spec}: {why}; pin it exactly with =="))
    if not pkg.hashes and pkg.source not in ("editable", "directory", "vcs"):
        out.append(_lock("missing_hash", pkg, f"{pkg.name} has no --hash; pip --require-hashes would refuse it"))
    elif pkg.hashes and not pkg.sha256_complete:
        out.append(_lock("weak_hash", pkg, f"{pkg.name}: a sha256 hash is required for every file"))
    if pkg.extras:
        extras = ",".join(pkg.extras)
        message = f"{pkg.name}[{extras}]: extras in a lock are redundant; list their dependencies as pins"
        out.append(_lock("extras", pkg, message, blocking=False))
    if pkg.version is not None:
        try:
            pre = Version(pkg.version).is_prerelease
        except InvalidVersion:
            out.append(_lock("malformed", pkg, f"{pkg.name}=={pkg.version}: not a PEP 440 version"))
            pre = False
        if pre and not rules.allow_prereleases:
            message = f"{pkg.name}=={pkg.version} is a pre-release (lock.allow_prereleases is false)"
            out.append(_lock("prerelease", pkg, message))
    return out


def _insecure(url: str | None) -> bool:
    return bool(url) and str(url).strip().lower().startswith(("http://", "ftp://"))


def _url_findings(pkg: LockedPackage, rules: HygieneRules) -> list[Finding]:
    """Plain-http artifact, index or direct URLs of one entry: a network attacker swaps the file."""
    if rules.allow_http:
        return []
    bad = sorted({u for u in (pkg.url, *pkg.urls) if u and _insecure(u)})
    return [_lock("insecure_url", pkg, f"{pkg.name}: {quote_untrusted(u)} is not https (lock.allow_http)") for u in bad]


def option_findings(lock: Lock, rules: HygieneRules) -> list[Finding]:
    """Index options of a requirements lock (``--index-url``, ``--extra-index-url``,
    ``--find-links``, ``--trusted-host``): where pip looks is part of what is locked, so
    each must be on ``lock.allowed_indexes``; a plain-http one is also ``insecure_url``."""
    out = []
    allowed = {a.rstrip("/") for a in rules.allowed_indexes}
    for opt in lock.options:
        value = (opt.value or "").strip()
        shown = f"{opt.option} {quote_untrusted(value)}"
        details = {"option": opt.option, "value": value}
        if value.rstrip("/") not in allowed:
            message = f"{opt.where}: {shown} changes where pip looks for packages; not on lock.allowed_indexes"
            out.append(Finding("lock", "index_option", opt.where, message, True, details))
        if _insecure(value) and not rules.allow_http:
            message = f"{opt.where}: {shown} is not https (lock.allow_http)"
            out.append(Finding("lock", "insecure_url", opt.where, message, True, details))
    return out


def _platform_findings(lock: Lock, env: Mapping[str, str], label: str) -> list[Finding]:
    out: list[Finding] = []
    by_name: dict[str, list[LockedPackage]] = {}
    for pkg in lock.packages:
        try:
            if evaluate_marker(pkg.marker, env):
                by_name.setdefault(pkg.canonical, []).append(pkg)
        except ValueError as exc:
            out.append(_lock("malformed", pkg, str(exc)))
    for name, entries in sorted(by_name.items()):
        if len(entries) < 2:
            continue
        versions = sorted({e.version or e.spec for e in entries})
        places = ", ".join(e.where for e in entries)
        if len(versions) == 1:
            message = f"{name} is listed {len(entries)} times for {label} ({places})"
            out.append(Finding("lock", "duplicate", name, message, True, {"where": places}))
        else:
            message = f"{name} has conflicting pins for {label}: {' vs '.join(versions)} ({places})"
            out.append(Finding("lock", "conflicting_pins", name, message, True, {"versions": versions}))
    out.extend(_python_findings(lock, env, label))
    return out


def _python_findings(lock: Lock, env: Mapping[str, str], label: str) -> list[Finding]:
    out: list[Finding] = []
    full = env.get("python_full_version") or env.get("python_version", "")
    if lock.requires_python and full:
        try:
            if not SpecifierSet(lock.requires_python).contains(full, prereleases=True):
                message = f"{lock.path}: requires-python {lock.requires_python} excludes Python {full} ({label})"
                out.append(Finding("lock", "requires_python", lock.path, message))
        except (InvalidSpecifier, InvalidVersion) as exc:
            out.append(Finding("lock", "malformed", lock.path, f"{lock.path}: requires-python: {exc}"))
    if lock.environments:
        try:
            ok = any(evaluate_marker(m, env) for m in lock.environments)
        except ValueError as exc:
            out.append(Finding("lock", "malformed", lock.path, f"{lock.path}: environments: {exc}"))
            ok = True
        if not ok:
            message = f"{lock.path}: none of the lock's environments matches {label}"
            out.append(Finding("lock", "unsupported_platform", lock.path, message))
    return out


def platform_label(env: Mapping[str, str]) -> str:
    keys = ("python_version", "sys_platform", "platform_machine")
    return "/".join(env.get(k, "?") for k in keys)


def check_lock(lock: Lock, rules: HygieneRules, platforms: Sequence[Mapping[str, str]]) -> list[Finding]:
    """Every hygiene finding of ``lock`` for each platform in ``platforms`` (complete marker envs)."""
    out = [Finding("lock", p.kind, p.where, p.message) for p in lock.problems]
    out.extend(option_findings(lock, rules))
    for pkg in lock.packages:
        out.extend(_entry_findings(pkg, rules))
        out.extend(_url_findings(pkg, rules))
    seen: set[tuple[str, str, str]] = set()
    for env in platforms:
        for f in _platform_findings(lock, env, platform_label(env)):
            key = (f.kind, f.subject, f.message.split(" for ")[0])
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def sdist_findings(packages: Sequence[LockedPackage], allow: Sequence[str]) -> list[Finding]:
    """``sdist_only`` for each entry that pins only an sdist (pure): what is installed was built
    locally from it, so no published artifact's hash vouches for the installed files (a rebuilt
    wheel of the right version is approved as readily as the real build). Blocking unless its
    name is on ``allow`` (``lock.allow_sdist_only``), then a warning that still says so."""
    allowed = {canonicalize_name(a) for a in allow}
    out = []
    for pkg in packages:
        if not pkg.sdist_only:
            continue
        ok = pkg.canonical in allowed
        message = (
            f"{pkg.name} {pkg.version or pkg.spec} ({pkg.where}): the lock pins only an sdist "
            f"({quote_untrusted(pkg.sdist_only, 200)}); it is built locally, and no locked wheel vouches for "
            f"the installed files{'' if ok else '; not on lock.allow_sdist_only'}"
        )
        details = {"built_from": pkg.sdist_only, "version": pkg.version, "allowed": ok}
        out.append(Finding("lock", "sdist_only", pkg.canonical, message, not ok, details))
    return out


def applicable_packages(lock: Lock, env: Mapping[str, str]) -> list[LockedPackage]:
    """The entries whose markers hold in ``env``; entries whose marker cannot be evaluated are kept."""
    out = []
    for pkg in lock.packages:
        try:
            keep = evaluate_marker(pkg.marker, env)
        except ValueError:
            keep = True
        if keep:
            out.append(pkg)
    return out
