"""Verify a checkpoint and load it from the same bytes, so a swap on disk cannot win.

Threat: whoever can write the checkpoint storage (shared NFS) but cannot read the signing
key. Contracts:

- The trust anchor is the signature bundle ``<dir>.sig`` verified under the trusted keys
  (:func:`signed_anchor`), or, without trusted keys, the trainer's own
  ``manifest.sha256.json`` (:func:`integrity_anchor`), which protects against accidents
  only: anyone who can write a file can rewrite the manifest too.
- :func:`read_verified` walks the directory through file descriptors opened with
  ``O_NOFOLLOW`` (no symlink is ever followed, at any depth), requires the tree to hold
  exactly the files the anchor names (an extra file, an extra or empty directory, a
  symlink, a FIFO or a missing file rejects the checkpoint), opens each file (``O_NONBLOCK``,
  regular files only by ``fstat``, bounded by a byte budget) and reads it once into a buffer of
  its ``fstat`` size, hashing each chunk as it arrives (still in cache) and comparing with the
  anchor; a file that grows or shrinks meanwhile is a rejection. Reading runs in a thread pool:
  a file signed in shards is split across the workers (each reads its shards at their offsets
  into the same buffer), a whole-file digest is one worker's; the first failure stops the rest.
  Deserialization then uses only those buffers (:meth:`VerifiedCheckpoint.tensors`: tensors are
  views of them, :func:`trainer.tensorfile.decode`; :meth:`VerifiedCheckpoint.json`).
- The signed statement carries digests but no sizes, so the size cap is a byte budget
  for the whole checkpoint that the caller derives from the model it will load into.
- The whole checkpoint is held in memory once (the tensors are views of it, not copies): one
  pass over the bytes, at the storage's read rate and the cores' hashing rate.

Every refusal raises :class:`CheckpointRejected` (exit 1) with a short reason in which
values read from files are quoted through :func:`quote_untrusted`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from trainer import checkpoint as ckpt
from trainer.tensorfile import TensorFileError, decode
from warden.errors import ViolationError, quote_untrusted
from warden.safeio import DIR_FLAGS, FILE_FLAGS, MAX_TREE_DEPTH, MAX_TREE_ENTRIES, open_root

MAX_ANCHOR_BYTES = 64 * 1024 * 1024
"""Cap on a signature bundle or manifest (a resource line is ~150 bytes)."""
READ_CHUNK = 1 << 20
"""Bytes read and then hashed at a time: the chunk is still in the core's cache for the hash."""
PIECE_BYTES = 64 << 20
"""Consecutive signed shards are read as one task of about this many bytes: enough tasks to spread one
large file over every worker, few enough that handing them out costs nothing."""
OPEN_BATCH = 256
"""Files held open at once: a checkpoint of many files is read in batches, never out of descriptors."""
MAPPED_BYTES = 1 << 20
"""Buffers from this size up are private anonymous mappings, whose pages the reading thread asks the
kernel to supply just before each chunk (``MADV_POPULATE_WRITE``: a fraction of what a page fault per
4 KiB costs), instead of a zero-filled bytearray. No ``MADV_HUGEPAGE``: where the kernel compacts
memory for it, a fault can stall for milliseconds."""
POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
"""Linux 5.14; elsewhere madvise refuses it and pages arrive by faults, as they would anyway."""

Pieces = tuple[tuple[int, int, str], ...]
"""Signed shards of one file, ``(start, end, sha256 hex)`` in order."""
BufferSource = Callable[[int], "memoryview | None"]
"""Lends a private writable buffer of the given size to read a file into, or None (a fresh one is made)."""


def default_workers() -> int:
    """Reading threads: one per core, at most 16 (hashing releases the GIL, so threads scale)."""
    return min(16, os.cpu_count() or 1)


class CheckpointRejected(ViolationError):
    """A checkpoint does not verify; ``reason`` is the short why for ``checkpoint.rejected``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Anchor:
    """What the trust anchor vouches for: ``{relative name: hex sha256}`` and provenance.

    ``signed`` is False for the integrity-only manifest; then run id, step and parent
    are None (the caller takes run id and step from the loaded ``trainer_state.json``).
    """

    digests: Mapping[str, str | Pieces]  # per file: sha256 hex, or its signed shards
    how: str
    signed: bool
    run_id: str | None = None
    step: int | None = None
    parent_root_digest: str | None = None
    root_digest: str | None = None


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose every file was read once and matched its anchor: ``{name: its buffer}``
    (a writable memoryview the tensors of :meth:`tensors` are views of)."""

    path: str
    step: int
    anchor: Anchor
    files: Mapping[str, memoryview]
    lent: bool = False
    """True when files may lie in lent buffers (``read_verified``'s ``buffers``): what outlives the load
    must be copied out of them."""

    def names(self, directory: str, suffix: str) -> list[str]:
        """Sorted names directly inside ``directory`` ending in ``suffix`` (only anchored files exist)."""
        return sorted(
            n for n in self.files if PurePosixPath(n).parent == PurePosixPath(directory) and n.endswith(suffix)
        )

    def json(self, name: str) -> Any:
        """``json.loads`` of a verified file; CheckpointRejected if it is absent or not JSON."""
        try:
            return json.loads(bytes(self._bytes(name)))
        except ValueError as exc:
            raise CheckpointRejected(f"{name}: not JSON ({quote_untrusted(exc)})") from None
        except RecursionError:
            raise CheckpointRejected(f"{name}: JSON nested too deeply") from None

    def tensors(self, name: str) -> dict[str, Any]:
        """The tensors of a verified safetensors file, as views of its buffer (:func:`trainer.tensorfile.decode`)."""
        try:
            return decode(self._bytes(name))
        except TensorFileError as exc:
            raise CheckpointRejected(f"{name}: not a safetensors file ({quote_untrusted(exc)})") from None

    def state(self, name: str) -> Any:
        """A nested state saved by :func:`trainer.checkpoint.save_state` as ``name.json`` (+ ``.safetensors``)."""
        skeleton = self.json(f"{name}.json")
        weights = f"{name}.safetensors"
        tensors = self.tensors(weights) if weights in self.files else {}
        try:
            return ckpt.unflatten_state(skeleton, tensors)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointRejected(f"{name}.json: not a saved state ({quote_untrusted(exc)})") from None
        except RecursionError:
            raise CheckpointRejected(f"{name}.json: nested too deeply to be a saved state") from None

    def _bytes(self, name: str) -> memoryview:
        if name not in self.files:
            raise CheckpointRejected(f"{name}: required but not part of the verified checkpoint")
        return self.files[name]


# -- anchors ------------------------------------------------------------------------------
def read_small_file(directory: str, name: str, *, follow_directory: bool) -> bytes:
    """``directory/name`` (a signature or manifest) read safely, at most MAX_ANCHOR_BYTES.

    ``follow_directory``: the checkpoint root may be a symlink (a mount); a checkpoint may not.
    Raises CheckpointRejected.
    """
    try:
        if follow_directory:
            fd = open_root(directory)
            try:
                return _read_regular(name, fd, MAX_ANCHOR_BYTES)
            finally:
                os.close(fd)
        with _open_dir(directory) as fd:
            return _read_regular(name, fd, MAX_ANCHOR_BYTES)
    except FileNotFoundError:
        raise CheckpointRejected(f"{name}: missing") from None
    except OSError as exc:
        raise CheckpointRejected(f"{name}: cannot read ({quote_untrusted(exc.strerror)})") from None


def signed_anchor(path: str, trusted: Any) -> Anchor:
    """The verified statement of ``<path>.sig`` under ``trusted`` (a signer TrustedKeys).

    Rejects a missing, unreadable, malformed, untrusted or invalid signature, and one
    whose subject is another directory (a moved signature).
    """
    from warden.signing.dsse import decode_bundle
    from warden.signing.errors import SignerError
    from warden.signing.verify import verified_statement

    parent, name = os.path.split(os.path.abspath(path))
    try:
        bundle = decode_bundle(read_small_file(parent, name + ".sig", follow_directory=True))
        key, statement = verified_statement(bundle, trusted)
    except CheckpointRejected as exc:
        raise CheckpointRejected(f"no valid signature: {exc.reason}") from None
    except SignerError as exc:
        raise CheckpointRejected(f"signature rejected: {quote_untrusted(exc)}") from None
    if statement.manifest.name != name:
        raise CheckpointRejected(
            f"the signature names checkpoint {quote_untrusted(repr(statement.manifest.name))}, not {name!r}"
        )
    prov = statement.provenance
    return Anchor(
        digests=file_pieces(statement.manifest),
        how=f"signature verified (key {key[:16]})",
        signed=True,
        run_id=prov.run_id,
        step=prov.step,
        parent_root_digest=prov.parent_root_digest,
        root_digest=statement.subject_digest,
    )


def file_pieces(manifest: Any) -> dict[str, str | Pieces]:
    """What the signature vouches for per file: a sha256 hex (``files``), or the file's shards as
    ``(start, end, sha256 hex)`` in order (``shards``). Raises CheckpointRejected for a hash the
    trainer cannot check (BLAKE3: sign run checkpoints with sha256)."""
    from warden.signing.manifest import split_shard_name

    serialization = manifest.serialization
    if serialization.hash_type != "sha256":
        raise CheckpointRejected(f"signed with {serialization.hash_type}; resume checks sha256 signatures only")
    if not serialization.sharded:
        return {r.name: r.hex for r in manifest.resources}
    pieces: dict[str, list[tuple[int, int, str]]] = {}
    for resource in manifest.resources:
        path, start, end = split_shard_name(resource.name)
        pieces.setdefault(path, []).append((start, end, resource.hex))
    return {path: tuple(sorted(found)) for path, found in pieces.items()}


def digest_problem(name: str, data: bytes, expected: str | Pieces) -> str | None:
    """Why ``data`` does not match what was vouched for ``name`` (pure); None when it does.

    Shards must cover the file exactly, from 0 to its length, each matching its digest. The reference
    semantics of :func:`read_verified`, which checks the layout first (:func:`layout_problem`) and
    the digests while reading: the same verdicts, the first problem found possibly another one.
    """
    if isinstance(expected, str):
        digest = hashlib.sha256(data).hexdigest()
        return None if digest == expected else f"{name}: sha256 {digest} != {quote_untrusted(expected, 80)}"
    position = 0
    for start, end, hex_digest in expected:
        if start != position:
            return f"{name}: the signed shards do not cover bytes {position}..{start}"
        if hashlib.sha256(data[start:end]).hexdigest() != hex_digest or end > len(data):
            return f"{name}: bytes {start}..{end} differ from the signed shard"
        position = end
    return None if position == len(data) else f"{name}: {len(data) - position} bytes after the last signed shard"


def layout_problem(name: str, size: int, shards: Pieces) -> str | None:
    """Why signed shards cannot describe a file of ``size`` bytes (pure): :func:`digest_problem`'s
    coverage rules, without the digests. None when they tile ``0..size``."""
    position = 0
    for start, end, _ in shards:
        if start != position:
            return f"{name}: the signed shards do not cover bytes {position}..{start}"
        if end > size:
            return f"{name}: bytes {start}..{end} differ from the signed shard"
        position = end
    return None if position == size else f"{name}: {size - position} bytes after the last signed shard"


def integrity_anchor(path: str) -> Anchor:
    """``manifest.sha256.json``: integrity against accidents only, not authenticity."""
    raw = read_small_file(path, ckpt.MANIFEST, follow_directory=False)
    try:
        files = json.loads(raw)["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointRejected(f"{ckpt.MANIFEST}: unreadable ({quote_untrusted(exc)})") from None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise CheckpointRejected(f"{ckpt.MANIFEST}: 'files' must map names to hex digests")
    digests = {**files, ckpt.MANIFEST: hashlib.sha256(raw).hexdigest()}
    return Anchor(digests, "manifest sha256 verified (integrity only, not authenticity)", signed=False)


# -- the tree and the bytes ---------------------------------------------------------------
def tree_problems(anchored: set[str], files: set[str], dirs: set[str], odd: Mapping[str, str]) -> list[str]:
    """Differences between the anchored names and what a scan found (pure).

    ``dirs`` are the directories found (relative, without the root); every one must hold
    an anchored file somewhere below it.
    """
    needed_dirs = {str(p) for name in anchored for p in PurePosixPath(name).parents if str(p) != "."}
    problems = [f"{quote_untrusted(n)}: {why}" for n, why in sorted(odd.items())]
    problems += [f"{quote_untrusted(n)}: an unlisted directory" for n in sorted(dirs - needed_dirs)]
    problems += [f"{quote_untrusted(n)}: an unlisted file" for n in sorted(files - anchored)]
    problems += [f"{n}: missing" for n in sorted(anchored - files - set(odd))]
    return problems


def read_verified(
    path: str,
    step: int,
    anchor: Anchor,
    budget: int,
    workers: int | None = None,
    buffers: BufferSource | None = None,
) -> VerifiedCheckpoint:
    """Scans ``path``, reads every anchored file once and checks its digests; see the module doc.

    ``budget`` caps the bytes read in total; ``workers`` reading threads (:func:`default_workers`).
    ``buffers(size)``, when given, lends the buffer a file of ``size`` bytes (from MAPPED_BYTES up) is
    read into, or None for a fresh one: memory already allocated and populated (the pinned staging
    arena, :meth:`trainer.staging.HostArena.lend`) costs no page faults, which dominate a cold resume
    on hosts where first touch is slow. Lent buffers must be private to this process.
    Raises CheckpointRejected.
    """
    try:
        with _open_dir(path) as root:
            files, dirs, odd = _scan(root)
            problems = tree_problems(set(anchor.digests), files, dirs, odd)
            if problems:
                listing = "signed manifest" if anchor.signed else ckpt.MANIFEST
                raise CheckpointRejected(_summary(f"the directory differs from the {listing}", problems))
            contents = _read_all(root, anchor, budget, workers or default_workers(), buffers)
    except _Differs as exc:
        raise CheckpointRejected(
            f"files differ from the {'signature' if anchor.signed else ckpt.MANIFEST}: {exc}"
        ) from None
    except FileNotFoundError as exc:
        raise CheckpointRejected(f"{quote_untrusted(exc.filename or path)}: vanished while read") from None
    except OSError as exc:
        raise CheckpointRejected(f"cannot read: {quote_untrusted(exc)}") from None
    return VerifiedCheckpoint(path, step, anchor, contents, lent=buffers is not None)


def _summary(head: str, problems: list[str], shown: int = 3) -> str:
    more = f" (+{len(problems) - shown} more)" if len(problems) > shown else ""
    return f"{head}: " + "; ".join(problems[:shown]) + more


@contextmanager
def _open_dir(path: str, dir_fd: int | None = None) -> Iterator[int]:
    """A directory fd opened without following a symlink; CheckpointRejected if it is none."""
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointRejected(f"{quote_untrusted(path)}: not a directory (a symlink?)") from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink; a checkpoint holds only files"
    return "not a regular file (FIFO, socket or device)"


def _scan(root: int) -> tuple[set[str], set[str], dict[str, str]]:
    """(regular files, directories, {odd entry: why}) below the directory fd ``root``, no link followed.

    Iterative, bounded by :data:`warden.safeio.MAX_TREE_DEPTH` levels and
    :data:`warden.safeio.MAX_TREE_ENTRIES` entries: a planted deep or wide tree is a rejection, never
    a RecursionError or an exhausted memory."""
    files: set[str] = set()
    dirs: set[str] = set()
    odd: dict[str, str] = {}
    stack: list[tuple[int, str, int]] = [(os.dup(root), "", 0)]
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    listed = [(e.name, e.stat(follow_symlinks=False).st_mode) for e in entries]
                if len(files) + len(dirs) + len(odd) + len(listed) > MAX_TREE_ENTRIES:
                    raise CheckpointRejected(f"more than {MAX_TREE_ENTRIES} entries: not a checkpoint")
                for name, mode in listed:
                    rel = prefix + name
                    if stat.S_ISDIR(mode):
                        if depth + 1 > MAX_TREE_DEPTH:
                            raise CheckpointRejected(f"{quote_untrusted(rel)}: deeper than {MAX_TREE_DEPTH} levels")
                        dirs.add(rel)
                        stack.append((_open_dir_fd(name, fd), rel + "/", depth + 1))
                    elif stat.S_ISREG(mode):
                        files.add(rel)
                    else:
                        odd[rel] = _kind(mode)
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return files, dirs, odd


def _open_dir_fd(name: str, dir_fd: int) -> int:
    """A directory fd opened without following a symlink (the caller closes it); CheckpointRejected if none."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointRejected(f"{quote_untrusted(name)}: not a directory (a symlink?)") from None
        raise


# -- reading in parallel ----------------------------------------------------------------------
class _Differs(Exception):
    """A file's bytes are not what the anchor vouches for; the message is :func:`digest_problem`'s kind."""


@dataclass(frozen=True)
class _File:
    """One anchored file being read: its descriptor, ``fstat`` size, the buffer it is read into and the
    digests to check as pieces (one piece covering the file for a whole-file sha256)."""

    name: str
    fd: int
    size: int
    view: memoryview
    region: mmap.mmap | None
    shards: Pieces
    whole: bool

    def tasks(self) -> list[Pieces]:
        """The file's shards grouped into tasks of about PIECE_BYTES, in order (a whole digest: one)."""
        tasks: list[Pieces] = []
        current: list[tuple[int, int, str]] = []
        size = 0
        for shard in self.shards:
            current.append(shard)
            size += max(0, shard[1] - shard[0])
            if size >= PIECE_BYTES:
                tasks.append(tuple(current))
                current, size = [], 0
        return [*tasks, tuple(current)] if current else tasks

    def mismatch(self, start: int, end: int, digest: str, expected: str) -> str:
        if self.whole:
            return f"{self.name}: sha256 {digest} != {quote_untrusted(expected, 80)}"
        return f"{self.name}: bytes {start}..{end} differ from the signed shard"


def _read_all(
    root: int, anchor: Anchor, budget: int, workers: int, buffers: BufferSource | None = None
) -> dict[str, memoryview]:
    """Every anchored file below ``root`` read and checked in a pool of ``workers`` threads.

    Files are opened one after the other in name order by the calling thread (the budget counts
    their ``fstat`` sizes in that order), in batches of OPEN_BATCH; each file's tasks go to the pool
    as soon as it is open. Raises _Differs, CheckpointRejected or OSError (the first failure)."""
    contents: dict[str, memoryview] = {}
    names = sorted(anchor.digests)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-read") as pool:
        for first in range(0, len(names), OPEN_BATCH):
            batch = _Batch(pool)
            try:
                for name in names[first : first + OPEN_BATCH]:
                    if batch.stop.is_set():
                        break  # a task failed already: finish() raises it
                    batch.add(_open_file(root, name, anchor.digests[name], budget, buffers))
                    budget -= batch.files[-1].size
                batch.finish()
            finally:
                batch.close()
            contents.update((file.name, file.view) for file in batch.files)
    return contents


class _Batch:
    """Files whose tasks run in the pool; the first task to fail stops the others at their next chunk."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.stop = threading.Event()
        self.files: list[_File] = []
        self.tasks: list[tuple[tuple[str, int], Future[None]]] = []

    def add(self, file: _File) -> None:
        self.files.append(file)
        for task in file.tasks():
            self.tasks.append(((file.name, task[0][0]), self.pool.submit(_read_task, file, task, self.stop)))

    def finish(self) -> None:
        """Waits for the tasks; raises the first failure in (name, offset) order, or CheckpointRejected
        for a file that is longer now than its ``fstat`` size (it grew while read)."""
        wait([future for _, future in self.tasks], return_when=FIRST_EXCEPTION)
        self._halt()
        failures = [(key, exc) for key, f in self.tasks if not f.cancelled() and (exc := f.exception()) is not None]
        if failures:
            raise min(failures, key=lambda failure: failure[0])[1]
        for file in self.files:
            if os.pread(file.fd, 1, file.size):
                raise CheckpointRejected(f"{file.name}: grew while read (past its {file.size} bytes)")

    def _halt(self) -> None:
        self.stop.set()
        for _, future in self.tasks:
            future.cancel()
        wait([future for _, future in self.tasks])

    def close(self) -> None:
        """Stops and waits for every task (none touches a descriptor afterwards), then closes them."""
        self._halt()
        for file in self.files:
            os.close(file.fd)


def _read_task(file: _File, task: Pieces, stop: threading.Event) -> None:
    """Reads the bytes of ``task``'s shards into the file's buffer, hashing each chunk as it arrives.

    Returns early once ``stop`` is set (another task failed); sets it when this one fails. Raises
    _Differs for a digest that does not match, CheckpointRejected for a file that shrank, OSError."""
    try:
        for start, end, expected in task:
            hasher = hashlib.sha256()
            for offset in range(start, end, READ_CHUNK):
                if stop.is_set():
                    return
                chunk = file.view[offset : min(end, offset + READ_CHUNK)]
                _populate(file, offset, len(chunk))
                _fill(file, chunk, offset)
                hasher.update(chunk)
            if hasher.hexdigest() != expected:
                raise _Differs(file.mismatch(start, end, hasher.hexdigest(), expected))
    except BaseException:
        stop.set()
        raise


def _fill(file: _File, chunk: memoryview, offset: int) -> None:
    """``chunk`` filled from the file at ``offset``; CheckpointRejected if the file ends first."""
    while chunk:
        got = os.preadv(file.fd, [chunk], offset)
        if got == 0:
            raise CheckpointRejected(f"{file.name}: shrank while read (below its {file.size} bytes)")
        chunk, offset = chunk[got:], offset + got


def _open_file(root: int, name: str, expected: str | Pieces, cap: int, buffers: BufferSource | None = None) -> _File:
    """``name`` (relative POSIX path) opened below ``root``, each component with O_NOFOLLOW, with its
    buffer; CheckpointRejected beyond ``cap`` bytes, _Differs for shards that cannot describe it."""
    fd, size = _open_parts(root, PurePosixPath(name).parts, cap, name)
    try:
        if isinstance(expected, str):
            return _File(name, fd, size, *_buffer(size, buffers), ((0, size, expected),), whole=True)
        problem = layout_problem(name, size, expected)
        if problem is not None:
            raise _Differs(problem)
        return _File(name, fd, size, *_buffer(size, buffers), expected, whole=False)
    except BaseException:
        os.close(fd)
        raise


def _buffer(size: int, buffers: BufferSource | None = None) -> tuple[memoryview, mmap.mmap | None]:
    """A writable buffer of ``size`` bytes that nobody else can write, and its mapping where it is one
    (from MAPPED_BYTES up: lent by ``buffers`` where it has room, else a fresh mapping, not zero-filled
    first: the kernel supplies each page as it is read into)."""
    if size < MAPPED_BYTES:
        return memoryview(bytearray(size)), None
    lent = buffers(size) if buffers is not None else None
    if lent is not None:
        if len(lent) != size or lent.readonly:
            raise ValueError(f"a lent buffer must be {size} writable bytes, got {len(lent)}")
        return lent, None
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return memoryview(region), region


def _populate(file: _File, offset: int, length: int) -> None:
    """Has the kernel supply the buffer's pages under ``offset..offset+length`` in one call."""
    if file.region is None:
        return
    start = offset - offset % mmap.PAGESIZE
    with suppress(OSError):  # an older kernel: the pages arrive by faults during the read instead
        file.region.madvise(POPULATE_WRITE, start, offset + length - start)


def _open_parts(directory: int, parts: tuple[str, ...], cap: int, shown: str) -> tuple[int, int]:
    if len(parts) == 1:
        return _open_regular(parts[0], directory, cap, shown)
    with _open_dir(parts[0], dir_fd=directory) as sub:
        return _open_parts(sub, parts[1:], cap, shown)


def _open_regular(name: str, dir_fd: int, cap: int, shown: str) -> tuple[int, int]:
    """(descriptor, size) of a regular file of at most ``cap`` bytes; never follows a link or blocks
    on a FIFO. The caller closes the descriptor."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointRejected(f"{shown}: a symlink; a checkpoint holds only files") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointRejected(f"{shown}: {_kind(st.st_mode)}")
        if st.st_size > cap:
            raise CheckpointRejected(f"{shown}: {st.st_size} bytes, over the {cap} bytes left in the budget")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _read_regular(name: str, dir_fd: int, cap: int) -> bytes:
    """All bytes of a small regular file (an anchor), at most ``cap``; never follows a link or blocks on a FIFO."""
    fd, _ = _open_regular(name, dir_fd, cap, name)
    try:
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 24, cap + 1 - total) or 1):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise CheckpointRejected(f"{name}: grew past the {cap} bytes left in the budget while read")
        return b"".join(chunks)
    finally:
        os.close(fd)
