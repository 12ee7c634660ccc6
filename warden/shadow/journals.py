"""Reading the two journals: the I/O edge of the comparison.

A run is named by its directory (``<dir>/events.jsonl``) or by the journal file itself. Only a
regular file is read (a FIFO would block, a device is no journal); lines are parsed by
:class:`warden.journal.JournalReader`, which skips corrupt and oversized lines and counts them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from warden.journal import JOURNAL_NAME, JournalReader
from warden.shadow.align import RunSeries
from warden.shadow.errors import ShadowConfigError, ShadowInputError


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


def journal_location(run: str) -> str:
    """Where the journal of ``run`` is or will be: ``run`` itself when it names a ``.jsonl`` file
    or an existing file, else ``<run>/events.jsonl`` (a run the sidecar may see before it starts)."""
    return run if run.endswith(".jsonl") or os.path.isfile(run) else os.path.join(run, JOURNAL_NAME)


@dataclass
class FollowedJournal:
    """A journal read incrementally into a :class:`RunSeries` (the sidecar calls :meth:`poll`)."""

    path: str
    series: RunSeries = field(default_factory=RunSeries)
    problems: int = 0
    _reader: JournalReader | None = None

    def poll(self) -> int:
        """Folds in every complete event written since the last poll; returns how many were read.

        A journal not written yet reads as empty; anything but a regular file raises ShadowInputError.
        """
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            return 0
        if not stat.S_ISREG(mode):
            raise ShadowInputError(f"{self.path}: not a regular file, so not a journal")
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
