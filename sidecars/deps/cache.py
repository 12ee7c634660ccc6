"""Incremental-audit cache: what was verified, keyed by each file's stat identity.

A file whose (size, mtime_ns, inode, ctime_ns) is unchanged since it was hashed keeps its
digest; ctime is kept beside the issue's size+mtime+inode because ``touch -d`` can put
an mtime back but nothing in user space can set ctime. A periodic full pass re-hashes
everything anyway. The cache lives in the state dir, one file per target, written
atomically; a missing or corrupt cache only costs a full pass.

``.pyc`` verdicts are kept twice: by path with the stat identities of the pyc and its source
(an incremental audit only stats), and by content (``verdicts``: keys of
:func:`sidecars.deps.pyccheck.verdict_key` over both files' digests, the interpreter and the
optimisation level), so a full pass re-hashes every file but compiles only pairs it has not
seen. Nothing is written when nothing changed.

Locked wheels (wheels.py): each wheel file's sha256 by path and stat identity (``wheels``), and
the (installed RECORD, wheel sha256) pairs verified equal (``wheel_verdicts``), so a re-audit
opens no wheel; both are pruned to what the last audit saw or used.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from trainer.events import atomic_write_bytes

CACHE_VERSION = 2
StatKey = tuple[int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class IntegrityCache:
    """Digests of RECORD-listed files and verdicts of ``.pyc`` files, for one target."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.files: dict[str, list[Any]] = {}
        self.pyc: dict[str, list[int]] = {}
        self.verdicts: set[str] = set()
        self.last_full_pass = 0.0
        self.loaded = False
        self.dirty = False
        self._verdicts_used: set[str] = set()
        self.wheels: dict[str, list[Any]] = {}
        self.wheel_verdicts: set[str] = set()
        self._wheel_verdicts_used: set[str] = set()

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
                self.verdicts = {str(k) for k in raw.get("verdicts") or ()}
                self.last_full_pass = float(raw.get("last_full_pass") or 0.0)
                self.wheels = dict(raw.get("wheels") or {})
                self.wheel_verdicts = {str(k) for k in raw.get("wheel_verdicts") or ()}
                self.loaded = True
        except (OSError, ValueError, TypeError, AttributeError):
            self.files, self.pyc, self.verdicts, self.last_full_pass = {}, {}, set(), 0.0
            self.wheels, self.wheel_verdicts = {}, set()
        return self

    def save(self) -> None:
        if not self.path or not self.dirty:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        body = {
            "version": CACHE_VERSION,
            "last_full_pass": self.last_full_pass,
            "files": self.files,
            "pyc": self.pyc,
            "verdicts": sorted(self.verdicts),
            "wheels": self.wheels,
            "wheel_verdicts": sorted(self.wheel_verdicts),
        }
        atomic_write_bytes(self.path, json.dumps(body, separators=(",", ":")).encode())
        self.dirty = False

    def mark_full_pass(self, now: float) -> None:
        self.last_full_pass = now
        self.dirty = True

    def digest(self, path: str, key: StatKey, algo: str) -> str | None:
        entry = self.files.get(path)
        if entry and tuple(entry[:4]) == key and isinstance(entry[4], str) and entry[4].startswith(algo + "="):
            return str(entry[4])
        return None

    def put_digest(self, path: str, key: StatKey, digest: str) -> None:
        entry = [*key, digest]
        if self.files.get(path) != entry:
            self.files[path] = entry
            self.dirty = True

    def pyc_ok(self, pyc_path: str, key: list[int]) -> bool:
        return self.pyc.get(pyc_path) == key

    def put_pyc_ok(self, pyc_path: str, key: list[int]) -> None:
        if self.pyc.get(pyc_path) != key:
            self.pyc[pyc_path] = key
            self.dirty = True

    def verdict_ok(self, key: str) -> bool:
        """Whether this exact (pyc bytes, source bytes, interpreter, optimisation) was verified ``ok``."""
        if key in self.verdicts:
            self._verdicts_used.add(key)
            return True
        return False

    def put_verdict_ok(self, key: str) -> None:
        self._verdicts_used.add(key)
        if key not in self.verdicts:
            self.verdicts.add(key)
            self.dirty = True

    def prune(self, live: set[str], full_pass: bool = False) -> None:
        """Forgets files that no longer exist (and, after a full pass, verdicts no pair used),
        so the cache does not grow forever."""
        files = {p: v for p, v in self.files.items() if p in live}
        pyc = {p: v for p, v in self.pyc.items() if p in live}
        verdicts = self.verdicts & self._verdicts_used if full_pass else self.verdicts
        if len(files) != len(self.files) or len(pyc) != len(self.pyc) or len(verdicts) != len(self.verdicts):
            self.files, self.pyc, self.verdicts, self.dirty = files, pyc, verdicts, True

    def wheel_sha(self, path: str, key: StatKey) -> str | None:
        """The hex sha256 of the wheel file ``path`` if its stat identity is still ``key``."""
        entry = self.wheels.get(path)
        if entry and len(entry) == 5 and tuple(entry[:4]) == key and isinstance(entry[4], str):
            return entry[4]
        return None

    def put_wheel_sha(self, path: str, key: StatKey, sha256: str) -> None:
        entry = [*key, sha256]
        if self.wheels.get(path) != entry:
            self.wheels[path] = entry
            self.dirty = True

    def wheel_ok(self, key: str) -> bool:
        """Whether this (installed RECORD, locked wheel) pair was verified equal (wheels.verdict_key)."""
        if key in self.wheel_verdicts:
            self._wheel_verdicts_used.add(key)
            return True
        return False

    def put_wheel_ok(self, key: str) -> None:
        self._wheel_verdicts_used.add(key)
        if key not in self.wheel_verdicts:
            self.wheel_verdicts.add(key)
            self.dirty = True

    def prune_wheels(self, live: set[str]) -> None:
        """Forgets wheel files no longer listed and verdicts this audit did not use (a changed
        RECORD or wheel makes a new key; the old one would never match again)."""
        wheels = {p: v for p, v in self.wheels.items() if p in live}
        verdicts = self.wheel_verdicts & self._wheel_verdicts_used
        if len(wheels) != len(self.wheels) or len(verdicts) != len(self.wheel_verdicts):
            self.wheels, self.wheel_verdicts, self.dirty = wheels, verdicts, True
