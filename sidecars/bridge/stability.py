"""How long something written in place has been quiet, judged two ways.

verl writes its rollout dumps and checkpoints in place, without a rename that would mark
them complete, so the bridge waits until nothing changed for ``stable_seconds``. Quiet
time is the longer of: how long the same fingerprint has been seen by this process (works
for a service, immune to clock skew), and how old the newest mtime/ctime is (works for one
``--once`` pass; ctime also catches files copied with their old mtimes).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


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
