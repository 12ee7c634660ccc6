"""The vocabulary of ``warden audit``: a :class:`Break` per finding, and the reads every check shares.

The attacker in mind holds a bucket credential (or write access to a ``file://`` store)
but not the signing key: they can delete objects (or put delete markers on them), copy
old versions over current ones, and put arbitrary bytes, but cannot sign a record or a head.
The checks: :mod:`~warden.archive.lookup` (one step, the list of steps),
:mod:`~warden.archive.verify` (the whole run; the kinds of findings are listed there) and
:mod:`~warden.archive.anchor` (the journal as a witness of what was emitted).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from warden.archive.errors import ObjectRefused, RecordInvalid
from warden.archive.record import Head, clip, head_key
from warden.archive.signing import verify_head
from warden.archive.store import Store, VersionEntry
from warden.signing.keys import TrustedKeys

MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Break:
    """One problem found: at which step, what kind, and a sentence for humans."""

    step: int | None
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "message": self.message}


def code_kind(exc: RecordInvalid) -> str:
    return exc.code if exc.code in ("wrong_key", "malformed", "missing") else "altered"


def deleted_note(entries: list[VersionEntry]) -> str:
    """' (a delete marker hides N retained version(s) of it)' when ``entries`` (one key's) show one."""
    if not entries or not any(e.is_delete_marker and e.is_latest for e in entries):
        return ""
    kept = sum(1 for e in entries if not e.is_delete_marker)
    return f" (a delete marker hides {kept} retained version(s) of it)" if kept else ""  # else: never stored


def key_versions(store: Store, key: str) -> list[VersionEntry]:
    """The versions of exactly ``key``; empty where the store keeps none."""
    listed = store.list_versions(key)
    return [e for e in listed or [] if e.key == key]


@dataclass(frozen=True)
class HeadRead:
    """The run's current head as read: the verified head (None when absent or bad), the version
    read, the problem found, whether an object is there, and the MD5 of its bytes."""

    head: Head | None
    version: str | None
    problem: Break | None
    present: bool
    content_md5: str | None = None


def read_head(store: Store, run_id: str, trusted: TrustedKeys) -> HeadRead:
    """``run_id``'s current head, verified."""
    try:
        blob = store.read(head_key(run_id), MAX_HEAD_BYTES)
    except ObjectRefused as exc:
        return HeadRead(None, None, Break(None, "malformed", f"run {run_id} head: {exc}"), True)
    if blob is None:
        return HeadRead(None, None, None, False)
    md5 = hashlib.md5(blob.body, usedforsecurity=False).hexdigest()
    try:
        head = verify_head(blob.body, trusted, f"run {run_id} head")[0]
    except RecordInvalid as exc:
        return HeadRead(None, blob.version_id, Break(None, code_kind(exc), str(exc)), True, md5)
    if head.run_id != run_id:
        message = f"the head of run {run_id} is the head of run {clip(head.run_id)}: copied from another run"
        return HeadRead(None, blob.version_id, Break(None, "reordered", message), True, md5)
    return HeadRead(head, blob.version_id, None, True, md5)


def ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` -> ``1-3, 7, 9-10``."""
    parts: list[str] = []
    start = prev = None
    for step in steps:
        if prev is not None and step == prev + 1:
            prev = step
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = step
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(parts)
