"""Incremental-audit cache: what was verified, keyed by each file's stat identity.

A file whose (size, mtime_ns, inode, ctime_ns) is unchanged since it was hashed keeps its
digest; ctime is kept beside the issue's size+mtime+inode because ``touch -d`` can put
an mtime back but nothing in user space can set ctime. A periodic full pass re-hashes
everything anyway. The cache lives in the state dir, one file per target, written
atomically; a missing or corrupt cache only costs a full pass.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from trainer.events import atomic_write_bytes

CACHE_VERSION = 1
StatKey = tuple[int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class IntegrityCache:
    """Digests of RECORD-listed files and verdicts of ``.pyc`` files, for one target."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.files: dict[str, list[Any]] = {}
        self.pyc: dict[str, list[int]] = {}
        self.last_full_pass = 0.0
        self.loaded = False

    @staticmethod
    def for_target(state_dir: str | None, site_packages: tuple[str, ...]) -> IntegrityCache:
        if not state_dir:
            return IntegrityCache(None)
        tag = hashlib.sha256("\0".join(site_packages).encode()).hexdigest()[:16]
        return IntegrityCache(os.path.join(state_dir, f"integrity-cache-{tag}.json"))

    def load(self) -> IntegrityCache:
        if not self.path:
            return self
        try:
            with open(self.path, "rb") as fh:
                raw = json.loads(fh.read())
            if raw.get("version") == CACHE_VERSION:
                self.files = dict(raw.get("files") or {})
                self.pyc = dict(raw.get("pyc") or {})
                self.last_full_pass = float(raw.get("last_full_pass") or 0.0)
                self.loaded = True
        except (OSError, ValueError, TypeError, AttributeError):
            self.files, self.pyc, self.last_full_pass = {}, {}, 0.0
        return self

    def save(self) -> None:
        if not self.path:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        body = {"version": CACHE_VERSION, "last_full_pass": self.last_full_pass, "files": self.files, "pyc": self.pyc}
        atomic_write_bytes(self.path, json.dumps(body, separators=(",", ":")).encode())

    def digest(self, path: str, key: StatKey, algo: str) -> str | None:
        entry = self.files.get(path)
        if entry and tuple(entry[:4]) == key and isinstance(entry[4], str) and entry[4].startswith(algo + "="):
            return str(entry[4])
        return None

    def put_digest(self, path: str, key: StatKey, digest: str) -> None:
        self.files[path] = [*key, digest]

    def pyc_ok(self, pyc_path: str, key: list[int]) -> bool:
        return self.pyc.get(pyc_path) == key

    def put_pyc_ok(self, pyc_path: str, key: list[int]) -> None:
        self.pyc[pyc_path] = key

    def prune(self, live: set[str]) -> None:
        """Forgets files that no longer exist, so the cache does not grow forever."""
        self.files = {p: v for p, v in self.files.items() if p in live}
        self.pyc = {p: v for p, v in self.pyc.items() if p in live}
