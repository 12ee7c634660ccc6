"""Signed records waiting for the store, as atomic files under ``<state_dir>/spool/``.

Layout::

    spool/<run_id>/<step:012d>.json       a signed record, the exact bytes to upload
    spool/<run_id>/head.json              the signed head of the newest stored record (kept)
    spool/.conflicts/<run_id>/<step>.json a record the store refused (different bytes there)

Writing a record's spool file is the archiver's commit point: the record is signed once
and only those bytes are ever uploaded or chained. The head file is written before the
records it covers are removed, so between them they always hold the chain head. Files
are written with :func:`~warden.safeio.atomic_write_bytes`, so a crash leaves a whole
file or none; leftover temporary files are removed on load. Removal after upload needs
no fsync: a file that comes back after a crash is uploaded again, which the store
answers with "already stored". Removal is also off the upload path: a janitor thread
unlinks (deletes can be slow, e.g. on file systems mounted with ``discard``), and records
a head file already covers are dropped on load.

Thread-safe: the sidecar adds, the uploader reads and removes.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from warden.archive.record import STEP_DIGITS, step_from_key, valid_run_id
from warden.safeio import atomic_write_bytes

HEAD_NAME = "head.json"
CONFLICTS = ".conflicts"  # never a run id (those start with a letter or digit)
FENCED = ".fenced"  # records spooled before this process took the run's lease (warden/lease.py)


@dataclass(frozen=True)
class Spooled:
    """One spooled record: run, step and when it was spooled (Unix time)."""

    run_id: str
    step: int
    spooled_at: float


class Spool:
    """The spool directory and an in-memory index of it."""

    def __init__(self, root: str, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self._clock = clock
        self._lock = threading.Lock()
        self._index: dict[str, dict[int, float]] = {}
        self._order: dict[str, list[int]] = {}  # sorted steps per run, may still hold removed ones
        self._trash: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._janitor: threading.Thread | None = None
        os.makedirs(root, exist_ok=True)
        self._load()

    def _run_dir(self, run_id: str) -> str:
        return os.path.join(self.root, run_id)

    def _path(self, run_id: str, step: int) -> str:
        return os.path.join(self._run_dir(run_id), f"{step:0{STEP_DIGITS}d}.json")

    def _load(self) -> None:
        for run_id in sorted(os.listdir(self.root)):
            directory = self._run_dir(run_id)
            if not valid_run_id(run_id) or not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)  # a write a crash interrupted; its event is replayed
                    continue
                step = step_from_key(name)
                if step is not None:
                    self._index.setdefault(run_id, {})[step] = os.stat(path).st_mtime
        self._order = {run: sorted(steps) for run, steps in self._index.items()}

    # -- records --------------------------------------------------------------------------
    def add(self, run_id: str, step: int, body: bytes) -> None:
        """Writes the record atomically (the commit point) and indexes it."""
        os.makedirs(self._run_dir(run_id), exist_ok=True)
        atomic_write_bytes(self._path(run_id, step), body)
        with self._lock:
            steps = self._index.setdefault(run_id, {})
            order = self._order.setdefault(run_id, [])
            if step not in steps:
                if order and step < order[-1]:
                    bisect.insort(order, step)
                else:
                    order.append(step)
            steps[step] = self._clock()

    def read(self, run_id: str, step: int) -> bytes:
        with open(self._path(run_id, step), "rb") as fh:
            return fh.read()

    def remove(self, run_id: str, step: int) -> None:
        """Forgets a record that is now in the store; its file is unlinked by the janitor."""
        with self._lock:
            known = self._index.get(run_id, {}).pop(step, None) is not None
            if known and self._janitor is None:
                self._janitor = threading.Thread(target=self._sweep, name="spool-janitor", daemon=True)
                self._janitor.start()
        if known:
            self._trash.put(self._path(run_id, step))

    def drop_stored(self, run_id: str, last_stored: int) -> int:
        """Forgets the records of ``run_id`` up to ``last_stored`` (a head file says they are stored)."""
        stale = [step for step in self.steps(run_id) if step <= last_stored]
        for step in stale:
            self.remove(run_id, step)
        return len(stale)

    def _sweep(self) -> None:
        while True:
            path = self._trash.get()
            if path is None:
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        """Waits for the janitor to unlink what was removed."""
        with self._lock:
            janitor, self._janitor = self._janitor, None
        if janitor is not None:
            self._trash.put(None)
            janitor.join()

    def set_aside(self, run_id: str, step: int, into: str = CONFLICTS) -> str:
        """Moves a record the store refused to ``.conflicts/`` (or ``into``); returns its new path."""
        target_dir = os.path.join(self.root, into, run_id)
        os.makedirs(target_dir, exist_ok=True)
        target = os.path.join(target_dir, f"{step:0{STEP_DIGITS}d}.json")
        os.replace(self._path(run_id, step), target)
        with self._lock:
            self._index.get(run_id, {}).pop(step, None)
        return target

    def set_aside_all(self, into: str) -> int:
        """Moves every spooled record to ``into`` and removes the head files; returns how many records
        moved. What the spool held is then evidence only, never uploaded (see Archiver.resync)."""
        moved = 0
        for entry in self.pending():
            with contextlib.suppress(FileNotFoundError):
                self.set_aside(entry.run_id, entry.step, into)
                moved += 1
        for run_id in self.head_runs():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._head_path(run_id))
        return moved

    def steps(self, run_id: str) -> list[int]:
        """Spooled steps of ``run_id``, ascending."""
        with self._lock:
            return sorted(self._index.get(run_id, {}))

    def steps_after(self, run_id: str, after: int, limit: int) -> list[int]:
        """Up to ``limit`` spooled steps of ``run_id`` greater than ``after``, ascending; O(limit)."""
        with self._lock:
            steps, order = self._index.get(run_id, {}), self._order.get(run_id, [])
            if len(order) > 2 * len(steps) + 64:
                order[:] = sorted(steps)
            found: list[int] = []
            for step in itertools.islice(order, bisect.bisect_right(order, after), None):
                if step in steps:
                    found.append(step)
                    if len(found) >= limit:
                        break
            return found

    def runs(self) -> list[str]:
        """Runs with spooled records (oldest spooled record first), then runs with only a head."""
        with self._lock:
            oldest = {run: min(steps.values()) for run, steps in self._index.items() if steps}
        heads_only = [run for run in self.head_runs() if run not in oldest]
        return sorted(oldest, key=lambda run: (oldest[run], run)) + heads_only

    def pending(self) -> list[Spooled]:
        """Every spooled record, by run and step."""
        with self._lock:
            return [
                Spooled(run, step, at)
                for run, steps in sorted(self._index.items())
                for step, at in sorted(steps.items())
            ]

    def depth(self) -> int:
        with self._lock:
            return sum(len(steps) for steps in self._index.values())

    def oldest_age(self) -> float:
        """Seconds since the oldest record still spooled was spooled; 0 when empty."""
        with self._lock:
            times = [at for steps in self._index.values() for at in steps.values()]
        return max(0.0, self._clock() - min(times)) if times else 0.0

    # -- heads ----------------------------------------------------------------------------
    def _head_path(self, run_id: str) -> str:
        return os.path.join(self._run_dir(run_id), HEAD_NAME)

    def head_runs(self) -> list[str]:
        """Runs that have a head file."""
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [n for n in names if valid_run_id(n) and os.path.exists(self._head_path(n))]

    def set_head(self, run_id: str, body: bytes) -> None:
        """Replaces (atomically) the signed head of ``run_id``'s newest stored record."""
        os.makedirs(self._run_dir(run_id), exist_ok=True)
        atomic_write_bytes(self._head_path(run_id), body)

    def head(self, run_id: str) -> bytes | None:
        try:
            with open(self._head_path(run_id), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
