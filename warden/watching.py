"""What the sidecars ask inotify for: writes only.

Opens and no-write closes are the bulk of inotify traffic on a watched tree (a trainer
importing torch opens thousands of files; a sidecar hashing a tree opens all of them),
and a recursive watch that receives them overflows its queue and re-walks the tree in a
loop. Passing this filter to ``Observer.schedule`` keeps them out of the kernel mask.
"""

from __future__ import annotations

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
