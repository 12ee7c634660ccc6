"""Change notification for watched directories (watchdog/inotify; the periodic rescan is the
fallback, since inotify misses writes by other NFS clients). Marks a directory dirty on any
create, delete, modify, move or close-after-write below it; reads (open, close without
write) are ignored so the scanner's own reads never trigger a rescan."""

from __future__ import annotations

import os
import threading
import time

from warden.watching import Change, TreeWatcher


class DirWatcher:
    """Remembers which watched paths changed (and when), from watchdog's thread."""

    def __init__(self) -> None:
        self._roots: dict[str, str] = {}  # real path -> watched path
        self._dirty: dict[str, float] = {}
        self._lock = threading.Lock()
        self._tree = TreeWatcher(self._changed)

    @property
    def active(self) -> bool:
        return self._tree.active

    def watch(self, path: str) -> bool:
        """Starts watching ``path`` recursively; False when it cannot (missing, no inotify)."""
        real = os.path.realpath(path)
        if not self._tree.watch(real):
            return False
        with self._lock:
            self._roots[real] = path
        return True

    def _changed(self, change: Change) -> None:
        self._mark(*change.paths)

    def _mark(self, *paths: str) -> None:
        now = time.monotonic()
        with self._lock:
            for changed in filter(None, paths):
                for real, watched in self._roots.items():
                    if changed == real or changed.startswith(real.rstrip("/") + "/"):
                        self._dirty[watched] = now

    def take_settled(self, settle_seconds: float) -> list[str]:
        """Watched paths changed at least ``settle_seconds`` ago (then forgotten)."""
        now = time.monotonic()
        with self._lock:
            ready = [p for p, t in self._dirty.items() if now - t >= settle_seconds]
            for p in ready:
                del self._dirty[p]
        return ready

    def close(self) -> None:
        self._tree.close()
