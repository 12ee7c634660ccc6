"""SHA-256 manifests of scanned directories, approvals, and drift after approval.

A :class:`Manifest` maps every readable file (relative POSIX name) to its SHA-256 and
size; a symlink also records its target, so re-pointing a link is a change. Its
``digest`` (SHA-256 of the canonical JSON of the map) is what ``pinned_directories``
pins. :class:`ApprovalStore` keeps the manifest of each approved directory under
``<state_dir>/approved/`` (written atomically); :func:`drift_finding` compares the
current manifest with the approved one (time-of-check/time-of-use).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from warden.caches import LRUCache
from warden.errors import IncompleteError
from warden.safeio import FILE_FLAGS, atomic_write_bytes, stat_identity
from warden.safeio import RACY_NS as SHARED_RACY_NS
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.tokenizer_behaviour import CORPUS_VERSION

CHUNK = 1 << 20


class ManifestError(IncompleteError):
    """A file could not be hashed, or an approval could not be read or written."""


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int
    link: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sha256": self.sha256, "size": self.size}
        if self.link is not None:
            out["link"] = self.link
        return out


@dataclass(frozen=True)
class Manifest:
    """``keys``: the :func:`stat_key` of each descriptor hashed, None for a file that changed while
    it was hashed (not part of the manifest's identity: not compared, not stored)."""

    root: str
    files: Mapping[str, FileDigest]
    keys: Mapping[str, tuple[int, ...] | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def digest(self) -> str:
        canonical = json.dumps({k: v.to_dict() for k, v in sorted(self.files.items())}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "digest": self.digest,
            "files": {k: v.to_dict() for k, v in sorted(self.files.items())},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Manifest:
        files = {str(k): FileDigest(str(v["sha256"]), int(v["size"]), v.get("link")) for k, v in raw["files"].items()}
        return cls(str(raw["root"]), files)


RACY_NS = SHARED_RACY_NS  # a module attribute: tests shorten it here

stat_key = stat_identity
"""(dev, inode, size, mtime_ns, ctime_ns) of a stat: the key of unchanged content (warden.safeio)."""


def settled(key: tuple[int, ...], now_ns: int) -> bool:
    """Whether the content behind a :func:`stat_key` may be remembered by it: its last change
    (``ctime``) is :data:`RACY_NS` older than ``now_ns`` (``time.time_ns()`` taken before the
    stat). Timestamps are coarse (a tick, up to a second or two on some filesystems): a change
    in the same tick as the previous one leaves the key as it was, so a "racily clean" file
    (git's term) is hashed again next time rather than trusted."""
    return key[-1] < now_ns - RACY_NS


class HashCache(LRUCache[tuple[Any, ...], str]):
    """Digests keyed by (path, :func:`stat_key`): rescans skip unchanged files. Files changed in
    the last :data:`RACY_NS` are not remembered (see :func:`settled`). At most ``limit`` entries;
    :func:`hash_file_keyed` looks digests up with ``peek``, so the oldest stored goes first."""

    def __init__(self, limit: int = 100_000) -> None:
        super().__init__(limit)


def hash_file(path: str, cache: HashCache | None = None) -> tuple[str, int]:
    """(hex SHA-256, size) of the regular file at ``path`` (the last component is not followed)."""
    sha, size, _key = hash_file_keyed(path, cache)
    return sha, size


def hash_file_keyed(path: str, cache: HashCache | None = None) -> tuple[str, int, tuple[int, ...] | None]:
    """(hex SHA-256, size, :func:`stat_key` of the descriptor hashed) of the regular file at
    ``path``; the key is None when the file changed while it was read (its ``fstat`` after the
    read differs: the digest may be of no version of it, and is not remembered)."""
    now = time.time_ns()
    fd = os.open(path, FILE_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file any more; refusing to read it")
        identity = stat_key(st)
        key = (path, *identity)
        cached = cache.peek(key) if cache is not None else None
        if cached is not None:
            return cached, st.st_size, identity
        h = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
        if stat_key(os.fstat(fd)) != identity:
            return h.hexdigest(), st.st_size, None
        if cache is not None and settled(identity, now):
            cache.put(key, h.hexdigest())
        return h.hexdigest(), st.st_size, identity
    finally:
        os.close(fd)


THREADED_HASH_BYTES = 32 << 20  # below this, starting hashing threads costs more than it saves


def _total_size(items: Iterable[tuple[str, str, str | None]]) -> int:
    total = 0
    for _rel, path, _link in items:
        with contextlib.suppress(OSError):
            total += os.lstat(path).st_size
    return total


def build_manifest(
    root: str, files: Iterable[tuple[str, str, str | None]], cache: HashCache | None = None, workers: int = 0
) -> Manifest:
    """Hashes ``files``: (relative name, path to open, link target or None). Raises ManifestError."""
    items = list(files)
    workers = workers or min(8, os.cpu_count() or 1)

    def one(item: tuple[str, str, str | None]) -> tuple[str, FileDigest, tuple[int, ...] | None]:
        rel, path, link = item
        try:
            sha, size, key = hash_file_keyed(path, cache)
        except OSError as exc:
            raise ManifestError(f"{path}: cannot hash ({exc.strerror})") from None
        return rel, FileDigest(sha, size, link), key

    if len(items) > 1 and workers > 1 and _total_size(items) > THREADED_HASH_BYTES:
        with ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(one, items))
    else:
        done = [one(i) for i in items]
    return Manifest(root, {rel: d for rel, d, _k in done}, {rel: k for rel, _d, k in done})


def diff(old: Manifest, new: Manifest) -> tuple[list[str], list[str], list[str]]:
    """(changed, added, removed) relative names, sorted."""
    changed = sorted(k for k in old.files.keys() & new.files.keys() if old.files[k] != new.files[k])
    return changed, sorted(new.files.keys() - old.files.keys()), sorted(old.files.keys() - new.files.keys())


def describe_diff(old: Manifest, new: Manifest, limit: int = 5) -> str:
    parts = []
    for label, names in zip(("changed", "added", "removed"), diff(old, new), strict=True):
        if names:
            more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
            parts.append(f"{label}: {', '.join(names[:limit])}{more}")
    return "; ".join(parts) or "no file differs (metadata only)"


def drift_finding(approved: Manifest, current: Manifest, approved_at: str = "") -> Finding | None:
    """TS1101 when ``current`` differs from the approved manifest, else None."""
    if approved.digest == current.digest:
        return None
    when = f" at {approved_at}" if approved_at else ""
    return finding(
        "TS1101",
        ".",
        f"changed after it was approved{when} (manifest {approved.digest[:12]}): {describe_diff(approved, current)}",
    )


def pin_finding(pinned: str, current: Manifest) -> Finding | None:
    """TS1102 when ``current`` does not have the pinned digest."""
    if pinned == current.digest:
        return None
    return finding("TS1102", ".", f"manifest digest {current.digest} differs from the pinned {pinned}")


class Approval(NamedTuple):
    """One approval record: the manifest, when, and the digest of the ids the built-in corpus
    encoded to (``None``: not recorded, or recorded with another corpus version)."""

    manifest: Manifest
    approved_at: str
    token_ids_digest: str | None = None
    accepted: tuple[str, ...] = ()  # fingerprints of the findings a person accepted (--accept-findings)


def token_ids_finding(approved: str | None, current: str | None, approved_at: str = "") -> Finding | None:
    """TS1208 when the corpus encodes to other ids than at approval (or could not be encoded
    now), else None; no finding when the approval recorded no digest."""
    if approved is None or approved == current:
        return None
    when = f" at {approved_at}" if approved_at else ""
    got = current or "nothing (the tokenizer was not exercised)"
    return finding("TS1208", ".", f"the built-in corpus encodes to ids with digest {got}, approved{when} {approved}")


def approval_findings(record: Approval, manifest: Manifest, token_ids_digest: str | None) -> list[Finding]:
    """What a scan adds against its approval record: file drift (TS1101), token-id drift (TS1208)."""
    found = [drift_finding(record.manifest, manifest, record.approved_at)]
    found.append(token_ids_finding(record.token_ids_digest, token_ids_digest, record.approved_at))
    return [f for f in found if f is not None]


class ApprovalStore:
    """Approved manifests, one JSON file per directory under ``<state_dir>/approved/``, with
    the token-ids digest of the approved tokenizer (``token_ids_digest``, for the corpus
    version ``token_ids_corpus``)."""

    def __init__(self, state_dir: str) -> None:
        self.dir = os.path.join(state_dir, "approved")

    def _path(self, directory: str) -> str:
        key = hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:24]
        return os.path.join(self.dir, f"{key}.json")

    def load(self, directory: str) -> Approval | None:
        """The approval record of ``directory``, or None. Raises ManifestError when unreadable."""
        path = self._path(directory)
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
            ids = raw.get("token_ids_digest")
            if not isinstance(ids, str) or raw.get("token_ids_corpus") != CORPUS_VERSION:
                ids = None  # approved before digests were recorded, or with another corpus
            accepted = tuple(str(a) for a in raw.get("accepted_findings", ()))
            return Approval(Manifest.from_dict(raw["manifest"]), str(raw.get("approved_at", "")), ids, accepted)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{path}: approval record unreadable ({exc}); delete it to re-approve") from None

    def save(
        self,
        directory: str,
        manifest: Manifest,
        approved_at: str,
        token_ids_digest: str | None = None,
        accepted: tuple[str, ...] = (),
    ) -> None:
        os.makedirs(self.dir, exist_ok=True)
        record: dict[str, Any] = {
            "path": os.path.abspath(directory), "approved_at": approved_at, "manifest": manifest.to_dict()
        }  # fmt: skip
        if accepted:
            record["accepted_findings"] = list(accepted)
        if token_ids_digest is not None:
            record |= {"token_ids_digest": token_ids_digest, "token_ids_corpus": CORPUS_VERSION}
        atomic_write_bytes(self._path(directory), json.dumps(record, indent=1, sort_keys=True).encode())

    def remove(self, directory: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(directory))

    def approved(self) -> list[str]:
        """Paths of every approved directory."""
        out = []
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        for name in names:
            try:
                with open(os.path.join(self.dir, name), encoding="utf-8") as fh:
                    out.append(str(json.load(fh)["path"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out
