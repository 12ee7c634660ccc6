"""Change notification for watched directories (watchdog/inotify; the periodic rescan is the
fallback, since inotify misses writes by other NFS clients). Marks a directory dirty on any
create, delete, modify, move or close-after-write below it; reads (open, close without
write) are ignored so the scanner's own reads never trigger a rescan."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from warden.watching import write_events

IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


class DirWatcher:
    """``changed(path)`` is called from watchdog's thread with the watched root that changed."""

    def __init__(self) -> None:
        self._observer: Any = None
        self._roots: dict[str, str] = {}  # real path -> watched path
        self._scheduled: set[str] = set()
        self._dirty: dict[str, float] = {}
        self._lock = threading.Lock()
        try:
            from watchdog.observers import Observer

            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()
        except (ImportError, OSError):
            self._observer = None

    @property
    def active(self) -> bool:
        return self._observer is not None

    def watch(self, path: str) -> bool:
        """Starts watching ``path`` recursively; False when it cannot (missing, no inotify)."""
        real = os.path.realpath(path)
        if self._observer is None or real in self._scheduled or not os.path.isdir(real):
            return real in self._scheduled
        from watchdog.events import FileSystemEventHandler

        watcher = self

        class _Handler(FileSystemEventHandler):  # type: ignore[misc]
            def on_any_event(self, event: Any) -> None:
                if event.event_type not in IGNORED_EVENTS:
                    watcher._mark(str(event.src_path), str(getattr(event, "dest_path", "") or ""))

        try:
            self._observer.schedule(_Handler(), real, recursive=True, event_filter=write_events())
        except OSError:
            return False
        with self._lock:
            self._roots[real] = path
            self._scheduled.add(real)
        return True

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
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
