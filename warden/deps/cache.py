"""Incremental-audit cache: what was verified, keyed by each file's stat identity.

A file whose stat identity (:data:`warden.safeio.stat_identity`: device, inode, size, mtime_ns,
ctime_ns) is unchanged since it was hashed keeps its digest; ctime is kept beside the issue's
size+mtime+inode because ``touch -d`` can put an mtime back but nothing in user space can set
ctime. A periodic full pass re-hashes everything anyway. Callers store a digest or verdict under a
stat key only when its bytes were read from a descriptor whose ``fstat`` is that key's stat
(walk.safe_digest / walk.read_as with the walk's stat; a file renamed in or written between the
walk and the read raises walk.Changed) and the file had settled (walk.settled: its ctime
DIGEST_RACY_NS before the read). The cache lives in the state dir, one file per target, written
atomically; a missing or corrupt cache only costs a full pass.

``.pyc`` verdicts are kept twice: by path with the stat identities of the pyc and its source
(an incremental audit only stats), and by content (``verdicts``: keys of
:func:`warden.deps.pyccheck.verdict_key` over both files' digests, the interpreter and the
optimisation level), so a full pass re-hashes every file but compiles only pairs it has not
seen. Nothing is written when nothing changed.

Directory listings (walk.walk_tree): a directory whose (inode, mtime_ns, ctime_ns) is unchanged
is not listed again; its entries are only stat-ed (walk.py says why that is safe).

Verified-clean distributions (records.py): by metadata directory, the RECORD's sha256, the
policy it was judged under, its paths and a fingerprint of their stat identities, so an
unchanged distribution is one comparison (its RECORD is not even parsed: installed.LazyRecord).

Locked wheels (wheels.py): each wheel file's sha256 by path and stat identity (``wheels``), and
the (installed RECORD, wheel sha256) pairs verified equal (``wheel_verdicts``), so a re-audit
opens no wheel; both are pruned to what the last audit saw or used.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from warden.safeio import atomic_write_bytes

# 3: entries as strings (half the load time of lists); 4: site-packages digests in a side file;
# 5: stat keys are warden.safeio.stat_identity (device, inode, size, mtime_ns, ctime_ns)
CACHE_VERSION = 5
StatKey = tuple[int, int, int, int, int]  # warden.safeio.stat_identity of a stat result


def key_text(key: Sequence[int]) -> str:
    """A stat key (or two: :data:`warden.safeio.stat_identity`) as the cache stores it: the
    integers joined by spaces."""
    return " ".join(map(str, key))


def _strings(value: Any) -> dict[str, str]:
    """``value`` if it is a dict (of strings, as this version writes; a value of another type
    never equals a key text, see :meth:`IntegrityCache.digest`), else empty."""
    return value if isinstance(value, dict) else {}


def _dist_ok(value: Any) -> bool:
    """The shape records.py relies on: [RECORD sha256, policy tag, hashed paths, other paths, fingerprint]."""
    return isinstance(value, list) and len(value) == 5 and all(isinstance(v, str) for v in value)


def _kept(key: str, kept: set[str], used: set[str]) -> bool:
    """Whether the verdict ``key`` is in ``kept``; one asked about is ``used`` (pruning keeps it)."""
    if key in kept:
        used.add(key)
        return True
    return False


def _listings(value: Any) -> dict[str, list[Any]]:
    """The directory listings of a loaded cache: a dict is taken as is (walk.walk_tree checks each
    entry's shape when it uses it: validating 7,000 entries here cost more than the rest of the load)."""
    return value if isinstance(value, dict) else {}


class IntegrityCache:
    """Digests of RECORD-listed files and verdicts of ``.pyc`` files, for one target."""

    def __init__(self, path: str | None, lazy_roots: tuple[str, ...] = ()) -> None:
        self.path = path
        # path -> "dev ino size mtime_ns ctime_ns algo=digest"; those below ``lazy_roots`` (the
        # site-packages: 40,000 entries an incremental audit of unchanged distributions never
        # reads) live in ``<path>.site.json``, read on first use (_site_files)
        self.files: dict[str, str] = {}
        self._prefixes = tuple(root.rstrip(os.sep) + os.sep for root in lazy_roots)
        self._site: dict[str, str] | None = {} if path is None else None
        self._site_dirty = False
        self.pyc: dict[str, str] = {}  # pyc path -> key_text of the pyc's and its source's stat keys
        self.verdicts: set[str] = set()
        self.last_full_pass = 0.0
        self.loaded = False
        self.dirty = False
        self._verdicts_used: set[str] = set()
        self.wheels: dict[str, list[Any]] = {}
        self.listings: dict[str, list[Any]] = {}  # walk.walk_tree's directory listings
        self.dists: dict[str, list[str]] = {}  # records.py's verified-clean distributions
        self.stdlib_state: list[str] = []  # stdlib.py: [paths, digests (NUL-joined), stat fingerprint]
        self.wheel_verdicts: set[str] = set()
        self._wheel_verdicts_used: set[str] = set()

    @staticmethod
    def for_target(state_dir: str | None, site_packages: tuple[str, ...]) -> IntegrityCache:
        if not state_dir:
            return IntegrityCache(None)
        tag = hashlib.sha256("\0".join(site_packages).encode()).hexdigest()[:16]
        return IntegrityCache(os.path.join(state_dir, f"integrity-cache-{tag}.json"), site_packages)

    @property
    def site_path(self) -> str | None:
        return self.path[: -len(".json")] + ".site.json" if self.path and self.path.endswith(".json") else None

    def _site_files(self) -> dict[str, str]:
        """The site-packages digests, read now if not yet (a missing or other file: none)."""
        if self._site is None:
            self._site = {}
            try:
                with open(str(self.site_path), "rb") as fh:
                    raw = json.loads(fh.read())
                if isinstance(raw, dict) and raw.get("version") == CACHE_VERSION:
                    self._site = _strings(raw.get("files"))
            except (OSError, ValueError):
                pass
        return self._site

    def _table(self, path: str) -> dict[str, str]:
        return self._site_files() if self._prefixes and path.startswith(self._prefixes) else self.files

    def entry(self, path: str) -> str | None:
        """The stored entry of ``path`` ("dev ino size mtime_ns ctime_ns algo=digest"), if any."""
        value = self._table(path).get(path)
        return value if isinstance(value, str) else None

    def load(self) -> IntegrityCache:
        if not self.path:
            return self
        try:
            with open(self.path, "rb") as fh:
                raw = json.loads(fh.read())
            if raw.get("version") == CACHE_VERSION:
                self.files = _strings(raw.get("files"))
                self.pyc = _strings(raw.get("pyc"))
                self.verdicts = {str(k) for k in raw.get("verdicts") or ()}
                self.last_full_pass = float(raw.get("last_full_pass") or 0.0)
                self.wheels = dict(raw.get("wheels") or {})
                self.listings = _listings(raw.get("listings"))
                self.dists = {k: v for k, v in dict(raw.get("dists") or {}).items() if _dist_ok(v)}
                state = raw.get("stdlib_state")
                ok = isinstance(state, list) and len(state) == 3 and all(isinstance(v, str) for v in state)
                self.stdlib_state = state if ok else []
                self.wheel_verdicts = {str(k) for k in raw.get("wheel_verdicts") or ()}
                self.loaded = True
        except (OSError, ValueError, TypeError, AttributeError):
            self.files, self.pyc, self.verdicts, self.last_full_pass = {}, {}, set(), 0.0
            self.wheels, self.wheel_verdicts, self.listings, self.dists = {}, set(), {}, {}
            self.stdlib_state = []
        if not self.loaded:
            self._site = {}  # a side file of another main file is never mixed in
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
            "listings": self.listings,
            "dists": self.dists,
            "stdlib_state": self.stdlib_state,
        }
        # the side file first; each entry checks itself (stat key), so two generations never mislead
        if self._site is not None and self._site_dirty and self.site_path:
            side = {"version": CACHE_VERSION, "files": self._site}
            atomic_write_bytes(self.site_path, json.dumps(side, separators=(",", ":")).encode())
            self._site_dirty = False
        atomic_write_bytes(self.path, json.dumps(body, separators=(",", ":")).encode())
        self.dirty = False

    def mark_full_pass(self, now: float) -> None:
        self.last_full_pass = now
        self.dirty = True

    def digest(self, path: str, key: StatKey, algo: str) -> str | None:
        entry = self.entry(path)
        if entry is None:
            return None
        head, _, digest = entry.rpartition(" ")
        if head == key_text(key) and digest.startswith(algo + "="):
            return digest
        return None

    def put_digest(self, path: str, key: StatKey, digest: str) -> None:
        entry = f"{key_text(key)} {digest}"
        table = self._table(path)
        if self._store(table, path, entry):
            self._site_dirty = self._site_dirty or table is not self.files

    def pyc_ok(self, pyc_path: str, key: str) -> bool:
        """``key``: :func:`key_text` of the pyc's and its source's stat keys."""
        return self.pyc.get(pyc_path) == key

    def put_pyc_ok(self, pyc_path: str, key: str) -> None:
        self._store(self.pyc, pyc_path, key)

    def _store(self, table: dict[str, Any], key: str, value: Any) -> bool:
        """Sets ``table[key]`` to ``value``; whether that changed it (the cache is then dirty)."""
        if table.get(key) == value:
            return False
        table[key] = value
        self.dirty = True
        return True

    def _keep_only(self, table: dict[str, Any], live: set[str]) -> None:
        """Deletes, in place, the entries of ``table`` whose key is not in ``live``."""
        stale = [k for k in table if k not in live]
        for k in stale:
            del table[k]
        if stale:
            self.dirty = True

    def _put_kept(self, key: str, kept: set[str], used: set[str]) -> None:
        """Keeps the verdict ``key`` in ``kept``, used by this audit (see :func:`_kept`)."""
        used.add(key)
        if key not in kept:
            kept.add(key)
            self.dirty = True

    def verdict_ok(self, key: str) -> bool:
        """Whether this exact (pyc bytes, source bytes, interpreter, optimisation) was verified ``ok``."""
        return _kept(key, self.verdicts, self._verdicts_used)

    def put_verdict_ok(self, key: str) -> None:
        self._put_kept(key, self.verdicts, self._verdicts_used)

    def prune(self, live: set[str], full_pass: bool = False) -> None:
        """After a full pass, forgets files that no longer exist and verdicts no pair used, so the
        cache does not grow forever. Not on incremental audits (it costs a pass over every entry):
        an entry of a removed file can never match again, since a new file at that path has a new
        ctime."""
        if not full_pass:
            return
        site = self._site_files()
        kept = {p: v for p, v in site.items() if p in live}
        if len(kept) != len(site):
            self._site, self._site_dirty, self.dirty = kept, True, True
        files = {p: v for p, v in self.files.items() if p in live}
        pyc = {p: v for p, v in self.pyc.items() if p in live}
        verdicts = self.verdicts & self._verdicts_used
        if len(files) != len(self.files) or len(pyc) != len(self.pyc) or len(verdicts) != len(self.verdicts):
            self.files, self.pyc, self.verdicts, self.dirty = files, pyc, verdicts, True

    def wheel_sha(self, path: str, key: StatKey) -> str | None:
        """The hex sha256 of the wheel file ``path`` if its stat identity is still ``key``."""
        entry = self.wheels.get(path)
        if entry and len(entry) == len(key) + 1 and tuple(entry[:-1]) == key and isinstance(entry[-1], str):
            return entry[-1]
        return None

    def put_wheel_sha(self, path: str, key: StatKey, sha256: str) -> None:
        self._store(self.wheels, path, [*key, sha256])

    def wheel_ok(self, key: str) -> bool:
        """Whether this (installed RECORD, locked wheel) pair was verified equal (wheels.verdict_key)."""
        return _kept(key, self.wheel_verdicts, self._wheel_verdicts_used)

    def put_wheel_ok(self, key: str) -> None:
        self._put_kept(key, self.wheel_verdicts, self._wheel_verdicts_used)

    def prune_wheels(self, live: set[str]) -> None:
        """Forgets wheel files no longer listed and verdicts this audit did not use (a changed
        RECORD or wheel makes a new key; the old one would never match again)."""
        wheels = {p: v for p, v in self.wheels.items() if p in live}
        verdicts = self.wheel_verdicts & self._wheel_verdicts_used
        if len(wheels) != len(self.wheels) or len(verdicts) != len(self.wheel_verdicts):
            self.wheels, self.wheel_verdicts, self.dirty = wheels, verdicts, True

    def listings_for(self, full_pass: bool) -> dict[str, list[Any]]:
        """The directory listings a walk may reuse and updates (none reused on a full pass: every
        directory is listed again and its listing replaced)."""
        if full_pass:
            self.listings = {}
            self.dirty = True
        return self.listings

    def walked(self, relisted: int) -> None:
        """A walk listed ``relisted`` directories (and so changed ``listings``)."""
        if relisted:
            self.dirty = True

    def prune_listings(self, visited: set[str]) -> None:
        """Forgets the listings of directories no walk visited (removed, or no longer a root)."""
        self._keep_only(self.listings, visited)

    def known_records(self) -> frozenset[str]:
        """sha256 digests of the RECORD files of distributions verified clean (they parsed)."""
        return frozenset(v[0] for v in self.dists.values())

    def dist_state(self, meta_dir: str, record_sha256: str | None, tag: str) -> list[str] | None:
        """[hashed paths, other paths, fingerprint] of a distribution verified clean with this exact
        RECORD under the policy ``tag``, else None."""
        entry = self.dists.get(meta_dir)
        if entry and record_sha256 and entry[0] == record_sha256 and entry[1] == tag:
            return entry[2:]
        return None

    def put_dist(self, meta_dir: str, record_sha256: str, tag: str, hashed: str, other: str, fingerprint: str) -> None:
        self._store(self.dists, meta_dir, [record_sha256, tag, hashed, other, fingerprint])

    def drop_dist(self, meta_dir: str) -> None:
        if self.dists.pop(meta_dir, None) is not None:
            self.dirty = True

    def prune_dists(self, live: set[str]) -> None:
        """Forgets distributions whose metadata directory is gone."""
        self._keep_only(self.dists, live)

    def set_stdlib_state(self, paths: str, digests: str, fingerprint: str) -> None:
        """The base interpreter's files (NUL-joined, walk order), their digests and stat fingerprint."""
        state = [paths, digests, fingerprint]
        if state != self.stdlib_state:
            self.stdlib_state = state
            self.dirty = True
