"""The approved baseline: catches a file edited *and* its RECORD rewritten to match.

RECORD re-hashing alone cannot see that attack, and installed files carry nothing else to
compare with: the lock's hashes are of wheel archives, not of the files they unpack to.
So when an environment is approved (``warden deps audit --approve``, or the sidecar's
first clean audit with ``integrity.auto_approve``), every distribution's RECORD rows are
stored in the auditor's own state dir, out of the audited environment's reach. Later
audits compare each RECORD with the approved one: a changed row, an added or removed
file is ``record_changed``, even when the file matches its (rewritten) RECORD. Trust is
on first approval: a baseline taken of an already-tampered environment vouches for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from sidecars.deps.errors import DepsIncomplete
from sidecars.deps.installed import InstalledDist
from sidecars.deps.model import Finding
from trainer.events import atomic_write_bytes, utc_timestamp

BASELINE_VERSION = 1


def build_baseline(dists: Sequence[InstalledDist], now: float) -> dict[str, Any]:
    """The baseline document of ``dists`` (pure)."""
    entries = {}
    for dist in dists:
        if dist.record is None:
            continue
        files = {e.path: e.digest for e in dist.record if e.digest}
        entries[dist.key] = {
            "name": dist.name,
            "version": dist.version,
            "record_sha256": dist.record_sha256,
            "files": files,
        }
    return {"version": BASELINE_VERSION, "approved_at": utc_timestamp(now), "distributions": entries}


def save_baseline(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, json.dumps(doc, indent=1, sort_keys=True).encode())


def load_baseline(path: str) -> dict[str, Any] | None:
    """The baseline at ``path``, None if there is none. Raises DepsIncomplete if it is corrupt."""
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DepsIncomplete(
            f"{path}: baseline unreadable ({exc}); re-approve with `warden deps audit --approve`"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("version") != BASELINE_VERSION
        or not isinstance(doc.get("distributions"), dict)
    ):
        raise DepsIncomplete(f"{path}: not a version {BASELINE_VERSION} baseline; re-approve with --approve")
    return doc


def _dist_changes(dist: InstalledDist, approved: dict[str, Any]) -> list[Finding]:
    now = {e.path: e.digest for e in dist.record or () if e.digest}
    before = approved.get("files") or {}
    out = []
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


def compare_baseline(dists: Sequence[InstalledDist], doc: dict[str, Any]) -> list[Finding]:
    """Findings ``record_changed`` (blocking) and ``not_in_baseline`` (warning) against ``doc`` (pure)."""
    approved: dict[str, Any] = doc.get("distributions") or {}
    out: list[Finding] = []
    for dist in dists:
        if dist.record is None:
            continue
        entry = approved.get(dist.key)
        if entry is None:
            message = (
                f"{dist.name} {dist.version} was installed after the baseline was approved ({doc.get('approved_at')})"
            )
            out.append(Finding("integrity", "not_in_baseline", dist.canonical, message, False))
        elif entry.get("record_sha256") != dist.record_sha256:
            out.extend(_dist_changes(dist, entry))
    return out
