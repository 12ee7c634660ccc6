"""Walking and reading an environment an attacker may have written (I/O edge, no policy).

- :func:`walk_tree` lists a tree with ``lstat`` only: directories are descended, every
  other entry (file, symlink, symlinked directory, FIFO, socket, device) is returned with
  its own ``lstat``; a directory that cannot be listed is returned in ``unreadable``, never
  skipped silently.
- :func:`safe_digest` never follows a link and never blocks: a symlink is hashed as its
  target *string* (so the incremental cache, keyed by the link's ``lstat``, and the hash
  describe the same object), a regular file is opened with ``warden.safeio`` (``O_NOFOLLOW |
  O_NONBLOCK``, checked again with ``fstat``), anything else raises. Given the walk's ``lstat`` of
  the path (``expect``), it hashes only that very file: the opened descriptor's ``fstat`` (before
  and after the read; a link's through an ``O_PATH`` descriptor) must have the same device, inode,
  size, mtime, ctime and type, else :class:`Changed` is raised. A digest (or verdict) is cached
  under a stat key only when it was computed this way, and only when the file had :func:`settled`
  (the file was renamed over, replaced or written between the walk and the read: caching what was
  read under the walk's key would let the walked file pass every later incremental audit).
- :func:`read_small` reads at most ``limit`` bytes of a regular file the same way.
- :class:`Budget`: what one audit may read. A file larger than ``max_file_bytes`` (its size as
  stat-ed: a sparse file of a few TiB too) is never opened (:class:`Oversized`: a finding); a file
  whose read takes longer than ``max_file_seconds``, and every read once the audit has read
  ``max_bytes`` or run ``max_seconds``, stops (:class:`OutOfBudget`: the audit is incomplete, exit 3,
  with what it found before). Reads check it between chunks, walks between directories.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import errno
import hashlib
import operator
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from warden.safeio import RACY_NS as SHARED_RACY_NS
from warden.safeio import open_regular_fd, read_fd, stat_identity

READ_LIMIT = 16 * 1024 * 1024
HASH_CHUNK = 1024 * 1024
HASH_BATCH_BYTES = 16 * 1024 * 1024
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class WalkResult:
    """``files``: every non-directory entry with its lstat; ``unreadable``: 'path: why' lines."""

    files: dict[str, os.stat_result] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # every directory walked
    relisted: int = 0  # directories listed (not taken from ``listings``)


Listings = dict[str, list[Any]]
RACY_NS = SHARED_RACY_NS  # a listing is reused only if its directory last changed this long before it was read
DIGEST_RACY_NS = RACY_NS  # a digest is cached only if its file last changed this long before it was read (settled)
CHANGED = "changed during the audit (not the file the walk stat-ed); run the audit again"


def walk_tree(
    root: str, prune: Iterable[str] = (), listings: Listings | None = None, budget: Budget | None = None
) -> WalkResult:
    """Every entry below ``root`` (links and special files included, never followed).

    Directories in ``prune`` (absolute paths) are not descended (they are walked as roots
    of their own). A root that does not exist gives an empty result.

    ``listings`` (the incremental cache's, updated here): directory -> [inode, mtime_ns,
    ctime_ns, names of its non-directories, names of its directories], both joined by NUL. A
    directory whose (inode, mtime_ns, ctime_ns) is unchanged has the same entries (creating,
    removing or renaming an entry sets both times; ``utime`` can put mtime back, not ctime), so
    its names are taken from there and only ``lstat``-ed, without listing it; every file is still
    stat-ed. A listing is stored only when the directory's ctime is RACY_NS older than the walk
    (timestamps are coarse: a change in the same tick as the one read would keep them).

    With ``budget``: once it is spent, the directories not yet walked are ``unreadable`` (one line)."""
    out = WalkResult()
    skip = set(prune)
    stack = [root]
    horizon = time.time_ns() - RACY_NS
    while stack:
        if budget is not None and (why := budget.exhausted()):
            out.unreadable.append(f"{root}: {len(stack)} directories not walked: {why}")
            break
        current = stack.pop()
        if listings is not None and _from_listing(current, current == root, listings, stack, skip, out):
            continue
        _scan(current, skip, stack, out, listings, horizon)
    return out


def _from_listing(
    current: str, is_root: bool, listings: Listings, stack: list[str], skip: set[str], out: WalkResult
) -> bool:
    """Entries of ``current`` from its cached listing when its stat says it is unchanged (True), else False."""
    cached = listings.get(current)
    try:
        st = os.stat(current) if is_root else os.lstat(current)  # scandir follows a root link, nothing below
    except OSError:
        return False  # _scan says why
    if not (
        isinstance(cached, list)
        and len(cached) == 5
        and stat.S_ISDIR(st.st_mode)
        and cached[0] == st.st_ino
        and cached[1] == st.st_mtime_ns
        and cached[2] == st.st_ctime_ns
        and isinstance(cached[3], str)
        and isinstance(cached[4], str)
    ):
        listings.pop(current, None)
        return False
    names = cached[3]
    if names:
        # lstat of every entry (a file's content may change without its directory's), in C (map).
        # An entry now of another type implies a changed listing (unlink/mkdir/rename set the
        # directory's times); were it missed, a directory kept here is reported, never skipped.
        prefix = current + "/"
        paths = [prefix + name for name in names.split("\0")]
        try:
            out.files.update(zip(paths, map(os.lstat, paths), strict=True))
        except OSError:
            listings.pop(current, None)
            return False  # changed under us: list it (entries added so far are listed again)
    out.dirs.append(current)
    for name in cached[4].split("\0") if cached[4] else ():
        path = f"{current}/{name}"
        if path not in skip:
            stack.append(path)
    return True


def _scan(
    current: str, skip: set[str], stack: list[str], out: WalkResult, listings: Listings | None, horizon: int
) -> None:
    try:
        before = os.stat(current) if listings is not None else None
        with os.scandir(current) as it:
            entries = list(it)
    except FileNotFoundError:
        return
    except OSError as exc:
        out.unreadable.append(f"{current}: cannot list directory ({exc.strerror or exc})")
        return
    files = out.files
    names: list[str] = []
    dirs: list[str] = []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):  # the directory entry's type: no stat call
                dirs.append(entry.name)
                if entry.path not in skip:
                    stack.append(entry.path)
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            out.unreadable.append(f"{entry.path}: cannot stat ({exc.strerror or exc})")
            before = None  # not a listing to keep
            continue
        if stat.S_ISDIR(st.st_mode):  # a file system without d_type, or a race
            dirs.append(entry.name)
            if entry.path not in skip:
                stack.append(entry.path)
        else:
            names.append(entry.name)
            files[entry.path] = st
    out.dirs.append(current)
    if listings is None:
        return
    out.relisted += 1
    if before is not None and before.st_ctime_ns < horizon and os.sep == "/" and not current.endswith("/"):
        listings[current] = [before.st_ino, before.st_mtime_ns, before.st_ctime_ns, "\0".join(names), "\0".join(dirs)]
    else:
        listings.pop(current, None)


_STAT_ID = operator.attrgetter("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns", "st_mode")


def stat_fingerprint(paths: Iterable[str], walked: Mapping[str, os.stat_result]) -> str | None:
    """sha256 over the (size, mtime_ns, inode, ctime_ns, mode) of each of ``paths`` as walked, in
    order; None when one was not walked. Equal fingerprints: every file has the stat identity and
    type it had (cache.py: ctime cannot be put back, so an edit with a forged mtime changes it). A
    cryptographic hash, not ``hash()``: an attacker choosing mtimes must not find a collision.
    The loops run in C (map, attrgetter): this is the incremental audit's hot path."""
    try:
        rows = list(map(_STAT_ID, map(walked.__getitem__, paths)))
    except KeyError:
        return None
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def kind_of(mode: int) -> str:
    """``file``, ``symlink``, ``fifo``, ``socket``, ``device`` or ``other`` for an lstat mode."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def read_small(path: str, limit: int = READ_LIMIT) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``. Raises OSError (links, FIFOs too)."""
    return read_fd(open_regular_fd(path), limit)


class Oversized(OSError):
    """A file larger than the per-file cap: never read (the caller reports ``oversized``)."""

    def __init__(self, path: str, size: int, cap: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes, over the per-file cap of {cap}", path)
        self.size = size


class OutOfBudget(OSError):
    """The audit's (or this file's) byte or time budget ran out: not read to the end."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.ETIME, f"not read: {why}", path)


class Budget:
    """Byte and time budgets of one audit, shared by its threads (see the module doc)."""

    def __init__(
        self,
        max_file_bytes: int = 8 * 1024**3,
        max_file_seconds: float = 600.0,
        max_bytes: int = 1024**4,
        max_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_file_bytes, self.max_file_seconds = max_file_bytes, max_file_seconds
        self.max_bytes, self.max_seconds = max_bytes, max_seconds
        self.clock = clock
        self.deadline = clock() + max_seconds
        self.used = 0

    def exhausted(self) -> str | None:
        """Why the audit may read nothing more, or None."""
        return self._why(self.clock())

    def _why(self, now: float) -> str | None:
        if self.used > self.max_bytes:
            return f"the audit's byte budget ({self.max_bytes}) is spent"
        if now > self.deadline:
            return f"the audit's time budget ({self.max_seconds:.0f}s) is spent"
        return None

    def admit(self, path: str, size: int) -> float:
        """Before reading ``path`` of ``size`` bytes: raises Oversized / OutOfBudget; returns the
        file's own deadline. One clock read: this runs once per file hashed."""
        if size > self.max_file_bytes:
            raise Oversized(path, size, self.max_file_bytes)
        now = self.clock()
        if self.used > self.max_bytes or now > self.deadline:
            raise OutOfBudget(path, self._why(now) or "budget spent")
        return min(self.deadline, now + self.max_file_seconds)

    def charge(self, path: str, count: int, file_deadline: float) -> None:
        """After reading ``count`` more bytes of ``path``: raises OutOfBudget when a budget is spent.
        The byte count is shared by the hashing threads without a lock (a lost update undercounts
        by one chunk at most; the budget is a bound, not an account)."""
        self.used += count
        now = self.clock()
        if now > file_deadline:
            raise OutOfBudget(path, f"reading it took longer than the per-file budget ({self.max_file_seconds:.0f}s)")
        if self.used > self.max_bytes or now > self.deadline:
            raise OutOfBudget(path, self._why(now) or "budget spent")


class Changed(OSError):
    """``path`` no longer names the entry the walk stat-ed: renamed over, replaced (a parent directory
    too) or written since. What was read is not the content of the walked stat identity."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EAGAIN, CHANGED, path)


def same_file(now: os.stat_result, walked: os.stat_result) -> bool:
    """Whether two stats are of the same file, unchanged: device, inode, size, mtime, ctime and type."""
    return stat_identity(now) == stat_identity(walked) and stat.S_IFMT(now.st_mode) == stat.S_IFMT(walked.st_mode)


def _check(path: str, now: os.stat_result, expect: os.stat_result | None) -> None:
    if expect is not None and not same_file(now, expect):
        raise Changed(path)


def settled(st: os.stat_result, now_ns: int) -> bool:
    """Whether a digest of the file of stat ``st``, read after ``now_ns`` (``time.time_ns()`` taken
    before the read), may be cached under ``st``'s key: its last change (ctime) is DIGEST_RACY_NS
    older than ``now_ns``. Timestamps are coarse (a tick of the kernel clock): a write in the tick
    of the one that set ``st``'s ctime would leave the stat key as it is (tokenscan: the same rule)."""
    return st.st_ctime_ns < now_ns - DIGEST_RACY_NS


def _encode(algo: str, digest: bytes) -> str:
    return f"{algo}=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _fd_digest(
    fd: int,
    algo: str,
    path: str = "",
    expect: os.stat_result | None = None,
    budget: Budget | None = None,
    file_deadline: float | None = None,
) -> bytes:
    """The ``algo`` digest of everything readable from ``fd`` (closed here). The first read asks for
    the whole file (its size + 1) and later reads for 1 MiB: most files of an environment are a few
    KiB, and ``hashlib.file_digest`` allocates a 256 KiB buffer for each, which cost 3-4x the
    hashing of a small file. ``update`` releases the GIL on large chunks as ``file_digest`` does.
    With ``expect``: raises Changed unless the descriptor is of that file, unchanged, before and
    after the read (a write during the read moves its mtime and ctime)."""
    try:
        st = os.fstat(fd)
        _check(path, st, expect)
        if budget is not None and file_deadline is None:
            file_deadline = budget.admit(path, st.st_size)
        want = min(st.st_size + 1, HASH_CHUNK)
        digest = hashlib.new(algo)
        while data := os.read(fd, want):
            digest.update(data)
            want = HASH_CHUNK
            if budget is not None and file_deadline is not None:
                budget.charge(path, len(data), file_deadline)
        if expect is not None:
            _check(path, os.fstat(fd), expect)
        return digest.digest()
    finally:
        os.close(fd)


def _link_target(path: str, expect: os.stat_result | None) -> str:
    """The target string of the link ``path``; with ``expect``, of that very link (read through an
    ``O_PATH`` descriptor whose ``fstat`` is compared; without O_PATH, an ``lstat`` after the read)."""
    if expect is None:
        return os.readlink(path)
    if not hasattr(os, "O_PATH"):
        target = os.readlink(path)
        _check(path, os.lstat(path), expect)
        return target
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        _check(path, os.fstat(fd), expect)
        return os.readlink("", dir_fd=fd)  # readlinkat(fd, ""): the link the descriptor holds
    finally:
        os.close(fd)


def safe_digest(path: str, algo: str, expect: os.stat_result | None = None, budget: Budget | None = None) -> str:
    """``algo=urlsafe-b64-nopad`` as RECORD writes it: of the file's bytes, or for a symlink of
    its target string (a wheel never installs links, so a listed link never matches). With
    ``expect`` (the walk's lstat of ``path``): of that file only, else Changed (see the module
    doc). Raises OSError."""
    st = expect if expect is not None else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = _link_target(path, expect)
        return _encode(algo, hashlib.new(algo, target.encode("utf-8", "surrogateescape")).digest())
    deadline = budget.admit(path, st.st_size) if budget is not None else None  # an oversized file is never opened
    return _encode(algo, _fd_digest(open_regular_fd(path), algo, path, expect, budget, deadline))


def read_as(path: str, limit: int, expect: os.stat_result) -> bytes:
    """The whole content of the regular file ``path`` (at most ``limit`` bytes, else UnsafeFile) if it
    is the file of stat ``expect``, unchanged before and after the read; else raises Changed."""
    fd = open_regular_fd(path, max_bytes=limit)
    try:
        _check(path, os.fstat(fd), expect)
        data = read_fd(os.dup(fd), limit + 1)
        _check(path, os.fstat(fd), expect)  # equal sizes: it did not grow either
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Changed(path)
    return data


def sha256_hex(path: str, budget: Budget | None = None) -> str:
    """Hex sha256 of a regular file or of a symlink's target string (prefixed ``link:``). Raises
    OSError (Oversized / OutOfBudget with a ``budget``)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    deadline = budget.admit(path, st.st_size) if budget is not None else None
    return _fd_digest(open_regular_fd(path), "sha256", path, None, budget, deadline).hex()


def batches_of(
    items: Sequence[T], batch: int, weight: Callable[[T], int] | None = None, limit: int = 0
) -> list[list[T]]:
    """``items`` in order, cut into lists of at most ``batch`` items and (with ``weight``) closed once
    their weight reaches ``limit`` (pure)."""
    out: list[list[T]] = []
    current: list[T] = []
    total = 0
    for item in items:
        current.append(item)
        total += weight(item) if weight else 0
        if len(current) >= batch or (weight and total >= limit):
            out.append(current)
            current, total = [], 0
    if current:
        out.append(current)
    return out


def map_in_threads(
    fn: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    name: str,
    batch: int = 64,
    weight: Callable[[T], int] | None = None,
) -> Iterator[R]:
    """``fn`` over ``items`` in ``workers`` threads, results in order. Each task is a batch of
    ``batch`` items (with ``weight``, e.g. a file's size, also at most HASH_BATCH_BYTES of it): one
    future per file cost more than hashing a small file (``Executor.map``'s ``chunksize`` only
    batches for process pools), one batch of large files would leave the other threads idle."""
    if not items:
        return
    batches = batches_of(items, batch, weight, HASH_BATCH_BYTES)

    def run(chunk: Sequence[T]) -> list[R]:
        return [fn(item) for item in chunk]

    with cf.ThreadPoolExecutor(max(1, min(workers, len(batches))), thread_name_prefix=name) as pool:
        for results in pool.map(run, batches):
            yield from results


def link_escapes(path: str, roots: Iterable[str]) -> str | None:
    """The resolved target of the symlink ``path`` when it lies outside every root, else None."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    resolved = os.path.realpath(os.path.join(os.path.dirname(path), target))
    for root in roots:
        real = os.path.realpath(root)
        if resolved == real or resolved.startswith(real + os.sep):
            return None
    return resolved
