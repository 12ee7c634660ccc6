"""Reading the two journals: the I/O edge of the comparison.

A run is named by its directory (``<dir>/events.jsonl``) or by the journal file itself. Only a
regular file is read (a FIFO would block, a device is no journal); lines are parsed by
:class:`trainer.events.JournalReader`, which skips corrupt and oversized lines and counts them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from sidecars.shadow.align import RunSeries
from sidecars.shadow.errors import ShadowConfigError
from trainer.events import JOURNAL_NAME, JournalReader


def journal_path(run: str) -> str:
    """The journal of ``run`` (a run directory or a journal). Raises ShadowConfigError."""
    path = os.path.join(run, JOURNAL_NAME) if os.path.isdir(run) else run
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ShadowConfigError(f"{path}: no journal there; name a run directory or its {JOURNAL_NAME}") from None
    if not stat.S_ISREG(mode):
        raise ShadowConfigError(f"{path}: not a regular file, so not a journal")
    return path


@dataclass
class FollowedJournal:
    """A journal read incrementally into a :class:`RunSeries` (the sidecar calls :meth:`poll`)."""

    path: str
    series: RunSeries = field(default_factory=RunSeries)
    problems: int = 0
    _reader: JournalReader | None = None

    def poll(self) -> int:
        """Folds in every complete event written since the last poll; returns how many were read."""
        if self._reader is None:
            self._reader = JournalReader(self.path, on_problem=self._problem)
        count = 0
        for event, _ in self._reader.read_available():
            self.series.add(event)
            count += 1
        return count

    def _problem(self, message: str) -> None:
        self.problems += 1


def read_run(run: str) -> FollowedJournal:
    """The whole journal of ``run`` as it is now."""
    journal = FollowedJournal(journal_path(run))
    journal.poll()
    return journal
