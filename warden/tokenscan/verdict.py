"""The verdict of a complete scan, and when it may be stored and served again.

A verdict is stored (in the ``scans`` cache of :class:`~.resources.ScanResources`) under
:func:`verdict_key`, the digest of everything it depends on, and only for the bytes analysed:
every read of the analysis goes through one descriptor per file (:mod:`.reads`), and
:func:`reusable` requires its stat key to be the listing's and the hashed descriptor's, and its
whole reads the manifest's digests (a directory swapped under the scan gets its own result,
and nothing is stored).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.findings import Finding
from warden.tokenscan.manifest import Manifest, settled, stat_key
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.result import DirectoryScan
from warden.tokenscan.snapshot import Snapshot
from warden.tokenscan.tree import Entry

VERDICT_FORMAT = 2  # bump when what a verdict holds, or what its key covers, changes


@dataclass(frozen=True)
class ScanVerdict:
    """What :class:`DirectoryScan` reports that follows from the directory's content alone."""

    findings: tuple[Finding, ...]
    token_ids_digest: str | None
    files: int
    bytes: int
    review: str = ""  # the review report as JSON (immutable; a served verdict carries it too)

    def weight(self) -> int:
        found = sum(256 + len(f.message) + len(f.fix) + len(f.path) + len(f.key or "") for f in self.findings)
        return 256 + found + len(self.review)

    def scan(self, root: str, manifest: Manifest | None, seconds: float) -> DirectoryScan:
        out = DirectoryScan(root, list(self.findings), [], self.files, self.bytes, seconds, manifest)
        out.token_ids_digest = self.token_ids_digest
        out.review = json.loads(self.review) if self.review else None
        return out


def policy_fingerprint(policy: TokenscanPolicy) -> str:
    """Every field of the policy, canonically (any change to the policy changes it)."""
    return json.dumps(_plain(policy), sort_keys=True)


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data: dataclasses and mappings as objects, sequences as lists
    (sets sorted), scalars as they are, anything else by its repr."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=json.dumps)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def verdict_key(snap: Snapshot, policy: TokenscanPolicy) -> str | None:
    """The digest of every input of a scan's verdict: the tree as listed (names, kinds, link
    targets, sizes, inodes, link counts), the SHA-256 of every file read, the policy and the
    versions of the corpus and of this key. None without a complete manifest."""
    if snap.manifest is None or snap.errors:
        return None
    blob = json.dumps(
        [
            VERDICT_FORMAT,
            tbe.CORPUS_VERSION,
            snap.root,
            snap.root_real,
            [list(vars(e).values()) for e in snap.entries],
            snap.manifest.to_dict()["files"],
            policy_fingerprint(policy),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def stat_keys(files: Iterable[tuple[str, str, str | None]]) -> dict[str, tuple[int, ...]] | None:
    """:func:`~.manifest.stat_key` of every file to read, or None when one cannot be stat'ed."""
    out: dict[str, tuple[int, ...]] = {}
    for rel, path, _link in files:
        try:
            out[rel] = stat_key(os.stat(path, follow_symlinks=False))
        except OSError:
            return None
    return out


def hashed_as_listed(snap: Snapshot, listed: dict[str, tuple[int, ...]] | None) -> bool:
    """Whether every file hashed is the one listed: the ``fstat`` of the descriptor hashed equals
    the file's stat key after the listing (``listed``), unchanged while it was hashed, and (for a
    regular file) the listing's own device, inode and size. Else the directory changed during
    the scan: no verdict is looked up or stored for it (the reasons go to ``snap.transient``)."""
    if snap.manifest is None or listed is None:
        return False
    changed = {rel for rel, key in listed.items() if snap.manifest.keys.get(rel) != key}
    changed |= {e.rel for e in snap.entries if e.rel in listed and e.kind == "file" and _moved(e, listed[e.rel])}
    why = [f"{rel}: changed during the scan" for rel in sorted(changed)]
    snap.transient += [w for w in why if w not in snap.transient]
    return not changed


def _moved(e: Entry, key: tuple[int, ...]) -> bool:
    """Whether stat key ``key`` is of another file than the listing's entry ``e``."""
    return key[:3] != (e.dev, e.ino, e.size)


def reusable(
    snap: Snapshot, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]] | None, now_ns: int
) -> bool:
    """Whether a scan's verdict may be stored under its :func:`verdict_key`: complete (no error,
    nothing left unanalysed or cut short by a budget, no sandbox crash), every file analysed
    exactly as listed and hashed, and no file changed so recently that a change could hide in
    one timestamp tick.

    "As listed and hashed": every descriptor the analysis read (:class:`~.reads.ReadLog`) has
    the file's stat key from after the listing (``before``), which is the stat key of the
    descriptor hashed, and every whole read has the manifest's digest; and no file changed from
    before its hashing to after the checks (``after``). A directory swapped under the scan (a
    parent renamed between the hashing and the reading) fails this: the scan's result stands,
    nothing is stored."""
    if snap.errors or snap.unanalysed or snap.transient or after != before or snap.manifest is None:
        return False
    if not hashed_as_listed(snap, before) or not snap.reads.keys.keys() <= before.keys():
        return False
    files = snap.manifest.files
    return all(
        settled(k, now_ns) and rel in files and snap.reads.matches(rel, k, files[rel].sha256)
        for rel, k in before.items()
    )
