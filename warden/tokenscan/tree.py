"""Lists a directory without following anything, and classifies every link.

:func:`walk` returns one :class:`Entry` per name under the root (never descending into a
symlinked directory), with what a link resolves to and whether that stays inside the
root. HF-cache layouts (``<repo>/snapshots/<rev>/file -> ../../blobs/<sha>``) are
recognised so a policy can allow them. :func:`outside_hard_links` finds regular files
whose other names live outside the tree. I/O only; the link checks themselves are pure.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass

MAX_ENTRIES = 200_000


class TreeError(OSError):
    """The root cannot be listed (missing, not a directory, unreadable)."""


@dataclass(frozen=True)
class Entry:
    """``kind``: file, dir, symlink or special. For symlinks: ``target`` (readlink),
    ``real`` (realpath), ``target_kind`` (file, dir, missing, special), ``inside``
    (real path within the root), ``hf_blob`` (an HF-cache blob of the same repo)."""

    rel: str
    kind: str
    size: int = 0
    dev: int = 0
    ino: int = 0
    nlink: int = 1
    target: str | None = None
    real: str | None = None
    target_kind: str | None = None
    inside: bool = True
    hf_blob: bool = False
    error: str | None = None


def within(path: str, root: str) -> bool:
    """Whether the (already resolved) ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def hf_blobs_dir(root_real: str) -> str | None:
    """``<repo>/blobs`` when ``root_real`` is inside ``<repo>/snapshots/<rev>``, else None."""
    parts = root_real.rstrip("/").split("/")
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots":
            return "/".join(parts[:i]) + "/blobs"
    return None


def _target_kind(real: str) -> str:
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    return "dir" if stat.S_ISDIR(mode) else "special"


def _symlink(path: str, rel: str, root_real: str, blobs: str | None) -> Entry:
    target = os.readlink(path)
    real = os.path.realpath(path)
    inside = within(real, root_real)
    hf_blob = bool(blobs) and not inside and os.path.dirname(real) == blobs
    return Entry(
        rel, "symlink", target=target, real=real, target_kind=_target_kind(real), inside=inside, hf_blob=hf_blob
    )


def _entry(path: str, rel: str, st: os.stat_result, root_real: str, blobs: str | None) -> Entry:
    if stat.S_ISLNK(st.st_mode):
        return _symlink(path, rel, root_real, blobs)
    if stat.S_ISDIR(st.st_mode):
        return Entry(rel, "dir", dev=st.st_dev, ino=st.st_ino)
    kind = "file" if stat.S_ISREG(st.st_mode) else "special"
    return Entry(rel, kind, st.st_size, st.st_dev, st.st_ino, st.st_nlink)


def walk(root: str) -> tuple[str, list[Entry]]:
    """(realpath of root, entries sorted by name). Raises TreeError for an unusable root;
    an unreadable subdirectory is an Entry with ``error`` set (the scan is then incomplete)."""
    try:
        if not os.path.isdir(root):
            raise TreeError(f"{root}: not a directory" if os.path.exists(root) else f"{root}: no such directory")
        root_real = os.path.realpath(root)
        os.listdir(root_real)
    except TreeError:
        raise
    except OSError as exc:
        raise TreeError(f"{root}: cannot list ({exc.strerror})") from None
    blobs = hf_blobs_dir(root_real)
    entries: list[Entry] = []
    stack = [""]
    while stack and len(entries) < MAX_ENTRIES:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root_real, rel_dir)) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            entries.append(Entry(rel_dir or ".", "dir", error=f"cannot list ({exc.strerror})"))
            continue
        for child in children:
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            try:
                entry = _entry(child.path, rel, child.stat(follow_symlinks=False), root_real, blobs)
            except OSError as exc:
                entry = Entry(rel, "file", error=f"cannot stat ({exc.strerror})")
            entries.append(entry)
            if entry.kind == "dir" and not entry.error:
                stack.append(rel)
    if stack:
        entries.append(Entry(".", "dir", error=f"more than {MAX_ENTRIES} entries; listing stopped"))
    entries.sort(key=lambda e: e.rel)
    return root_real, entries


def outside_hard_links(entries: list[Entry]) -> list[Entry]:
    """Regular files with more links than names in the tree (their data is shared outside)."""
    names = Counter((e.dev, e.ino) for e in entries if e.kind == "file")
    return [e for e in entries if e.kind == "file" and e.nlink > names[(e.dev, e.ino)]]
