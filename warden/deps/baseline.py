"""The approved baseline: catches a file edited *and* its RECORD rewritten to match.

RECORD re-hashing alone cannot see that attack, and installed files carry nothing else to
compare with: the lock's hashes are of wheel archives, not of the files they unpack to.
So when an environment is approved (``warden deps audit --approve``, or the sidecar's
first clean audit with ``integrity.auto_approve``), every distribution's RECORD rows are
stored in the auditor's own state dir, out of the audited environment's reach. Later
audits compare each RECORD with the approved one: a changed row, an added or removed
file is ``record_changed``, even when the file matches its (rewritten) RECORD. Trust is
on first approval: a baseline taken of an already-tampered environment vouches for it.

Version 3 adds ``stdlib``: the base interpreter's own files (stdlib.py), compared by
:func:`warden.deps.stdlib.compare_stdlib`. A version 2 baseline is still read for its
distributions, but it cannot vouch for the stdlib: the audit is incomplete until re-approved.
Version 4 adds ``closure``: the approved ``sys.path`` and the files of the import-path directories
outside the stdlib, site-packages and venv (closure.py); a version 3 baseline cannot vouch for
them (incomplete until re-approved).

The audit reads the baseline once, first, and keeps its sha256 (:func:`read_baseline`); approving
writes a new one only if the file still has that digest (nothing else rewrote it meanwhile).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from packaging.version import InvalidVersion, Version

from warden.deps.closure import compare_closure
from warden.deps.errors import DepsIncomplete
from warden.deps.installed import InstalledDist
from warden.deps.model import Finding
from warden.deps.stdlib import compare_stdlib
from warden.logs import utc_timestamp
from warden.safeio import atomic_write_bytes

BASELINE_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)  # 2: no stdlib section; 3: no closure section (re-approve to cover them)


def dist_key(dist: InstalledDist) -> str:
    """``name==version``, both normalised: renaming the metadata folder (``Idna-3.7.dist-info``)
    or replacing it with an egg-info does not change which approved entry a dist is compared with."""
    try:
        version = str(Version(dist.version))
    except InvalidVersion:
        version = dist.version.strip()
    return f"{dist.canonical}=={version}"


def build_baseline(
    dists: Sequence[InstalledDist],
    now: float,
    environment: Mapping[str, str],
    stdlib: Mapping[str, Any] | None = None,
    closure: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The baseline document of ``dists``, the environment's own files, the base interpreter's
    (``stdlib``: :func:`warden.deps.stdlib.stdlib_document`) and the import closure's
    (``closure``: :func:`warden.deps.closure.closure_document`) (pure)."""
    entries = {}
    for dist in dists:
        files = {e.path: e.digest for e in dist.record or () if e.digest}
        entries[dist_key(dist)] = {
            "name": dist.name,
            "version": dist.version,
            "meta_dir": os.path.basename(dist.meta_dir),
            "record_sha256": dist.record_sha256,
            "files": files,
        }
    return {
        "version": BASELINE_VERSION,
        "approved_at": utc_timestamp(now),
        "distributions": entries,
        "environment": dict(environment),
        "stdlib": dict(stdlib or {}),
        "closure": dict(closure or {}),
    }


def save_baseline(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, json.dumps(doc, indent=1, sort_keys=True).encode())


def file_digest(path: str) -> str | None:
    """sha256 of the file at ``path`` (None if there is none). Raises OSError."""
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None


def read_baseline(path: str) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """(document or None, sha256 of the file or None, why it is unusable or None), read once."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, None, f"{path}: baseline unreadable ({exc}); re-approve with `warden deps audit --approve`"
    digest = hashlib.sha256(data).hexdigest()
    try:
        return parse_baseline(path, data), digest, None
    except DepsIncomplete as exc:
        return None, digest, str(exc)


def load_baseline(path: str) -> dict[str, Any] | None:
    """The baseline at ``path``, None if there is none. Raises DepsIncomplete if it is corrupt."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DepsIncomplete(
            f"{path}: baseline unreadable ({exc}); re-approve with `warden deps audit --approve`"
        ) from None
    return parse_baseline(path, data)


def parse_baseline(path: str, data: bytes) -> dict[str, Any]:
    """A baseline document from its bytes. Raises DepsIncomplete if it is corrupt."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise DepsIncomplete(
            f"{path}: baseline unreadable ({exc}); re-approve with `warden deps audit --approve`"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("version") not in READABLE_VERSIONS
        or not isinstance(doc.get("distributions"), dict)
        or not isinstance(doc.get("stdlib", {}), dict)
        or not isinstance(doc.get("closure", {}), dict)
    ):
        raise DepsIncomplete(f"{path}: not a version {BASELINE_VERSION} baseline; re-approve with --approve")
    return doc


def _dist_changes(dist: InstalledDist, approved: dict[str, Any]) -> list[Finding]:
    now = {e.path: e.digest for e in dist.record or () if e.digest}
    before = approved.get("files") or {}
    out = []
    if approved.get("meta_dir") not in (None, os.path.basename(dist.meta_dir)):
        message = f"{dist.meta_dir}: approved as {approved.get('meta_dir')}; the metadata folder was replaced"
        out.append(Finding("integrity", "record_changed", dist.meta_dir, message, True, {"dist": dist.canonical}))
    for path in sorted(set(now) | set(before)):
        if now.get(path) == before.get(path):
            continue
        full = os.path.normpath(os.path.join(dist.site_packages, path))
        if path not in before:
            why = "was added to RECORD after approval"
        elif path not in now:
            why = "was removed from RECORD after approval"
        else:
            why = "changed in RECORD after approval: the file was modified and RECORD rewritten to match"
        details = {"dist": dist.canonical, "approved": before.get(path), "now": now.get(path)}
        out.append(
            Finding("integrity", "record_changed", full, f"{full}: {why} ({dist.name} {dist.version})", True, details)
        )
    return out


def compare_baseline(
    dists: Sequence[InstalledDist],
    doc: dict[str, Any],
    environment: Mapping[str, str] | None = None,
    stdlib: Mapping[str, Any] | None = None,
    closure: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Blocking findings against ``doc`` (pure): ``record_changed`` (a RECORD or its folder differs),
    ``not_in_baseline`` (a distribution added since approval), ``removed_from_baseline`` (an
    approved one gone), ``environment_changed`` (a venv file or the base interpreter differs),
    ``stdlib_changed``/``stdlib_added``/``stdlib_removed`` (the base interpreter's files, when
    ``stdlib`` is given and ``doc`` has them: see :func:`stdlib_approved`)."""
    approved: dict[str, Any] = doc.get("distributions") or {}
    out: list[Finding] = []
    seen: set[str] = set()
    for dist in dists:
        key = dist_key(dist)
        entry = approved.get(key)
        if entry is None:
            message = (
                f"{dist.name} {dist.version} ({dist.meta_dir}) was installed after the baseline was approved "
                f"({doc.get('approved_at')}); re-approve with --approve if intended"
            )
            out.append(Finding("integrity", "not_in_baseline", dist.canonical, message, True, {"key": key}))
            continue
        if key in seen:
            message = f"{dist.meta_dir}: a second installation of {key}, approved once"
            out.append(Finding("integrity", "not_in_baseline", dist.canonical, message, True, {"key": key}))
            continue
        seen.add(key)
        if entry.get("record_sha256") != dist.record_sha256 or entry.get("meta_dir") != os.path.basename(dist.meta_dir):
            out.extend(_dist_changes(dist, entry))
    for key in sorted(set(approved) - seen):
        message = f"{key} was approved ({doc.get('approved_at')}) but is no longer installed"
        out.append(Finding("integrity", "removed_from_baseline", key.partition("==")[0], message, True, {"key": key}))
    if environment is not None:
        out.extend(_environment_changes(doc.get("environment") or {}, environment))
    if stdlib is not None and stdlib_approved(doc):
        out.extend(compare_stdlib(doc["stdlib"], stdlib))
    if closure is not None and closure_approved(doc):
        out.extend(compare_closure(doc["closure"], closure))
    return out


def closure_approved(doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` vouches for the import closure (a version 2 or 3 baseline does not)."""
    return (
        doc.get("version") == BASELINE_VERSION and isinstance(doc.get("closure"), dict) and "sys_path" in doc["closure"]
    )


def stdlib_approved(doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` vouches for the base interpreter's files (a version 2 baseline does not)."""
    return doc.get("version") in (3, BASELINE_VERSION) and bool(doc.get("stdlib"))


def _environment_changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[Finding]:
    out = []
    for path in sorted(set(before) | set(now)):
        if before.get(path) == now.get(path):
            continue
        why = "appeared" if path not in before else ("disappeared" if path not in now else "changed")
        message = f"{path}: {why} since the baseline was approved (a venv file or the base interpreter)"
        details = {"approved": before.get(path), "now": now.get(path)}
        out.append(Finding("integrity", "environment_changed", path, message, True, details))
    return out
