"""A pure parser of ``/proc/self/mountinfo`` and a lexical mount lookup.

Nothing here stats, opens or resolves a watched path: the serving process must never
touch a path that may hang. :func:`find_mount` matches a path's text against mount
points (longest prefix; the last of stacked mounts wins), optionally preferring the
mount whose ``major:minor`` equals the device a probe child reported.

Line format (proc(5)): ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue``
-> mount id, parent id, major:minor, root, mount point, mount options, optional fields
ending with ``-``, filesystem type, source, super options. Spaces, tabs, newlines and
backslashes in fields are octal escapes (``\\040``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo."""

    mount_id: int
    parent_id: int
    dev: str  # "major:minor"
    root: str
    mount_point: str
    options: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        """True when the mount or its superblock is mounted ``ro``."""
        return "ro" in self.options or "ro" in self.super_options

    def describe(self) -> str:
        """``ext4 /dev/sda1 on /data (rw,relatime)``."""
        return f"{self.fstype} {self.source} on {self.mount_point} ({','.join(self.options)})"


def unescape(field: str) -> str:
    """Decodes mountinfo's octal escapes (``\\040`` -> space)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parses mountinfo text; malformed lines are skipped, order is kept (mount order)."""
    mounts = []
    for line in text.splitlines():
        parts = line.split(" ")
        try:
            sep = parts.index("-", 6)
            mounts.append(
                Mount(
                    mount_id=int(parts[0]),
                    parent_id=int(parts[1]),
                    dev=parts[2],
                    root=unescape(parts[3]),
                    mount_point=unescape(parts[4]),
                    options=tuple(parts[5].split(",")),
                    fstype=parts[sep + 1],
                    source=unescape(parts[sep + 2]),
                    super_options=tuple(parts[sep + 3].split(",")) if len(parts) > sep + 3 else (),
                )
            )
        except (ValueError, IndexError):
            continue
    return mounts


def read_mountinfo(path: str = MOUNTINFO) -> list[Mount]:
    """Reads and parses the mount table of this process's mount namespace."""
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return parse_mountinfo(fh.read())


def lexical_abspath(path: str, cwd: str | None = None) -> str:
    """An absolute, normalised path computed from text only (no symlinks resolved, no stat)."""
    base = cwd if cwd is not None else os.getcwd()
    return os.path.normpath(os.path.join(base, path))


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def find_mount(mounts: Sequence[Mount], path: str, dev: str | None = None) -> Mount | None:
    """The mount that holds absolute ``path`` by text: the longest matching mount point.

    Among mounts stacked on one mount point, the last listed (the top one) wins. With
    ``dev`` ("major:minor" from a probe), a matching mount whose device equals ``dev``
    is preferred over a longer match that does not (e.g. a bind mount seen via symlink).
    """
    candidates = [m for m in mounts if _under(path, m.mount_point)]
    if not candidates:
        return None
    if dev is not None:
        same_dev = [m for m in candidates if m.dev == dev]
        if same_dev:
            candidates = same_dev
    best = max(len(m.mount_point) for m in candidates)
    return [m for m in candidates if len(m.mount_point) == best][-1]


def mount_fields(mount: Mount | None) -> dict[str, object]:
    """A JSON-friendly summary for reports: fstype, mount_point, source, options, read_only."""
    if mount is None:
        return {"fstype": None, "mount_point": None, "source": None, "options": None, "read_only": None}
    return {
        "fstype": mount.fstype,
        "mount_point": mount.mount_point,
        "source": mount.source,
        "options": ",".join(mount.options),
        "read_only": mount.read_only,
    }
