"""Checkpoint saves, synchronous or in a background thread, at most one in flight.

Contract of :class:`CheckpointSaver`:

- :meth:`~CheckpointSaver.save` first waits for the previous save (the wait is counted and
  exported apart from the stall). Synchronous (no arena): the state is serialised, hashed and
  written before it returns. Asynchronous: the state is copied into the host arena
  (:func:`trainer.staging.capture`; that copy is the stall) and a writer thread serialises it,
  hashes it in memory, writes, fsyncs and renames it into place
  (:func:`trainer.checkpoint.write_checkpoint`), retrying per ``retries`` from the same copy.
- ``on_saved(written, timing)`` runs once the checkpoint is durable and renamed (the trainer
  announces ``checkpoint.saved`` there, and applies retention); ``on_failed(step, error,
  attempts)`` runs after the last failed attempt. In asynchronous mode both run on the writer
  thread: the journal and the metrics are thread-safe, and the trainer's retention state is only
  touched there or after :meth:`~CheckpointSaver.wait`.
- :meth:`~CheckpointSaver.wait` returns once no save is in flight (the final checkpoint, SIGTERM
  and close wait); an unexpected error of the writer thread (anything but a CheckpointError,
  which goes to ``on_failed``) is re-raised there, in the training thread.
- The writer thread (and the hashing and writing threads it starts, which inherit it) runs at
  :data:`WRITER_NICENESS` above the training thread: the disk, not the CPU, bounds how soon a
  checkpoint is durable, while the signer hashing the previous checkpoint and the training
  thread feeding the GPU wait for every core the writer holds.
- A crash mid-write leaves only the ``.tmp-`` directory, which is never a complete checkpoint, so
  the previous checkpoint stays the newest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.checkpoint import CheckpointError, CheckpointSink, CheckpointWriter, WrittenCheckpoint
from trainer.staging import HostArena, capture

log = logging.getLogger("warden.trainer")

WRITER_NICENESS = 10
"""How much nicer (lower priority) than the training thread an asynchronous save's threads run."""

Fill = Callable[[CheckpointSink], None]
Write = Callable[[int, Callable[[CheckpointWriter], None]], WrittenCheckpoint]


@dataclass(frozen=True)
class SaveTiming:
    """Seconds spent on one save: waiting for the previous one, holding training, until durable."""

    mode: str  # "async" | "sync"
    waited_seconds: float
    stall_seconds: float
    write_seconds: float
    attempts: int

    def event_fields(self) -> dict[str, Any]:
        """Extra ``checkpoint.saved`` fields (no consumer acts on them; benchmarks read them)."""
        return {
            "save_mode": self.mode,
            "waited_seconds": round(self.waited_seconds, 4),
            "stall_seconds": round(self.stall_seconds, 4),
            "write_seconds": round(self.write_seconds, 4),
            "attempts": self.attempts,
        }


class CheckpointSaver:
    """Saves through ``write(step, fill)``; asynchronous when given an ``arena``."""

    def __init__(
        self,
        write: Write,
        *,
        arena: HostArena | None,
        device: torch.device,
        retries: int,
        metrics: Any,
        on_saved: Callable[[WrittenCheckpoint, SaveTiming], None],
        on_failed: Callable[[int, CheckpointError, int], None],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._write, self.arena, self.device, self.retries = write, arena, device, retries
        self.metrics, self.on_saved, self.on_failed = metrics, on_saved, on_failed
        self.clock, self.sleep = clock, sleep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._waited = 0.0

    @property
    def asynchronous(self) -> bool:
        return self.arena is not None

    def save(self, step: int, fill: Fill) -> None:
        """Saves the state ``fill`` writes as checkpoint ``step`` (see the module doc)."""
        self.settle()
        waited, self._waited = self._waited, 0.0
        started = self.clock()
        if self.arena is None:
            self._attempts(step, fill, SaveTiming("sync", waited, 0.0, 0.0, 0), started)
            return
        image = capture(fill, self.arena, self.device)
        stall = self.clock() - started
        self.metrics.checkpoint_stall.set(stall)
        self.metrics.checkpoint_in_flight.set(1)
        timing = SaveTiming("async", waited, stall, 0.0, 0)
        self._thread = threading.Thread(
            target=self._in_background, args=(step, image.replay, timing, started), name=f"ckpt-save-{step}"
        )
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        """Whether a save is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def settle(self) -> None:
        """Waits for the previous save before the next one (the trainer calls it before it plans the
        space for the save); a wait is counted, exported, and reported with the next save."""
        if not self.in_flight:
            self.wait()
            return
        waited = self.wait()
        self.metrics.checkpoint_waits.inc()
        self.metrics.checkpoint_wait_seconds.inc(waited)
        self._waited += waited

    def wait(self) -> float:
        """Blocks until no save is in flight; the seconds waited (0 when none was)."""
        thread, waited = self._thread, 0.0
        if thread is not None:
            if thread.is_alive():
                t0 = self.clock()
                thread.join()
                waited = self.clock() - t0
            thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return waited

    def _in_background(
        self, step: int, fill: Callable[[CheckpointWriter], None], timing: SaveTiming, t0: float
    ) -> None:
        lower_priority(WRITER_NICENESS)
        try:
            self._attempts(step, fill, timing, t0)
        except BaseException as exc:  # surfaces in the training thread at the next wait()
            self._error = exc
        finally:
            self.metrics.checkpoint_in_flight.set(0)

    def _attempts(self, step: int, fill: Callable[[CheckpointWriter], None], timing: SaveTiming, t0: float) -> None:
        for attempt in range(1, self.retries + 2):
            try:
                written = self._write(step, fill)
            except CheckpointError as exc:
                self.metrics.checkpoint_failures.inc()
                log.error("%s (attempt %d of %d)", exc, attempt, self.retries + 1)
                if attempt > self.retries:
                    self.on_failed(step, exc, attempt)
                    return
                self.sleep(min(5.0, 0.5 * 2 ** (attempt - 1)))
                continue
            elapsed = self.clock() - t0
            stall = elapsed if timing.mode == "sync" else timing.stall_seconds
            done = SaveTiming(timing.mode, timing.waited_seconds, stall, elapsed, attempt)
            self.metrics.checkpoint_write.set(elapsed)
            if timing.mode == "sync":
                self.metrics.checkpoint_stall.set(stall)
            self.on_saved(written, done)
            return


def lower_priority(by: int) -> None:
    """Makes the calling thread ``by`` nicer (at most 19; Linux keeps niceness per thread and new
    threads inherit it). Raising niceness needs no privilege; where threads cannot be told apart
    (not Linux) nothing changes, since the whole process would slow down."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id") or os.uname().sysname != "Linux":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError as exc:  # e.g. a seccomp profile refusing it: a slower signer, not a failure
        log.debug("could not lower the checkpoint writer's priority: %s", exc)
