"""The event journal (docs/design.md section 2): the ground floor the trainer and every sidecar share.

Standard library and ``warden.safeio``/``warden.logs`` only.

The trainer (rank 0) appends one JSON object per line to ``<run_dir>/events.jsonl``
with :class:`EventWriter`; sidecars follow it with :class:`JournalReader` and keep a
:class:`Cursor` (byte offset + last seq) in a file written atomically.

Contracts:
- one ``os.write`` per line on an ``O_APPEND`` descriptor, so concurrent appenders never
  interleave bytes inside a line; ``fsync`` after the types in :data:`FSYNC_TYPES`;
- ``seq`` starts at 1 and rises by one per line; a reopened writer continues after the
  last complete line and seals a torn tail with a newline first, so it never merges with
  a new line (and is read as one corrupt line);
- readers wait for a line without newline, count and skip a corrupt complete line,
  refuse a line over ``max_line_bytes`` without holding it in memory, ignore unknown
  types and unknown fields, and report gaps in ``seq``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from warden.logs import utc_timestamp
from warden.safeio import atomic_write_bytes

SCHEMA_VERSION = 1
JOURNAL_NAME = "events.jsonl"
MAX_LINE_BYTES = 1024 * 1024

RUN_STARTED = "run.started"
RUN_RESUMED = "run.resumed"
STEP_COMPLETED = "step.completed"
REWARD_SNAPSHOT = "reward.snapshot"
CHECKPOINT_SAVED = "checkpoint.saved"
CHECKPOINT_REJECTED = "checkpoint.rejected"
CHECKPOINT_PRUNED = "checkpoint.pruned"
CHECKPOINT_SKIPPED = "checkpoint.skipped"
MODEL_LOADING = "model.loading"
OOM = "oom"
RUN_FINISHED = "run.finished"
VALIDATION_COMPLETED = "validation.completed"
UPDATE_SKIPPED = "update.skipped"

EVENT_TYPES: frozenset[str] = frozenset(
    {
        RUN_STARTED,
        RUN_RESUMED,
        STEP_COMPLETED,
        REWARD_SNAPSHOT,
        CHECKPOINT_SAVED,
        CHECKPOINT_REJECTED,
        CHECKPOINT_PRUNED,
        CHECKPOINT_SKIPPED,
        MODEL_LOADING,
        OOM,
        RUN_FINISHED,
        VALIDATION_COMPLETED,
        UPDATE_SKIPPED,
    }
)
# Types whose loss after a crash would lose a side effect (a signature, an archive record).
FSYNC_TYPES: frozenset[str] = frozenset(
    {
        RUN_STARTED,
        RUN_RESUMED,
        RUN_FINISHED,
        CHECKPOINT_SAVED,
        CHECKPOINT_REJECTED,
        CHECKPOINT_PRUNED,
        CHECKPOINT_SKIPPED,
        REWARD_SNAPSHOT,
    }
)


class JournalError(Exception):
    """Base class of every error raised by this module."""


class EventTooLarge(JournalError):
    """An event serialises to more than the line size limit."""


class JournalWriteError(JournalError):
    """The journal could not be appended to (disk full, short write)."""


class JournalTruncated(JournalError):
    """The journal is shorter than a reader's cursor: it was replaced or truncated."""


@dataclass(frozen=True)
class Event:
    """One journal line. ``step`` is None for events not tied to a step."""

    seq: int
    run_id: str
    type: str
    time: str
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "seq": self.seq,
            "run_id": self.run_id,
            "type": self.type,
            "time": self.time,
            "step": self.step,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, obj: Any) -> Event:
        """Builds an event from a decoded line; unknown fields are ignored.

        Raises ValueError when a required field is missing or has the wrong type.
        """
        if not isinstance(obj, dict):
            raise ValueError("line is not a JSON object")
        seq, run_id, etype, etime = obj.get("seq"), obj.get("run_id"), obj.get("type"), obj.get("time")
        step, data, v = obj.get("step"), obj.get("data", {}), obj.get("v")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError("field 'v' must be a positive integer")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise ValueError("field 'seq' must be a positive integer")
        for name, value in (("run_id", run_id), ("type", etype), ("time", etime)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"field {name!r} must be a non-empty string")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError("field 'step' must be an integer or null")
        if not isinstance(data, dict):
            raise ValueError("field 'data' must be an object")
        return cls(seq=seq, run_id=str(run_id), type=str(etype), time=str(etime), step=step, data=data, v=v)


def encode_line(event: Event) -> bytes:
    """The exact bytes of one journal line, newline included."""
    text = json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8") + b"\n"


def _last_complete_line(fd: int, size: int) -> tuple[int, bytes | None]:
    """Returns (offset just past the last newline, the last non-empty complete line).

    Reads backwards in blocks, so reopening a large journal stays cheap. The line is None
    when there is none, or when it is longer than the line limit.
    """
    block = 64 * 1024
    pos, buf = size, b""
    end: int | None = None
    while pos > 0:
        start = max(0, pos - block)
        buf = os.pread(fd, pos - start, start) + buf
        pos = start
        if end is None:
            idx = buf.rfind(b"\n")
            if idx < 0:
                continue
            end, buf = pos + idx + 1, buf[: idx + 1]
        body = buf.rstrip(b"\n")
        newline = body.rfind(b"\n")
        if newline >= 0:
            return end, body[newline + 1 :]
        if len(body) > MAX_LINE_BYTES:
            return end, None
    if end is None:
        return 0, None
    return end, buf.rstrip(b"\n") or None


class EventWriter:
    """Appends events to one journal. Thread-safe; one instance per process.

    ``fsync_types`` defaults to :data:`FSYNC_TYPES`; ``enabled=False`` makes every call
    a no-op (ranks other than 0).
    """

    def __init__(
        self,
        path: str,
        run_id: str,
        *,
        fsync_types: frozenset[str] = FSYNC_TYPES,
        clock: Callable[[], float] = time.time,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.path = path
        self.run_id = run_id
        self._fsync_types = fsync_types
        self._clock = clock
        self._max = max_line_bytes
        self._lock = threading.Lock()
        self.torn_bytes_sealed = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._seq = self._recover()

    def _recover(self) -> int:
        """Seals a torn tail and returns the seq of the last complete line (0 if none).

        A line without newline (a crash mid-write, or another writer's write seen half
        done) is terminated with a newline, never cut: cutting could race with another
        appender and delete its lines. Readers count a sealed torn line as corrupt once;
        an extra empty line is skipped silently.
        """
        rfd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(rfd).st_size
            end, last = _last_complete_line(rfd, size)
        finally:
            os.close(rfd)
        if end < size:
            os.write(self._fd, b"\n")
            os.fsync(self._fd)
            self.torn_bytes_sealed = size - end
        if last is None:
            return 0
        try:
            return Event.from_dict(json.loads(last)).seq
        except ValueError:
            raise JournalError(
                f"{self.path}: the last complete line is not a valid event; "
                "move the journal aside or repair its last line before resuming"
            ) from None

    @property
    def last_seq(self) -> int:
        return self._seq

    def emit(self, etype: str, data: dict[str, Any] | None = None, step: int | None = None) -> Event:
        """Appends one event and returns it. Raises EventTooLarge, JournalWriteError."""
        with self._lock:
            event = Event(
                seq=self._seq + 1,
                run_id=self.run_id,
                type=etype,
                time=utc_timestamp(self._clock()),
                step=step,
                data=data or {},
            )
            line = encode_line(event)
            if len(line) > self._max:
                raise EventTooLarge(f"{etype} event at step {step} is {len(line)} bytes; the limit is {self._max}")
            try:
                written = os.write(self._fd, line)
            except OSError as exc:
                raise JournalWriteError(f"{self.path}: cannot append {etype}: {exc.strerror}") from exc
            if written != len(line):
                raise JournalWriteError(f"{self.path}: short write ({written} of {len(line)} bytes) for {etype}")
            if etype in self._fsync_types:
                os.fsync(self._fd)
            self._seq = event.seq
            return event

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Cursor:
    """Position of a reader: ``offset`` is the byte after the last consumed line."""

    offset: int = 0
    seq: int = 0


class CursorStore:
    """Loads and saves a :class:`Cursor` as JSON, atomically."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> Cursor:
        try:
            with open(self.path, encoding="utf-8") as fh:
                obj = json.load(fh)
        except FileNotFoundError:
            return Cursor()
        except (OSError, ValueError) as exc:
            raise JournalError(f"{self.path}: unreadable cursor ({exc}); delete it to start over") from exc
        try:
            return Cursor(offset=int(obj["offset"]), seq=int(obj["seq"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(f"{self.path}: cursor lacks 'offset'/'seq'; delete it to start over") from exc

    def save(self, cursor: Cursor) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        payload = json.dumps({"offset": cursor.offset, "seq": cursor.seq}).encode()
        atomic_write_bytes(self.path, payload)


@dataclass
class ReaderStats:
    """Counters a reader keeps; sidecars export them as metrics."""

    lines: int = 0
    corrupt: int = 0
    oversized: int = 0
    unknown_type: int = 0
    gaps: int = 0
    missing_seqs: int = 0
    last_problem: str = ""


class JournalProblem(str):
    """A problem found while reading the journal: the message, with a bounded ``kind`` for
    metric labels (journal_corrupt_line, journal_oversized_line, journal_gap), so that no
    reader parses the wording."""

    kind: str

    def __new__(cls, kind: str, message: str) -> JournalProblem:
        problem = super().__new__(cls, message)
        problem.kind = kind
        return problem


class JournalReader:
    """Reads complete events after a cursor.

    ``read_available()`` yields ``(event, cursor_after_event)`` for every complete line
    that is available now; the caller persists the cursor after its side effect.
    ``on_problem`` is called with a message for each corrupt, oversized or gap finding.
    """

    def __init__(
        self,
        path: str,
        cursor: Cursor = Cursor(),
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        chunk_bytes: int = 256 * 1024,
        known_types: frozenset[str] = EVENT_TYPES,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.cursor = cursor
        self.stats = ReaderStats()
        self._max = max_line_bytes
        self._chunk = chunk_bytes
        self._known = known_types
        self._on_problem = on_problem
        # Offset up to which an oversized line has been skipped without finding its end.
        self._skip_until: int | None = None

    def _problem(self, kind: str, message: str) -> None:
        problem = JournalProblem(kind, message)
        self.stats.last_problem = problem
        if self._on_problem is not None:
            self._on_problem(problem)

    def read_available(self) -> Iterator[tuple[Event, Cursor]]:
        """Yields events after the cursor. Raises JournalTruncated, OSError."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (closed by the with below)
        except FileNotFoundError:
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self.cursor.offset:
                raise JournalTruncated(
                    f"{self.path} is {size} bytes but the cursor is at {self.cursor.offset}: "
                    "the journal was truncated or replaced; remove the cursor file to re-read it"
                )
            yield from self._scan(fh)

    def _scan(self, fh: Any) -> Iterator[tuple[Event, Cursor]]:
        offset = self.cursor.offset
        fh.seek(self._skip_until if self._skip_until is not None else offset)
        buf = b""
        while True:
            chunk = fh.read(self._chunk)
            if not chunk:
                return
            if self._skip_until is not None:
                idx = chunk.find(b"\n")
                if idx < 0:
                    self._skip_until += len(chunk)
                    continue
                end = self._skip_until + idx + 1
                self._finish_oversized(offset, end)
                offset = end
                self._skip_until = None
                chunk = chunk[idx + 1 :]
            buf += chunk
            start = 0
            while True:
                idx = buf.find(b"\n", start)
                if idx < 0:
                    break
                line = buf[start:idx]
                offset += idx + 1 - start
                start = idx + 1
                event = self._parse(line, offset)
                if event is not None:
                    yield event, self.cursor
            buf = buf[start:]
            if len(buf) > self._max:
                # Too long and still no newline: stop buffering, remember where to go on.
                self._skip_until = offset + len(buf)
                buf = b""

    def _finish_oversized(self, line_start: int, line_end: int) -> None:
        self.stats.oversized += 1
        self.cursor = Cursor(offset=line_end, seq=self.cursor.seq)
        self._problem(
            "journal_oversized_line",
            f"{self.path}: line at byte {line_start} is {line_end - line_start} bytes, over the "
            f"{self._max}-byte limit; skipped",
        )

    def _parse(self, line: bytes, end_offset: int) -> Event | None:
        """Decodes one line and advances the cursor; None for lines that are skipped."""
        line_start = end_offset - len(line) - 1
        if not line.strip():
            self.cursor = Cursor(offset=end_offset, seq=self.cursor.seq)
            return None  # an empty line (a sealed torn tail next to a concurrent write)
        self.stats.lines += 1
        if len(line) > self._max:
            self._finish_oversized(line_start, end_offset)
            return None
        try:
            event = Event.from_dict(json.loads(line))
        except ValueError as exc:
            self.stats.corrupt += 1
            self.cursor = Cursor(offset=end_offset, seq=self.cursor.seq)
            self._problem("journal_corrupt_line", f"{self.path}: corrupt line at byte {line_start} skipped ({exc})")
            return None
        expected = self.cursor.seq + 1
        if event.seq != expected:
            self.stats.gaps += 1
            if event.seq > expected:
                self.stats.missing_seqs += event.seq - expected
            self._problem(
                "journal_gap", f"{self.path}: seq gap at byte {line_start}: expected {expected}, found {event.seq}"
            )
        self.cursor = Cursor(offset=end_offset, seq=event.seq)
        if event.type not in self._known:
            self.stats.unknown_type += 1
            return None
        return event


def read_last_seq(path: str) -> int:
    """The seq of the journal's last complete line, 0 for an empty or missing journal."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        _, last = _last_complete_line(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if last is None:
        return 0
    try:
        return Event.from_dict(json.loads(last)).seq
    except ValueError:
        return 0


WAKE_EVENTS = frozenset({"modified", "created", "moved", "deleted", "closed"})


class JournalFollower:
    """Waits for the journal to change: watchdog (inotify) when it works, else polling.

    inotify does not see writes by other NFS clients, so waits always time out after
    ``poll_seconds`` even when watchdog is active.
    """

    def __init__(self, path: str, poll_seconds: float = 1.0, use_watchdog: bool = True) -> None:
        self.path = path
        self.poll_seconds = poll_seconds
        self._changed = threading.Event()
        self._observer: Any = None
        if use_watchdog:
            self._observer = self._start_watchdog()

    @property
    def using_watchdog(self) -> bool:
        return self._observer is not None

    def _start_watchdog(self) -> Any:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return None
        changed = self._changed
        target = os.path.abspath(self.path)

        class _Handler(FileSystemEventHandler):  # type: ignore[misc]
            def on_any_event(self, event: Any) -> None:
                # Opens and no-write closes come from readers (ourselves included): waking on
                # them would turn every read into another wake-up, a busy loop.
                if event.event_type not in WAKE_EVENTS:
                    return
                if os.path.abspath(str(event.src_path)) == target or getattr(event, "dest_path", "") == target:
                    changed.set()

        directory = os.path.dirname(target)
        if not os.path.isdir(directory):
            return None
        try:
            observer = Observer()
            from watchdog import events as wev

            writes = [
                wev.FileModifiedEvent,
                wev.FileCreatedEvent,
                wev.FileMovedEvent,
                wev.FileDeletedEvent,
                wev.FileClosedEvent,
            ]  # opens by readers would only wake us for nothing
            observer.schedule(_Handler(), directory, recursive=False, event_filter=writes)
            observer.daemon = True
            observer.start()
        except OSError:
            return None
        return observer

    def wait(self, stop: threading.Event | None = None) -> None:
        """Returns when the journal may have changed, after the poll period, or on stop."""
        deadline = time.monotonic() + self.poll_seconds
        while not self._changed.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                break
            self._changed.wait(min(remaining, 0.1))
        self._changed.clear()

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
