"""How long something written in place has been quiet, judged two ways; one helper for the
bridge (verl dumps and checkpoints) and the signer (HF and verl checkpoint roots).

verl and HF write their checkpoints (and verl its rollout dumps) in place, without a rename
that would mark them complete, so readers wait until nothing changed for ``stable_seconds``.
Quiet time is the longer of: how long the same fingerprint has been seen by this process
(works for a service, immune to clock skew), and how old the newest mtime/ctime is (works
for one ``--once`` pass; ctime also catches files copied with their old mtimes).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


class Stability:
    """Remembers when each key's fingerprint was first seen."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, tuple[Hashable, float]] = {}

    def quiet_for(self, key: Hashable, fingerprint: Hashable, newest_change: float, now: float) -> float:
        """Seconds ``key`` has been unchanged (recording this observation)."""
        previous = self._seen.get(key)
        if previous is None or previous[0] != fingerprint:
            self._seen[key] = (fingerprint, now)
            since = now
        else:
            since = previous[1]
        return max(0.0, now - since, now - newest_change)

    def forget(self, keep: Iterable[Hashable]) -> None:
        """Drops every key not in ``keep`` (emitted or gone)."""
        wanted = set(keep)
        for key in [k for k in self._seen if k not in wanted]:
            del self._seen[key]


@dataclass(frozen=True)
class TreeState:
    """Fingerprint of a tree ((path, size, mtime_ns) of every entry) and its newest change."""

    fingerprint: tuple[tuple[str, int, int], ...]
    last_change: float


def tree_state(path: str, extra: Iterable[str] = ()) -> TreeState | None:
    """Walks ``path`` (without following links) plus the ``extra`` files; None if ``path`` is gone
    or is not a directory.

    ``last_change`` is the newest mtime or ctime of any entry (ctime catches ``cp -p``).
    """
    entries: list[tuple[str, int, int]] = []
    newest = 0.0
    pending = [path]
    for extra_path in extra:
        with contextlib.suppress(OSError):
            st = os.lstat(extra_path)
            entries.append((extra_path, st.st_size, st.st_mtime_ns))
            newest = max(newest, st.st_mtime, st.st_ctime)
    while pending:
        directory = pending.pop()
        try:
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(directory)
            with os.scandir(directory) as scan:
                children = list(scan)
        except (FileNotFoundError, NotADirectoryError):
            if directory == path:
                return None
            continue
        except OSError:
            continue
        entries.append((directory, st.st_size, st.st_mtime_ns))
        newest = max(newest, st.st_mtime, st.st_ctime)
        for child in children:
            try:
                cst = child.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(cst.st_mode):
                pending.append(child.path)
            else:
                entries.append((child.path, cst.st_size, cst.st_mtime_ns))
                newest = max(newest, cst.st_mtime, cst.st_ctime)
    return TreeState(tuple(sorted(entries)), newest)
