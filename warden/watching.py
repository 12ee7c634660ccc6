"""Watching trees for writes (inotify through watchdog), one implementation for every sidecar.

Opens and no-write closes are the bulk of inotify traffic on a watched tree (a trainer
importing torch opens thousands of files; a sidecar hashing a tree opens all of them),
and a recursive watch that receives them overflows its queue and re-walks the tree in a
loop. Passing this filter to ``Observer.schedule`` keeps them out of the kernel mask.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def write_events() -> list[Any]:
    """watchdog event classes that mean "something was written, created, moved or deleted"."""
    from watchdog import events as ev

    return [
        ev.FileCreatedEvent,
        ev.FileModifiedEvent,
        ev.FileDeletedEvent,
        ev.FileMovedEvent,
        ev.FileClosedEvent,
        ev.DirCreatedEvent,
        ev.DirDeletedEvent,
        ev.DirMovedEvent,
    ]


# Opens and no-write closes that still reach a handler (the filter above is advisory on some
# watchdog versions and backends).
IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


@dataclass(frozen=True)
class Change:
    """One write under a watched root: the root, watchdog's event type, the paths, a directory?"""

    root: str
    kind: str
    paths: tuple[str, ...]
    is_directory: bool


class TreeWatcher:
    """Recursive inotify watches (watchdog) of some roots, writes only, reporting each :class:`Change`
    to ``on_change`` from watchdog's thread.

    ``active`` is False when watchdog is missing or its observer cannot start; :meth:`watch`
    returns False for a root it cannot watch (missing, inotify limit). Either way the caller
    falls back to polling, which it needs anyway: inotify does not see writes made by other
    NFS clients.
    """

    def __init__(self, on_change: Callable[[Change], None], enabled: bool = True) -> None:
        self._on_change = on_change
        self._watched: set[str] = set()
        self._observer: Any = self._start() if enabled else None

    @staticmethod
    def _start() -> Any:
        try:
            from watchdog.observers import Observer
        except ImportError:
            return None
        observer = Observer()
        observer.daemon = True
        try:
            observer.start()
        except (OSError, RuntimeError):
            return None
        return observer

    @property
    def active(self) -> bool:
        return self._observer is not None

    def watching(self, root: str) -> bool:
        return root in self._watched

    def watch(self, root: str) -> bool:
        """Starts watching ``root`` recursively (once); False when it cannot."""
        if root in self._watched:
            return True
        if self._observer is None or not os.path.isdir(root):
            return False
        try:
            self._observer.schedule(self._handler(root), root, recursive=True, event_filter=write_events())
        except (OSError, RuntimeError):
            return False
        self._watched.add(root)
        return True

    def _handler(self, root: str) -> Any:
        from watchdog.events import FileSystemEventHandler

        report = self._on_change

        class _Handler(FileSystemEventHandler):  # type: ignore[misc]
            def on_any_event(self, event: Any) -> None:
                if event.event_type in IGNORED_EVENTS:
                    return
                paths = tuple(p for p in (str(event.src_path), str(getattr(event, "dest_path", "") or "")) if p)
                report(Change(root, str(event.event_type), paths, bool(event.is_directory)))

        return _Handler()

    def close(self) -> None:
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=2)
            except RuntimeError:
                pass
            self._observer = None
