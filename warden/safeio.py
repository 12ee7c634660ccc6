"""Opening files an attacker may control: no link following, no blocking, regular files only, capped.

Whoever can write a directory Warden reads (checkpoints, archive stores, tokenizers,
site-packages) can put a symlink where a file was, a FIFO that blocks ``open()`` forever,
or a file of any size. Every such read goes through here:

- ``O_NOFOLLOW``: a final symlink is refused (``ELOOP``), never followed;
- ``O_NONBLOCK``: opening a FIFO returns at once instead of waiting for a writer;
- ``fstat`` on the opened descriptor: only a regular file is read (no TOCTOU between a
  ``stat`` and the ``open``);
- a byte cap: a file larger than the cap is refused before its content is read, and a
  file that grows while it is read is refused too.

:func:`open_dir_nofollow` opens a directory so that no component of the path is a link
(each one is opened relative to its parent with ``O_NOFOLLOW``), for trees in which an
intermediate link would redirect every file below it.
"""

from __future__ import annotations

import contextlib
import errno
import operator
import os
import secrets
import stat
from typing import BinaryIO

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


RACY_NS = 2_000_000_000
"""A file whose ctime is this recent may change again within one timestamp tick without its
stat identity changing (git's "racily clean"): what was read of it is not remembered by stat."""

stat_identity = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
"""``stat_identity(st)``: (dev, inode, size, mtime_ns, ctime_ns), what identifies unchanged content
without reading it (in C). ``ctime`` is set by the kernel on every change and cannot be set from
user space, so a file rewritten (even with its size and mtime restored) gets another identity."""


class UnsafeFile(OSError):
    """A path that is not a plain regular file within its cap. ``reason``: link, not_regular, too_large."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(errno.EINVAL, detail, path)
        self.reason = reason


def open_regular_fd(path: str, *, dir_fd: int | None = None, max_bytes: int | None = None) -> int:
    """A read-only descriptor of ``path`` (relative to ``dir_fd`` when given) if it is a regular file
    of at most ``max_bytes``. Raises UnsafeFile, or the OSError of the open (ENOENT, EACCES, ...)."""
    try:
        fd = os.open(path, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(path, "link", "a symbolic link (never followed)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(path, "not_regular", "not a regular file (a FIFO, device or directory)")
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafeFile(path, "too_large", f"{info.st_size} bytes, over the {max_bytes}-byte cap")
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str, *, dir_fd: int | None = None, max_bytes: int | None = None) -> BinaryIO:
    """:func:`open_regular_fd` as a binary file object (closing it closes the descriptor)."""
    return os.fdopen(open_regular_fd(path, dir_fd=dir_fd, max_bytes=max_bytes), "rb")


READ_CHUNK = 1024 * 1024
"""Bytes per ``os.read`` after the first one of :func:`read_fd`."""


def read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd`` (closed here), read with ``os.read`` sized by ``fstat``.

    Why not a buffered ``read(limit)``: it allocates ``limit`` bytes first (64 MiB for a 10 KiB
    file under a 64 MiB cap: 4-5x the cost of the read itself).
    """
    try:
        want = min(os.fstat(fd).st_size + 1, limit)
        chunks = []
        got = 0
        while got < limit and (data := os.read(fd, min(max(want, 1), limit - got))):
            chunks.append(data)
            got += len(data)
            want = READ_CHUNK
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular(path: str, max_bytes: int, *, dir_fd: int | None = None) -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` (one extra byte is read so that
    a file that grew past the cap after the check is refused, not silently cut)."""
    data = read_fd(open_regular_fd(path, dir_fd=dir_fd, max_bytes=max_bytes), max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(path, "too_large", f"grew past the {max_bytes}-byte cap while it was read")
    return data


def open_dir_nofollow(path: str) -> int:
    """A descriptor of directory ``path`` such that no component of it is a symbolic link.

    Each component is opened relative to the previous one with ``O_NOFOLLOW``. Raises
    UnsafeFile (a component is a link) or the OSError of the open.
    """
    absolute = os.path.abspath(path)
    fd = os.open("/", DIR_FLAGS)
    try:
        for part in [p for p in absolute.split("/") if p]:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                # Linux answers ENOTDIR (or ELOOP) for a link opened O_NOFOLLOW | O_DIRECTORY.
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, fd):
                    raise UnsafeFile(absolute, "link", f"component {part!r} is a symbolic link") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_regular_below(root: str, relative: str, max_bytes: int) -> bytes:
    """:func:`read_regular` of ``root/relative`` where no component below ``root`` may be a link.

    ``root`` is the operator's choice (it may be a mount point reached through a link);
    everything under it may have been written by someone else, directories included.
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafeFile(relative, "not_regular", "not a plain relative file name")
    fd = open_dirs_below(root, parts[:-1])
    try:
        return read_regular(parts[-1], max_bytes, dir_fd=fd)
    finally:
        os.close(fd)


# -- writing: atomic replacement through unpredictable, exclusively created temporaries ----------
TEMP_PREFIX = ".tmp-"
"""Every temporary this module creates is named ``.tmp-<name>.<16 random hex>``."""
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: str) -> None:
    """Makes a rename or create inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(name: str) -> str:
    """A fresh temporary name for ``name`` in the same directory: unpredictable, so nobody can plant
    an entry there in advance (and one planted anyway makes the exclusive create fail, never followed)."""
    return f"{TEMP_PREFIX}{name[:128]}.{secrets.token_hex(8)}"


def write_all(fd: int, payload: bytes | memoryview) -> None:
    """``os.write`` until every byte of ``payload`` is written (short writes continue)."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write_at(dir_fd: int, name: str, payload: bytes, mode: int = 0o644, *, sync_first: bool = True) -> None:
    """Replaces entry ``name`` of the directory ``dir_fd`` with ``payload``; readers see the old or
    the new file, never half of one.

    The temporary is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an unpredictable name
    (:func:`temp_name`), written, fsynced and renamed over ``name`` relative to ``dir_fd`` (a link at
    ``name`` is replaced, never followed), then the directory is fsynced. Where others can write the
    directory they can still swap the temporary between the write and the rename: the entry is
    checked afterwards to be the inode written here, and UnsafeFile is raised otherwise, so success
    is never reported for bytes this process did not write. On any error the temporary is removed.
    ``name`` must be a plain entry name.

    ``sync_first`` False renames first and fsyncs after: the file is durable when this returns, as
    always, but visible complete as soon as it is written. For a file whose writer replays its work
    after a crash until the call has returned (the signer's ``.sig``): an fsync on a filesystem that is
    writing back gigabytes of another file waits for that writeback's journal commit.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a plain entry name: {name!r}")
    tmp = temp_name(name)
    fd = os.open(tmp, WRITE_FLAGS, mode, dir_fd=dir_fd)
    try:
        written = identity(os.fstat(fd))
        write_all(fd, payload)
        if sync_first:
            os.fsync(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if not sync_first:
            check_identity(dir_fd, name, written)
            os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
    os.fsync(dir_fd)
    check_identity(dir_fd, name, written)


def check_identity(dir_fd: int, name: str, expected: tuple[int, int]) -> None:
    """Raises UnsafeFile unless entry ``name`` of ``dir_fd`` is the inode ``expected`` (not followed)."""
    try:
        found = identity(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        found = (-1, -1)
    if found != expected:
        raise UnsafeFile(name, "swapped", "was replaced by someone else right after it was written; not trusted")


def atomic_write_bytes(path: str, payload: bytes, mode: int = 0o644, *, sync_first: bool = True) -> None:
    """Writes ``payload`` to ``path`` atomically (:func:`atomic_write_at` in ``path``'s directory).

    The directory itself is the caller's choice and may be reached through links; everything from
    there on is descriptor-relative and never follows a planted name.
    """
    directory = os.path.dirname(os.path.abspath(path))
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        atomic_write_at(dir_fd, os.path.basename(path), payload, mode, sync_first=sync_first)
    finally:
        os.close(dir_fd)


# -- directories the storage writer can reach: descriptor-relative, no links, bounded ------------
MAX_TREE_DEPTH = 64
"""Deepest directory level a walk or removal descends to; a deeper tree is refused, not recursed."""
MAX_TREE_ENTRIES = 1_000_000
"""Most entries a walk or removal visits; more is refused (a planted tree must not exhaust memory)."""


class TreeTooLarge(OSError):
    """A directory tree deeper than its depth cap or with more entries than its entry cap."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(errno.E2BIG, detail, path)


def identity(st: os.stat_result) -> tuple[int, int]:
    """(st_dev, st_ino): which inode an entry is, whatever its name now."""
    return st.st_dev, st.st_ino


def make_private_dir_at(dir_fd: int, prefix: str) -> tuple[str, int]:
    """Creates ``<prefix>.<16 random hex>`` in ``dir_fd``, mode 0700, and returns (name, descriptor).

    Nobody but this uid can create, rename or remove entries inside it; the descriptor keeps
    addressing this very directory even if its name is moved (use :func:`fd_path` to hand it to
    a library that wants a path)."""
    name = f"{prefix}.{secrets.token_hex(8)}"
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise UnsafeFile(name, "not_regular", "the new private directory is not ours alone")
    return name, fd


def fd_path(fd: int) -> str:
    """A path that names the open directory ``fd`` itself (Linux ``/proc/self/fd``), immune to renames."""
    return f"/proc/self/fd/{fd}"


def rename_checked(
    dir_fd: int, src: str, dst: str, expected: tuple[int, int], *, dst_dir_fd: int | None = None
) -> None:
    """Renames ``src`` to ``dst`` (relative to the directory descriptors) if ``src`` is still the inode
    ``expected`` (:func:`identity`); a swapped or replaced entry raises UnsafeFile and is left alone.

    A link at ``src`` is never followed (its own identity is compared)."""
    found = identity(os.stat(src, dir_fd=dir_fd, follow_symlinks=False))
    if found != expected:
        raise UnsafeFile(src, "swapped", f"is no longer the entry this process created ({found} != {expected})")
    target_dir = dir_fd if dst_dir_fd is None else dst_dir_fd
    os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=target_dir)
    check_identity(target_dir, dst, expected)  # swapped between the check and the rename


def remove_tree_at(
    dir_fd: int, name: str, *, max_depth: int = MAX_TREE_DEPTH, max_entries: int = MAX_TREE_ENTRIES
) -> int:
    """Removes entry ``name`` of ``dir_fd`` and, if it is a directory, everything below it; returns
    the number of entries removed.

    Iterative (no recursion), descriptor-relative, never follows a link (a link is removed as an
    entry), bounded by ``max_depth`` and ``max_entries`` (TreeTooLarge: what was removed stays
    removed, the rest is left). A FIFO or device is unlinked without being opened.
    """
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return 1
    removed = 0
    # each frame: descriptor of a directory, its name in the parent, the parent's descriptor, and
    # the entries of it still to remove (listed once: the listing counts against the entry cap)
    stack: list[tuple[int, str, int, list[tuple[str, bool]]]] = []
    listed = 0
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        stack.append((fd, name, dir_fd, []))
        listed += _list_into(fd, stack[-1][3], max_entries - listed, name)
        while stack:
            fd, own_name, parent, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(fd)
                os.rmdir(own_name, dir_fd=parent)
                removed += 1
                continue
            entry_name, is_dir = pending.pop()
            if not is_dir:
                os.unlink(entry_name, dir_fd=fd)
                removed += 1
                continue
            if len(stack) >= max_depth:
                raise TreeTooLarge(name, f"deeper than {max_depth} levels; not removed past that")
            child = os.open(entry_name, DIR_FLAGS, dir_fd=fd)
            stack.append((child, entry_name, fd, []))
            listed += _list_into(child, stack[-1][3], max_entries - listed, name)
    finally:
        for fd, _, _, _ in stack:
            os.close(fd)
    return removed


def _list_into(fd: int, out: list[tuple[str, bool]], budget: int, top: str) -> int:
    """Appends (name, is a real directory) of every entry of the open directory ``fd`` to ``out``."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if len(out) >= budget:
                raise TreeTooLarge(top, "more entries than the cap; not removed past that")
            out.append((entry.name, entry.is_dir(follow_symlinks=False)))
    return len(out)


def write_new_at(dir_fd: int, name: str, payload: bytes | memoryview, mode: int = 0o644) -> None:
    """Creates ``name`` in ``dir_fd`` exclusively (``O_EXCL | O_NOFOLLOW``), writes and fsyncs it.
    A name that already exists, link or not, is an error: nothing planted is ever written through."""
    fd = os.open(name, WRITE_FLAGS, mode, dir_fd=dir_fd)
    try:
        write_all(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def open_dirs_below(root: str, parts: list[str], *, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of ``root/parts[0]/parts[1]/...`` where no component below ``root`` is a link
    (each is opened relative to its parent with ``O_NOFOLLOW``; with ``create``, made when missing).

    ``root`` is the operator's choice; everything below it may be the storage writer's, so a planted
    link there can never redirect a write. Raises UnsafeFile (a component is a link) or OSError."""
    if any(p in ("", ".", "..") or "/" in p for p in parts):
        raise UnsafeFile("/".join(parts), "not_regular", "not a plain relative directory name")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, fd):
                    raise UnsafeFile(os.path.join(root, *parts), "link", f"directory {part!r} is a link") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def create_new_at(dir_fd: int, name: str, payload: bytes, mode: int = 0o644) -> bool:
    """Creates ``name`` in ``dir_fd`` with ``payload`` if no entry of that name exists (False if one
    does, link or not): written to an exclusive temporary, fsynced, then hard-linked into place
    (``link(2)`` never replaces and, relative to the descriptor, never follows a planted name)."""
    tmp = temp_name(name)
    write_new_at(dir_fd, tmp, payload, mode)
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
    os.fsync(dir_fd)
    return True


def make_root(path: str) -> None:
    """Creates the operator's root directory (and its parents) if missing. The root is the one path
    followed as given; everything below it is opened through this module, relative to it."""
    os.makedirs(path, exist_ok=True)


def open_root(path: str) -> int:
    """A descriptor of the operator's root directory ``path`` (links in it followed: it is the
    operator's choice, e.g. a checkpoint root linked to a mount); work below it goes relative to it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
