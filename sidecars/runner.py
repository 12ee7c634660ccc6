"""Runs one sidecar: journal tailing, cursor, periodic checks, metrics, signals."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from types import FrameType

from sidecars.runtime import Outcome, RetryLater, Sidecar, SidecarMetrics, error_kind
from warden.errors import WardenError
from warden.httpserve import MetricsServer
from warden.journal import (
    Cursor,
    CursorStore,
    Event,
    JournalError,
    JournalFollower,
    JournalProblem,
    JournalReader,
    read_last_seq,
)
from warden.logs import log_fields

MAX_BACKOFF_SECONDS = 30.0
UNTRUSTED_JOURNAL = "journal_untrusted"


def journal_exposure(path: str, file_mode: int, dir_mode: int) -> str | None:
    """Why others could write the journal at ``path`` (pure, on ``st_mode`` values), or None.

    The journal is the trainer's voice: a ``checkpoint.saved`` or ``reward.snapshot`` in it is
    what the signer and the archiver sign (docs/threat-model.md). If group or others can write
    the file, or anyone can replace it in a world-writable directory without the sticky bit,
    whoever can write the storage could announce their own bytes; sidecars then refuse to act.
    """
    if file_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(file_mode):o}); run: chmod go-w {path}"
    if dir_mode & stat.S_IWOTH and not dir_mode & stat.S_ISVTX:
        where = os.path.dirname(path) or "."
        return f"{where} is world-writable, so anyone can replace the journal; run: chmod o-w {where}"
    return None


def journal_trusted(path: str | None) -> bool:
    """Whether the journal at ``path`` can be read as the run's own (used where a sidecar reads the
    journal itself: the catch-up after taking a run lease, warden/lease.py). False while
    :func:`journal_exposure` finds it writable by others, while its directory is writable by group or
    others without the sticky bit (anyone there can rename their own file into place), while the
    journal is not owned by the directory's owner, and on any error but its absence (a missing
    journal is trusted: there is nothing to act on)."""
    if not path:
        return True
    try:
        info = os.stat(path)
        directory = os.stat(os.path.dirname(os.path.abspath(path)))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if journal_exposure(path, info.st_mode, directory.st_mode) is not None:
        return False
    if directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not directory.st_mode & stat.S_ISVTX:
        return False
    return info.st_uid == directory.st_uid


class Runner:
    """Drives ``sidecar``; :meth:`run_once` for one pass, :meth:`run_forever` as a service.

    ``poll_seconds`` bounds how long a journal change can go unnoticed (NFS writes from
    other hosts are invisible to inotify). The cursor lives in ``<state_dir>/cursor.json``.
    """

    def __init__(self, sidecar: Sidecar, poll_seconds: float = 1.0, use_watchdog: bool = True) -> None:
        self.sidecar = sidecar
        self.ctx = sidecar.ctx
        self.poll_seconds = poll_seconds
        self.metrics = SidecarMetrics(self.ctx.registry, self.ctx.name)
        self.cursor_store = CursorStore(os.path.join(self.ctx.state_dir, "cursor.json"))
        self._use_watchdog = use_watchdog
        self._reader: JournalReader | None = None
        self._worst = Outcome.OK
        self._backoff = 0.0
        self._retry_at = 0.0
        self._heartbeat = time.monotonic()
        self._next_check = 0.0
        self._lag_thread: threading.Thread | None = None
        self._exposure: str | None = None

    # -- journal ---------------------------------------------------------------------
    def _journal_reader(self) -> JournalReader | None:
        path = self.ctx.journal_path
        if not self.sidecar.handles or path is None:
            return None
        if self._reader is None:
            cursor = self.cursor_store.load()
            self._reader = JournalReader(path, cursor, on_problem=self._journal_problem)
        return self._reader

    def _journal_problem(self, message: str) -> None:
        kind = message.kind if isinstance(message, JournalProblem) else "journal_corrupt_line"
        self.metrics.error(kind)
        self.ctx.log.warning(message, extra=log_fields(sidecar=self.ctx.name, kind=kind))

    def _journal_exposed(self) -> bool:
        """True while others could write the journal (:func:`journal_exposure`): a violation,
        counted and logged once each time the problem appears or changes."""
        path = self.ctx.journal_path
        try:
            file_mode = os.stat(path).st_mode if path else 0
            dir_mode = os.stat(os.path.dirname(os.path.abspath(path))).st_mode if path else 0
        except OSError:
            return False  # no journal yet: the reader reports what is missing
        problem = journal_exposure(path or "", file_mode, dir_mode)
        if problem != self._exposure:
            self._exposure = problem
            if problem is not None:
                self.metrics.error(UNTRUSTED_JOURNAL)
                self.metrics.violations.labels(self.ctx.name).inc()
                fields = log_fields(sidecar=self.ctx.name, kind=UNTRUSTED_JOURNAL)
                self.ctx.log.error(f"refusing to act on the journal: {problem}", extra=fields)
        if problem is not None:
            self._worst = max(self._worst, Outcome.VIOLATION)
        return problem is not None

    def drain(self) -> None:
        """Handles every complete event now in the journal, saving the cursor after each.

        Nothing is handled while others could write the journal (:func:`journal_exposure`).
        """
        reader = self._journal_reader()
        if reader is None or time.monotonic() < self._retry_at or self._journal_exposed():
            return
        saved = reader.cursor
        try:
            for event, cursor in reader.read_available():
                if self.ctx.stop.is_set():
                    break
                if event.type in self.sidecar.handles:
                    if not self._handle(event, saved):
                        return
                    self.cursor_store.save(cursor)
                    saved = cursor
                self._heartbeat = time.monotonic()
        except (JournalError, OSError) as exc:
            self._record_failure(exc, "journal", None)
            self._worst = max(self._worst, Outcome.INCOMPLETE)
        if reader.cursor != saved and not self.ctx.stop.is_set():
            self.cursor_store.save(reader.cursor)
        self._update_lag()

    def _handle(self, event: Event, before: Cursor) -> bool:
        """Runs the handler; False means stop draining and retry this event later."""
        try:
            outcome = self.sidecar.handle(event)
        except RetryLater as exc:
            self._record_failure(exc, "handler", event)
            self._schedule_retry(before)
            self._worst = max(self._worst, Outcome.INCOMPLETE)
            return False
        except WardenError as exc:
            self._record_failure(exc, "handler", event)
            outcome = Outcome(exc.exit_code) if exc.exit_code != Outcome.USAGE else Outcome.INCOMPLETE
        except Exception as exc:  # a bug in a handler must not kill the sidecar
            self.ctx.log.exception(
                "handler crashed", extra=log_fields(sidecar=self.ctx.name, seq=event.seq, type=event.type)
            )
            self.metrics.error("internal")
            outcome = Outcome.INCOMPLETE
            del exc
        self._backoff = 0.0
        self._finish(outcome)
        self.metrics.processed.labels(self.ctx.name).inc()
        return True

    def _schedule_retry(self, before: Cursor) -> None:
        """Rewinds the reader to ``before`` and waits with exponential back-off."""
        self._backoff = min(MAX_BACKOFF_SECONDS, max(self.poll_seconds, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        self._reader = None
        self.cursor_store.save(before)

    def _finish(self, outcome: Outcome) -> None:
        self._worst = max(self._worst, outcome)
        if outcome is Outcome.VIOLATION:
            self.metrics.violations.labels(self.ctx.name).inc()
        if outcome is not Outcome.INCOMPLETE:
            self.metrics.last_success.labels(self.ctx.name).set(self.ctx.clock())

    def _record_failure(self, exc: BaseException, where: str, event: Event | None) -> None:
        kind = error_kind(exc)
        self.metrics.error(kind)
        fields: dict[str, object] = {"sidecar": self.ctx.name, "where": where, "kind": kind}
        if event is not None:
            fields.update(seq=event.seq, type=event.type, step=event.step)
        self.ctx.log.error(str(exc), extra=log_fields(**fields))

    def _update_lag(self) -> None:
        path, reader = self.ctx.journal_path, self._reader
        if path is None or reader is None:
            return
        self.metrics.lag.labels(self.ctx.name).set(max(0, read_last_seq(path) - reader.cursor.seq))

    def _lag_loop(self) -> None:
        # Runs beside the main loop so a handler stuck on I/O still shows a growing lag.
        while not self.ctx.stop.wait(self.poll_seconds):
            try:
                self._update_lag()
            except OSError:
                self.metrics.error("journal_unreadable")

    # -- checks ----------------------------------------------------------------------
    def check_if_due(self, force: bool = False) -> None:
        interval = self.sidecar.check_interval_seconds
        if interval is None or (not force and time.monotonic() < self._next_check):
            return
        self._next_check = time.monotonic() + interval
        try:
            outcome = self.sidecar.check()
        except WardenError as exc:
            self._record_failure(exc, "check", None)
            outcome = Outcome.VIOLATION if exc.exit_code == 1 else Outcome.INCOMPLETE
        except Exception:
            self.ctx.log.exception("check crashed", extra=log_fields(sidecar=self.ctx.name))
            self.metrics.error("internal")
            outcome = Outcome.INCOMPLETE
        self._finish(outcome)
        self._heartbeat = time.monotonic()

    # -- entry points ----------------------------------------------------------------
    def run_once(self) -> Outcome:
        """Handles the backlog and runs one round of checks; returns the worst outcome."""
        self.drain()
        self.check_if_due(force=True)
        self.sidecar.close()
        return self._worst

    def health(self) -> tuple[bool, str]:
        idle = time.monotonic() - self._heartbeat
        limit = max(300.0, 10 * self.poll_seconds, 3 * (self.sidecar.check_interval_seconds or 0))
        if idle > limit:
            return False, f"main loop silent for {idle:.0f}s (limit {limit:.0f}s)"
        return True, f"ok ({self.ctx.name}, loop {idle:.1f}s ago)"

    def run_forever(self, server: MetricsServer | None = None) -> int:
        """Serves until SIGTERM/SIGINT or ``ctx.stop``; returns the exit code (0)."""
        self._install_signal_handlers()
        follower = None
        if self.sidecar.handles and self.ctx.journal_path:
            follower = JournalFollower(self.ctx.journal_path, self.poll_seconds, self._use_watchdog)
            self._lag_thread = threading.Thread(target=self._lag_loop, name="lag", daemon=True)
            self._lag_thread.start()
        self.ctx.log.info("sidecar started", extra=log_fields(sidecar=self.ctx.name, port=server and server.port))
        try:
            while not self.ctx.stop.is_set():
                self._heartbeat = time.monotonic()
                self.drain()
                self.check_if_due()
                self._sleep(follower)
        finally:
            if follower is not None:
                follower.close()
            self.sidecar.close()
            self.metrics.up.labels(self.ctx.name).set(0)
            self.ctx.log.info("sidecar stopped", extra=log_fields(sidecar=self.ctx.name))
        return 0

    def _sleep(self, follower: JournalFollower | None) -> None:
        # Never sleep past the next periodic check: detection latency depends on it.
        limit = min(self.poll_seconds, self.sidecar.check_interval_seconds or self.poll_seconds)
        if follower is not None:
            follower.poll_seconds = limit
            follower.wait(self.ctx.stop)
        else:
            self.ctx.stop.wait(limit)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def _stop(signum: int, frame: FrameType | None) -> None:
            self.ctx.log.info("stop requested", extra=log_fields(sidecar=self.ctx.name, signal=signum))
            self.ctx.stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
