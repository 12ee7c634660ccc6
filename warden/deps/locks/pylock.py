"""PEP 751 ``pylock.toml`` locks.

Each package is validated on its own with ``packaging.pylock`` where that module exists
(packaging >= 25), else with the checks below, so one bad entry becomes one problem and
the rest of the lock is still audited. PEP 751 asks for "at least one hash"; we require a
``sha256`` on every wheel, sdist and archive ourselves (hygiene reports the rest).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from typing import Any

from packaging.markers import InvalidMarker, Marker
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from warden.deps.locks import Lock, LockedPackage, LockError, LockProblem, LockSource

try:  # packaging >= 25
    from packaging import pylock as _pylock
except ImportError:  # pragma: no cover - exercised by monkeypatching HAVE_PACKAGING_PYLOCK
    _pylock = None  # type: ignore[assignment]

HAVE_PACKAGING_PYLOCK = _pylock is not None
_TOP_KEYS = ("lock-version", "environments", "requires-python", "extras", "dependency-groups", "default-groups")


class PylockSource(LockSource):
    format = "pylock"

    @classmethod
    def handles(cls, path: str) -> bool:
        base = os.path.basename(path)
        return base == "pylock.toml" or (base.startswith("pylock.") and base.endswith(".toml"))

    def parse(self, text: str, path: str) -> Lock:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise LockError(f"{path}: not valid TOML: {exc}") from None
        top = {k: doc[k] for k in (*_TOP_KEYS, "created-by") if k in doc}
        error = _validate({**top, "packages": []})
        if error:
            raise LockError(f"{path}: not a valid pylock file: {error}")
        raw_packages = doc.get("packages")
        if not isinstance(raw_packages, list):
            raise LockError(f"{path}: packages: expected an array of tables ([[packages]])")
        packages: list[LockedPackage] = []
        problems: list[LockProblem] = []
        for i, raw in enumerate(raw_packages):
            where = f"{path}: packages[{i}]"
            if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                where += f" ({raw['name']})"
            error = _validate({**top, "packages": [raw]})
            if error:
                problems.append(LockProblem(where, "malformed", f"{where}: {error}"))
                continue
            packages.append(_entry(raw, where))
        envs = doc.get("environments") or []
        return Lock(
            path=path,
            format=self.format,
            packages=tuple(packages),
            problems=tuple(problems),
            environments=tuple(str(e) for e in envs),
            requires_python=doc.get("requires-python"),
        )


def _validate(doc: Mapping[str, Any]) -> str | None:
    """The validation error of ``doc`` (a pylock with zero or one package), else None."""
    if _pylock is not None and HAVE_PACKAGING_PYLOCK:
        try:
            _pylock.Pylock.from_dict(doc)
        except _pylock.PylockValidationError as exc:
            return str(exc)
        return None
    return _validate_fallback(doc)


def _validate_fallback(doc: Mapping[str, Any]) -> str | None:
    """The subset of PEP 751 validation we rely on, for packaging without ``pylock``."""
    version = doc.get("lock-version")
    if not isinstance(version, str):
        return "lock-version: required string is missing"
    try:
        if not Version("1") <= Version(version) < Version("2.dev0"):
            return f"pylock version {version} is not supported"
    except InvalidVersion:
        return f"lock-version: invalid version {version!r}"
    if not isinstance(doc.get("created-by"), str):
        return "created-by: required string is missing"
    for i, env in enumerate(doc.get("environments") or []):
        try:
            Marker(env)
        except (InvalidMarker, TypeError) as exc:
            return f"environments[{i}]: {exc}"
    for raw in doc.get("packages") or []:
        error = _validate_package_fallback(raw)
        if error:
            return error
    return None


def _validate_package_fallback(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return "expected a table"
    name = raw.get("name")
    if not isinstance(name, str):
        return "name: required string is missing"
    if canonicalize_name(name) != name:
        return f"Name {name!r} is not normalized"
    try:
        if "version" in raw:
            Version(str(raw["version"]))
        if "marker" in raw:
            Marker(str(raw["marker"]))
    except (InvalidVersion, InvalidMarker) as exc:
        return str(exc)
    files = [*(raw.get("wheels") or []), *([raw["sdist"]] if "sdist" in raw else [])]
    direct = [k for k in ("vcs", "directory", "archive") if k in raw]
    if files and direct:
        return "None of vcs, directory, archive must be set if sdist or wheels are set"
    if not files and len(direct) != 1:
        return "Exactly one of vcs, directory, archive must be set if sdist and wheels are not set"
    for item in [*files, *([raw["archive"]] if "archive" in raw else [])]:
        if not isinstance(item, dict) or not isinstance(item.get("hashes"), dict) or not item["hashes"]:
            return "At least one hash must be provided"
    return None


def _artifact_hashes(raw: Mapping[str, Any]) -> tuple[list[str], bool]:
    """(every ``algo:hex`` of the package's files, whether each file has a sha256)."""
    artifacts = [*(raw.get("wheels") or []), *(x for x in (raw.get("sdist"), raw.get("archive")) if x)]
    hashes: list[str] = []
    every_sha256 = bool(artifacts)
    for art in artifacts:
        found = art.get("hashes") or {}
        every_sha256 = every_sha256 and isinstance(found.get("sha256"), str)
        hashes.extend(f"{algo}:{value}" for algo, value in sorted(found.items()))
    return hashes, every_sha256


def _entry(raw: Mapping[str, Any], where: str) -> LockedPackage:
    name = str(raw["name"])
    hashes, every_sha256 = _artifact_hashes(raw)
    source, url = "registry", None
    if "vcs" in raw:
        source, url = "vcs", raw["vcs"].get("url") or raw["vcs"].get("path")
    elif "directory" in raw:
        source = "editable" if raw["directory"].get("editable") else "directory"
        url = raw["directory"].get("path")
    elif "archive" in raw:
        source, url = "url", raw["archive"].get("url") or raw["archive"].get("path")
    version = str(raw["version"]) if "version" in raw else None
    artifacts = [*(raw.get("wheels") or []), *(x for x in (raw.get("sdist"), raw.get("archive")) if x)]
    urls = [str(a["url"]) for a in artifacts if isinstance(a, dict) and a.get("url")]
    if isinstance(raw.get("index"), str):
        urls.append(raw["index"])
    if "vcs" in raw and raw["vcs"].get("url"):
        urls.append(str(raw["vcs"]["url"]))
    return LockedPackage(
        name=name,
        canonical=canonicalize_name(name),
        version=version,
        spec=f"=={version}" if version else "",
        where=where,
        marker=str(raw["marker"]) if raw.get("marker") else None,
        hashes=tuple(hashes),
        source=source,
        url=url,
        sha256_complete=every_sha256,
        urls=tuple(urls),
        sdist_only=_sdist_only(raw, name, version),
    )


def _sdist_only(raw: Mapping[str, Any], name: str, version: str | None) -> str | None:
    """What names the sdist of an entry that pins an sdist and no wheel (pure), else None."""
    sdist = raw.get("sdist")
    if not isinstance(sdist, dict) or raw.get("wheels"):
        return None
    for key in ("name", "url", "path"):
        if isinstance(sdist.get(key), str) and sdist[key]:
            return str(sdist[key])
    return f"the sdist of {name} {version or ''}".strip()
