"""Checkpoints without pickle, written atomically (docs/design.md section 3).

A checkpoint is filled into a private temporary directory ``<root>/.tmp-step-000000050.<random>/``
(mode 0700, created by the trainer's uid, addressed through its descriptor from then on, so a
storage writer can neither put entries into it nor redirect the trainer's writes by renaming it),
fsynced, opened to readers (0755) and renamed to ``step-000000050/``: a name without ``.tmp-`` is
always complete. Tensors go to safetensors, everything else to JSON.

Every file is serialised in memory and hashed from those bytes as it is written
(:class:`CheckpointWriter`, parallel across files); ``manifest.sha256.json`` (written last,
before the rename) lists those digests, and the announcement (:attr:`WrittenCheckpoint.announced`)
is computed from them: never from a re-read of the directory. A resume can check the
checkpoint's integrity against the manifest where no trusted keys are configured (against
accidents only: whoever can write a file can rewrite the manifest). Reading a checkpoint back
is :mod:`trainer.verified_load`'s job: it verifies and deserializes the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainer import tensorfile
from warden import safeio
from warden.errors import IncompleteError, quote_untrusted
from warden.safeio import DIR_FLAGS
from warden.signing.manifest import Announced, announced_root, shards_root

log = logging.getLogger("warden.trainer")

STEP_DIR = re.compile(r"step-([0-9]{9,})")
"""A checkpoint directory's name; matched with :func:`step_of_name`, which also requires the canonical
spelling (``step_dir_name``), so ``step-0000000004`` or a name ending in a newline is no alias of step 4."""
MANIFEST = "manifest.sha256.json"
STATE = "trainer_state.json"


class CheckpointError(IncompleteError):
    """A checkpoint could not be written or read; the message names the path."""


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def step_of_name(name: str) -> int | None:
    """The step a checkpoint directory name stands for, or None unless it is exactly ``step_dir_name``."""
    match = STEP_DIR.fullmatch(name)
    if match is None:
        return None
    step = int(match.group(1))
    return step if step_dir_name(step) == name else None


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    path: str


def list_complete(root: str) -> list[CheckpointRef]:
    """Complete checkpoints under ``root``, newest first."""
    refs = []
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                step = step_of_name(entry.name)
                if step is not None and entry.is_dir(follow_symlinks=False):  # a link named step-N is not one
                    refs.append(CheckpointRef(step, os.path.join(root, entry.name)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(refs, key=lambda r: r.step, reverse=True)


def remove_stale_temporaries(root: str) -> list[str]:
    """Deletes ``.tmp-step-*`` and ``.del-step-*`` entries left by a crash; returns their names.

    Through :func:`warden.safeio.remove_tree_at`: descriptor-relative, never following a link,
    iterative and bounded, so a planted deep tree or link is logged and left, never a crash."""
    removed = []
    try:
        root_fd = safeio.open_root(root)
    except OSError:
        return []
    try:
        for name in os.listdir(root_fd):
            if name.startswith((".tmp-step-", ".del-step-")):
                try:
                    safeio.remove_tree_at(root_fd, name)
                except OSError as exc:
                    log.warning(
                        "%s: stale temporary %s not removed: %s", root, quote_untrusted(name, 120), exc.strerror or exc
                    )
                    continue
                removed.append(name)
    finally:
        os.close(root_fd)
    return removed


# -- nested state <-> (JSON, tensors) --------------------------------------------------
def flatten_state(obj: Any, tensors: dict[str, torch.Tensor], path: str = "t") -> Any:
    """Replaces every tensor by ``{"__tensor__": key}`` and collects it in ``tensors``.

    Dict keys keep their type (optimizer state is keyed by int) via ``__items__``.
    """
    if isinstance(obj, torch.Tensor):
        key = f"{path}"
        tensors[key] = obj.detach()  # the sink copies it (the writer as it writes, the staging arena at once)
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__items__": [[k, flatten_state(v, tensors, f"{path}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(f"cannot store a {type(obj).__name__} at {path} without pickle")


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        return {k: unflatten_state(v, tensors) for k, v in obj["__items__"]}
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")


class CheckpointSink(Protocol):
    """What a fill function writes into: a :class:`CheckpointWriter`, or a
    :class:`trainer.staging.StagedImage` that copies the state for a later write."""

    def bytes(self, relative: str, payload: bytes) -> None: ...

    def json(self, relative: str, obj: Any) -> None: ...

    def tensors(
        self, relative: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
    ) -> None: ...


def save_state(writer: CheckpointSink, name: str, state: Any) -> None:
    """``name.json`` + ``name.safetensors`` (the latter only when there are tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten_state(state, tensors)
    writer.json(f"{name}.json", skeleton)
    if tensors:
        writer.tensors(f"{name}.safetensors", tensors)


class CheckpointWriter:
    """The files of one checkpoint, written into its private temporary directory.

    :meth:`bytes` (and :meth:`json`, :meth:`tensors`) take the serialised bytes, hash them in
    memory and write them exclusively (``O_EXCL | O_NOFOLLOW``, relative to the directory's
    descriptor), hashing and writing in a small thread pool while the caller serialises the next
    file. :attr:`path` names the directory itself (``/proc/self/fd``) for a library that can only
    write by path; :meth:`finish` hashes what such a library left (through the same descriptor:
    nobody else can write there) and lists it in :attr:`adopted`.
    """

    def __init__(self, dir_fd: int, workers: int = 4, shard_size: int | None = None) -> None:
        self._fd = dir_fd
        self._dirs: dict[str, int] = {"": dir_fd}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-write")
        self._pending: list[tuple[str, Future[FileDigests]]] = []
        self.shard_size = shard_size
        self.digests: dict[str, str] = {}
        self.shards: dict[tuple[str, int, int], bytes] = {}
        self.adopted: list[str] = []

    @property
    def path(self) -> str:
        return safeio.fd_path(self._fd)

    def bytes(self, relative: str, payload: bytes) -> None:
        self.buffers(relative, [memoryview(payload)])

    def buffers(self, relative: str, parts: list[memoryview]) -> None:
        """The file made of ``parts`` in order (kept alive until written)."""
        directory, name = self._dir_of(relative)
        self._pending.append((relative, self._pool.submit(_hash_and_write, directory, name, parts, self.shard_size)))

    def json(self, relative: str, obj: Any) -> None:
        self.bytes(relative, json_bytes(obj))

    def adopt(self, relative: str, src_dir_fd: int, src_name: str, digests: FileDigests, size: int) -> None:
        """Hard-links ``src_name`` of ``src_dir_fd`` (a file another process of this trainer wrote, hashed
        from its bytes as it wrote them, fsynced) in as ``relative`` and records ``digests`` for it, not
        hashing it again. The link must be a regular file of ``size`` bytes; raises CheckpointError."""
        directory, name = self._dir_of(relative)
        try:
            os.link(src_name, name, src_dir_fd=src_dir_fd, dst_dir_fd=directory, follow_symlinks=False)
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except OSError as exc:
            raise CheckpointError(f"{relative}: cannot link the rank's file in: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            raise CheckpointError(f"{relative}: the rank's file is not the {size}-byte regular file it reported")
        self._record(relative, digests)

    def tensors(self, relative: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        """A safetensors file of ``tensors``, encoded without copying them (:mod:`trainer.tensorfile`)."""
        self.buffers(relative, tensorfile.encode(tensors, metadata))

    def _dir_of(self, relative: str) -> tuple[int, str]:
        parts = relative.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise CheckpointError(f"{relative!r}: not a plain relative file name")
        prefix = ""
        for part in parts[:-1]:
            below = f"{prefix}/{part}" if prefix else part
            if below not in self._dirs:
                parent = self._dirs[prefix]
                os.mkdir(part, 0o755, dir_fd=parent)
                self._dirs[below] = os.open(part, DIR_FLAGS, dir_fd=parent)
            prefix = below
        return self._dirs[prefix], parts[-1]

    def finish(self) -> dict[str, str]:
        """Waits for every write; returns ``{relative name: sha256 hex}`` of every file (re-raises
        the first write error). Files written by path are adopted by hashing them once."""
        try:
            for relative, future in self._pending:
                self._record(relative, future.result())
            for relative in _files_below(self._fd):
                if relative not in self.digests:
                    fd = safeio.open_regular_fd(relative, dir_fd=self._fd)
                    with os.fdopen(fd, "rb") as fh:
                        os.fsync(fh.fileno())
                        self._record(relative, _hash_stream(fh, self.shard_size))
                    self.adopted.append(relative)
            for fd in self._dirs.values():
                os.fsync(fd)
        finally:
            self.close()
        return dict(self.digests)

    def _record(self, relative: str, digests: FileDigests) -> None:
        self.digests[relative] = digests.whole
        for start, end, raw in digests.shards:
            self.shards[(relative, start, end)] = raw

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for relative, fd in list(self._dirs.items()):
            if relative:
                os.close(fd)
        self._dirs = {"": self._fd}


HASH_WRITE_CHUNK = 8 * 1024 * 1024
"""Bytes hashed and then written at a time: the chunk is still in cache for the write."""


@dataclass(frozen=True)
class FileDigests:
    """One file's SHA-256 (hex) and, with a shard size, each shard's: ``(start, end, raw digest)``."""

    whole: str
    shards: tuple[tuple[int, int, bytes], ...] = ()


class _StreamHasher:
    """The whole-file SHA-256 and (with ``shard_size``) model_signing's per-shard SHA-256 of bytes fed in order."""

    def __init__(self, shard_size: int | None) -> None:
        self.shard_size = shard_size
        self.whole = hashlib.sha256()
        self.shard = hashlib.sha256()
        self.offset = self.shard_start = 0
        self.shards: list[tuple[int, int, bytes]] = []

    def pieces(self, data: memoryview) -> list[memoryview]:
        """``data`` cut at shard boundaries and in chunks of at most HASH_WRITE_CHUNK, each hashed."""
        out = []
        while data:
            room = HASH_WRITE_CHUNK
            if self.shard_size is not None:
                room = min(room, self.shard_start + self.shard_size - self.offset)
            piece, data = data[:room], data[room:]
            self.whole.update(piece)
            if self.shard_size is not None:
                self.shard.update(piece)
            self.offset += len(piece)
            if self.shard_size is not None and self.offset - self.shard_start == self.shard_size:
                self._close_shard()
            out.append(piece)
        return out

    def _close_shard(self) -> None:
        self.shards.append((self.shard_start, self.offset, self.shard.digest()))
        self.shard, self.shard_start = hashlib.sha256(), self.offset

    def result(self) -> FileDigests:
        if self.shard_size is not None and self.offset > self.shard_start:
            self._close_shard()
        return FileDigests(self.whole.hexdigest(), tuple(self.shards))


def _hash_and_write(dir_fd: int, name: str, parts: list[memoryview], shard_size: int | None = None) -> FileDigests:
    """Creates ``name`` exclusively, writes ``parts`` and returns the digests of exactly those bytes."""
    hasher = _StreamHasher(shard_size)
    fd = os.open(name, safeio.WRITE_FLAGS, 0o644, dir_fd=dir_fd)
    try:
        for part in parts:
            for piece in hasher.pieces(part.cast("B")):
                safeio.write_all(fd, piece)
        os.fsync(fd)
    finally:
        os.close(fd)
    return hasher.result()


def _hash_stream(fh: Any, shard_size: int | None) -> FileDigests:
    hasher = _StreamHasher(shard_size)
    while chunk := fh.read(HASH_WRITE_CHUNK):
        hasher.pieces(memoryview(chunk))
    return hasher.result()


def _files_below(dir_fd: int) -> list[str]:
    """Relative names of the regular files under the open directory ``dir_fd`` (the trainer's own
    private directory: links or special files there mean a bug, and are refused)."""
    out, stack = [], [("", os.dup(dir_fd))]
    while stack:
        prefix, fd = stack.pop()
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    relative = f"{prefix}{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((relative + "/", os.open(entry.name, DIR_FLAGS, dir_fd=fd)))
                    elif entry.is_file(follow_symlinks=False):
                        out.append(relative)
                    else:
                        raise CheckpointError(f"{relative}: not a regular file in the checkpoint being written")
        finally:
            os.close(fd)
    return sorted(out)


# -- manifest ----------------------------------------------------------------------------
def manifest_bytes(digests: dict[str, str], shards: dict[tuple[str, int, int], bytes] | None = None) -> bytes:
    """``manifest.sha256.json``: ``files`` maps each name to its sha256 hex; with ``shards`` (the
    writer's ``{(name, start, end): raw sha256}`` in the shards serialization) ``shards`` also maps each
    name of ``digests`` to its ``[[start, end, hex], ...]`` in order (an empty file: ``[]``), so a resume
    can match a shard signature against the trainer's names without hashing the files again."""
    manifest: dict[str, Any] = {"algorithm": "sha256", "files": digests}
    if shards is not None:
        listed: dict[str, list[list[Any]]] = {name: [] for name in digests}
        for (name, start, end), raw in sorted(shards.items()):
            if name in listed:
                listed[name].append([start, end, raw.hex()])
        manifest["shards"] = listed
    return json_bytes(manifest)


@dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint as the trainer serialised it: its final path and what its bytes hash to."""

    path: str
    digests: dict[str, str]
    announced: Announced


def write_checkpoint(
    root: str, step: int, fill: Callable[[CheckpointWriter], None], shard_size: int | None = None
) -> WrittenCheckpoint:
    """Calls ``fill(writer)``, writes the manifest, fsyncs and renames into place.

    Raises CheckpointError when the directory cannot be written; the temporary directory is
    removed then, so a failed write never looks complete. The announced digest is computed from
    the serialised bytes (plus the manifest's own), which the signer must then find on disk: per
    file (``files``), or with ``shard_size`` per shard (model_signing's ``shards`` serialization).
    """
    final = step_dir_name(step)
    try:
        safeio.make_root(root)
        root_fd = safeio.open_root(root)
    except OSError as exc:
        raise CheckpointError(f"{root}: checkpoint root not usable: {exc.strerror or exc}") from exc
    tmp: str | None = None
    try:
        tmp, tmp_fd = safeio.make_private_dir_at(root_fd, ".tmp-" + final)
        try:
            created = safeio.identity(os.fstat(tmp_fd))
            writer = CheckpointWriter(tmp_fd, shard_size=shard_size)
            try:
                fill(writer)
            finally:
                digests = writer.finish()
            digests.pop(MANIFEST, None)
            manifest = manifest_bytes(digests, None if shard_size is None else writer.shards)
            safeio.write_new_at(tmp_fd, MANIFEST, manifest)
            os.fsync(tmp_fd)
            os.fchmod(tmp_fd, 0o755)  # readable to the signer only now, complete
        finally:
            os.close(tmp_fd)
        _replace_into_place(root_fd, tmp, final, created)
        tmp = None
    except (OSError, CheckpointError) as exc:
        if tmp is not None:
            _discard(root_fd, tmp)
        os.close(root_fd)
        detail = exc.strerror or exc if isinstance(exc, OSError) else exc
        raise CheckpointError(f"{os.path.join(root, '.tmp-' + final)}: checkpoint write failed: {detail}") from exc
    except BaseException:  # a bug in the fill (an unsupported dtype, say): never leave a temporary behind
        if tmp is not None:
            _discard(root_fd, tmp)
        os.close(root_fd)
        raise
    os.close(root_fd)
    if shard_size is None:
        announced = announced_root({**digests, MANIFEST: hashlib.sha256(manifest).hexdigest()})
    else:
        shards = {k: v for k, v in writer.shards.items() if k[0] != MANIFEST}
        shards.update({(MANIFEST, s, e): raw for s, e, raw in _hash_stream(io.BytesIO(manifest), shard_size).shards})
        announced = shards_root(shards, shard_size, [*digests, MANIFEST])
    return WrittenCheckpoint(os.path.join(root, final), digests, announced)


def _replace_into_place(root_fd: int, tmp: str, final: str, created: tuple[int, int]) -> None:
    """Renames the filled temporary to ``final`` (retiring a same-step checkpoint first)."""
    doomed = None
    try:
        os.stat(final, dir_fd=root_fd, follow_symlinks=False)
        doomed = _retire_at(root_fd, final)  # the same step saved again
    except FileNotFoundError:
        pass
    safeio.rename_checked(root_fd, tmp, final, created)
    os.fsync(root_fd)
    if doomed:
        _discard(root_fd, doomed)


def _discard(root_fd: int, name: str) -> None:
    try:
        safeio.remove_tree_at(root_fd, name)
    except OSError as exc:
        log.warning("%s not removed: %s", quote_untrusted(name, 120), exc.strerror or exc)


def prune(
    root: str,
    keep_last: int,
    before_removal: Callable[[CheckpointRef], None] | None = None,
    eligible: Collection[int] | None = None,
) -> list[str]:
    """Deletes all but the newest ``keep_last`` complete checkpoints (and their .sig files).

    ``eligible``: the steps retention may count and remove (the trainer passes the checkpoints its
    journal announced and has not retired), so a directory someone else planted under the root, even
    one named above the current step, neither counts towards ``keep_last`` nor is ever removed.
    ``before_removal(ref)`` is called first for each (the trainer announces ``checkpoint.pruned``
    there, so the journal says why a checkpoint is gone before it is)."""
    removed: list[str] = []
    refs = [r for r in list_complete(root) if eligible is None or r.step in eligible][keep_last:]
    if not refs:
        return removed
    root_fd = safeio.open_root(root)
    try:
        for ref in refs:
            if before_removal is not None:
                before_removal(ref)
            name = os.path.basename(ref.path)
            try:
                doomed = _retire_at(root_fd, name)
            except OSError as exc:  # gone or replaced meanwhile: nothing of ours to remove
                log.warning("%s: not retired: %s", ref.path, exc.strerror or exc)
                continue
            try:
                info = os.stat(name + ".sig", dir_fd=root_fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(name + ".sig", dir_fd=root_fd)
            except OSError:
                pass  # no signature, or something else planted there: never followed, left alone
            _discard(root_fd, doomed)
            removed.append(ref.path)
    finally:
        os.close(root_fd)
    return removed


def _retire_at(root_fd: int, name: str) -> str:
    """Renames a complete checkpoint out of sight first, so a crash mid-delete never leaves a
    half-deleted ``step-N`` that looks complete. The retired name is fresh and unpredictable, so
    nothing planted there is ever replaced or removed."""
    doomed = f".del-{name}.{os.urandom(8).hex()}"
    os.rename(name, doomed, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    os.fsync(root_fd)
    return doomed
