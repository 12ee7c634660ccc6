"""The reads of a scan's analysis, recorded so that a verdict is kept only for the bytes analysed.

A directory's verdict is stored under the digests the manifest computed (:func:`.verdict.verdict_key`),
but the analysis reads the files again: between the hashing and the reading, a file, or any
directory above it (a ``rename(2)`` of a parent leaves the file's own inode, ctime and link
count untouched), can be swapped for another. So every read of the analysis goes through
:class:`Opened`: the file is opened once (no final link, no FIFO, regular only), every read of
it is a ``pread`` of that one descriptor, and :class:`ReadLog` records the descriptor's
:func:`~.manifest.stat_key` when it is opened and when it is closed, and the SHA-256 of every
whole read. :func:`.verdict.reusable` stores a verdict only when those equal the listing's stat
keys and the manifest's digests.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from warden.safeio import open_regular_fd
from warden.tokenscan.manifest import stat_key

CHUNK = 1 << 20


class PreadFile(io.RawIOBase):
    """A read-only, seekable raw file over ``fd`` with its own position (``os.preadv``): several
    may read one descriptor at once. Closing it leaves ``fd`` open."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd, self.pos = fd, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = os.preadv(self.fd, [buffer], self.pos)
        self.pos += count
        return count

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos}.get(whence)
        if base is None:
            base = os.fstat(self.fd).st_size
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos


@dataclass
class ReadLog:
    """What one scan's analysis read: per file (relative name), the stat keys of the descriptors
    read (at open and at close) and the SHA-256 of every whole read."""

    keys: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    digests: dict[str, set[str]] = field(default_factory=dict)

    @contextmanager
    def open(self, rel: str, path: str) -> Iterator[Opened]:
        """``path`` (the file ``rel`` of the scan) opened for reading. Raises OSError."""
        fd = open_regular_fd(path)
        try:
            opened = Opened(fd, os.fstat(fd), self.digests.setdefault(rel, set()))
            self.keys.setdefault(rel, set()).add(stat_key(opened.st))
            yield opened
            self.keys[rel].add(stat_key(os.fstat(fd)))
        finally:
            os.close(fd)

    def matches(self, rel: str, key: tuple[int, ...], sha256: str) -> bool:
        """Whether every read of ``rel`` was of a descriptor with stat key ``key`` (the listing's,
        the hashed descriptor's) and every whole read had the digest ``sha256`` (the manifest's).
        False for a file never read."""
        return self.keys.get(rel) == {key} and self.digests.get(rel, set()) <= {sha256}


@dataclass
class Opened:
    """One open file of the analysis (see :meth:`ReadLog.open`)."""

    fd: int
    st: os.stat_result
    digests: set[str]

    @property
    def size(self) -> int:
        return self.st.st_size

    def stream(self) -> BinaryIO:
        """A buffered file object over the descriptor, at offset 0 (closing it keeps the descriptor)."""
        return io.BufferedReader(PreadFile(self.fd))  # type: ignore[return-value]

    def head(self, count: int) -> bytes:
        return os.pread(self.fd, count, 0)

    def read(self, limit: int) -> tuple[bytes, str]:
        """(up to ``limit`` bytes from offset 0, their SHA-256); the digest is recorded."""
        chunks, got, want = [], 0, min(self.size + 1, limit)  # one pread for a file that did not grow
        while got < limit and (data := os.pread(self.fd, min(max(want, 1), limit - got), got)):
            chunks.append(data)
            got += len(data)
            want = CHUNK
        data = b"".join(chunks)
        digest = hashlib.sha256(data).hexdigest()
        self.digests.add(digest)
        return data, digest
