"""Walking and reading an environment an attacker may have written (I/O edge, no policy).

- :func:`walk_tree` lists a tree with ``lstat`` only: directories are descended, every
  other entry (file, symlink, symlinked directory, FIFO, socket, device) is returned with
  its own ``lstat``; a directory that cannot be listed is returned in ``unreadable``, never
  skipped silently.
- :func:`safe_digest` never follows a link and never blocks: a symlink is hashed as its
  target *string* (so the incremental cache, keyed by the link's ``lstat``, and the hash
  describe the same object), a regular file is opened with ``warden.safeio`` (``O_NOFOLLOW |
  O_NONBLOCK``, checked again with ``fstat``), anything else raises.
- :func:`read_small` reads at most ``limit`` bytes of a regular file the same way.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from warden.safeio import open_regular_fd

READ_LIMIT = 16 * 1024 * 1024


@dataclass
class WalkResult:
    """``files``: every non-directory entry with its lstat; ``unreadable``: 'path: why' lines."""

    files: dict[str, os.stat_result] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)


def walk_tree(root: str, prune: Iterable[str] = ()) -> WalkResult:
    """Every entry below ``root`` (links and special files included, never followed).

    Directories in ``prune`` (absolute paths) are not descended (they are walked as roots
    of their own). A root that does not exist gives an empty result."""
    out = WalkResult()
    skip = set(prune)
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exc:
            out.unreadable.append(f"{current}: cannot list directory ({exc.strerror or exc})")
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                out.unreadable.append(f"{entry.path}: cannot stat ({exc.strerror or exc})")
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.path not in skip:
                    stack.append(entry.path)
            else:
                out.files[entry.path] = st
    return out


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
    fd = open_regular_fd(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def _encode(algo: str, digest: bytes) -> str:
    return f"{algo}=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def safe_digest(path: str, algo: str) -> str:
    """``algo=urlsafe-b64-nopad`` as RECORD writes it: of the file's bytes, or for a symlink of
    its target string (a wheel never installs links, so a listed link never matches). Raises OSError."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return _encode(algo, hashlib.new(algo, os.readlink(path).encode("utf-8", "surrogateescape")).digest())
    fd = open_regular_fd(path)
    with os.fdopen(fd, "rb") as fh:
        return _encode(algo, hashlib.file_digest(fh, algo).digest())


def sha256_hex(path: str) -> str:
    """Hex sha256 of a regular file or of a symlink's target string (prefixed ``link:``). Raises OSError."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    fd = open_regular_fd(path)
    with os.fdopen(fd, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
