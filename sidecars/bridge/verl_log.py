"""Tailing verl's ``file`` logger: complete lines after an offset, and restarts detected.

verl's ``FileLogger`` (``trainer.logger=[...,file]``) writes one JSON object per step to
``$VERL_FILE_LOGGER_PATH`` (default ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``)::

    {"step": 12, "data": {"actor/pg_loss": -0.01, "critic/score/mean": 0.43, ...}}

It opens the file with ``"wb"``: a restarted verl *truncates* it and starts again from the
resumed step. The bridge therefore keeps its own offset (:class:`LogPosition`) and, before
reading on, checks that the file is still the one it was reading: same inode, not shorter
than the offset, and the last line it consumed still has the same bytes at the same place
(that catches a file truncated and regrown past the offset between two polls).

A line without its newline yet is waited for; a line that is not a JSON object with an
integer ``step`` and an object ``data`` is skipped and reported; NaN (orjson writes it
as ``null``; Python's json as ``NaN``) becomes ``None``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from sidecars.bridge.state import LogPosition
from warden.journal import MAX_LINE_BYTES
from warden.safeio import open_regular_fd

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class LogLine:
    """One complete line: its bytes ``[start, end)`` (newline included), its hash, its parse.

    ``problem`` is set (and ``step``/``metrics`` are None) for a line that was skipped.
    """

    start: int
    end: int
    sha256: str
    step: int | None
    metrics: dict[str, Any] | None
    problem: str | None = None


def _no_constants(name: str) -> None:
    return None  # NaN, Infinity, -Infinity -> null


def parse_log_line(raw: bytes) -> tuple[int, dict[str, Any]] | str:
    """``(step, metrics)`` of one file-logger line, or why it cannot be used."""
    try:
        obj = json.loads(raw, parse_constant=_no_constants)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(obj, dict):
        return "not a JSON object"
    step, data = obj.get("step"), obj.get("data")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return "no non-negative integer 'step'"
    if not isinstance(data, dict):
        return "no object 'data'"
    return step, data


def line_digest(raw: bytes) -> str:
    """Hex SHA-256 of a line without its newline."""
    return hashlib.sha256(raw).hexdigest()


def file_id(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def restart_reason(fd: int, st: os.stat_result, pos: LogPosition) -> str | None:
    """Why the file at ``fd`` is no longer the one ``pos`` points into, or None."""
    if pos.file_id is not None and file_id(st) != pos.file_id:
        return "the file was replaced (new inode)"
    if st.st_size < pos.offset:
        return f"the file shrank to {st.st_size} bytes, below the offset {pos.offset}"
    if pos.offset and pos.line_start is not None and pos.line_sha256:
        length = pos.offset - pos.line_start
        raw = os.pread(fd, length, pos.line_start)
        if len(raw) != length or not raw.endswith(b"\n") or line_digest(raw[:-1]) != pos.line_sha256:
            return f"the line before offset {pos.offset} changed (truncated and rewritten)"
    return None


def _make_line(raw: bytes, start: int, max_line: int) -> LogLine:
    body = raw[:-1]
    digest = line_digest(body)
    end = start + len(raw)
    if len(body) > max_line:
        return LogLine(start, end, digest, None, None, _oversized(start, end, max_line))
    parsed = parse_log_line(body)
    if isinstance(parsed, str):
        return LogLine(start, end, digest, None, None, f"line at byte {start}: {parsed}; skipped")
    return LogLine(start, end, digest, parsed[0], parsed[1])


def _oversized(start: int, end: int, max_line: int) -> str:
    return f"line at byte {start} is {end - start} bytes, over the {max_line}-byte limit; skipped"


def _skip_oversized(fd: int, start: int, max_line: int) -> LogLine | None:
    """The oversized line starting at ``start`` as a skipped line, or None while it has no newline."""
    pos = start
    while True:
        chunk = os.pread(fd, CHUNK_BYTES, pos)
        if not chunk:
            return None
        idx = chunk.find(b"\n")
        if idx >= 0:
            end = pos + idx + 1
            return LogLine(start, end, "", None, None, _oversized(start, end, max_line))
        pos += len(chunk)


def read_lines(fd: int, offset: int, size: int, max_line: int = MAX_LINE_BYTES) -> list[LogLine]:
    """Every complete line in ``[offset, size)`` of ``fd``; a torn last line is left for later."""
    lines: list[LogLine] = []
    pos = offset
    while pos < size:
        chunk = os.pread(fd, min(size - pos, max(CHUNK_BYTES, max_line + 1)), pos)
        if not chunk:
            break
        last = chunk.rfind(b"\n")
        if last < 0:
            if len(chunk) <= max_line:
                break  # a line still being written
            skipped = _skip_oversized(fd, pos, max_line)
            if skipped is None:
                break
            lines.append(skipped)
            pos = skipped.end
            continue
        start = 0
        while start <= last:
            idx = chunk.index(b"\n", start)
            raw = chunk[start : idx + 1]
            lines.append(_make_line(raw, pos + start, max_line))
            start = idx + 1
        pos += last + 1
    return lines


@dataclass(frozen=True)
class TailRead:
    """What one look at the log found: a restart reason (if any) and the new lines."""

    exists: bool
    restart: str | None
    file_id: tuple[int, int] | None
    lines: list[LogLine]


def tail(path: str, pos: LogPosition, max_line: int = MAX_LINE_BYTES) -> TailRead:
    """Reads the complete lines after ``pos``; on a restart, from the start of the file.

    Does not change ``pos``: the caller advances it as it emits. Raises OSError when the
    file exists but cannot be read.
    """
    try:
        fd = open_regular_fd(path)
    except FileNotFoundError:
        return TailRead(False, None, None, [])
    try:
        st = os.fstat(fd)
        reason = restart_reason(fd, st, pos)
        offset = 0 if reason else pos.offset
        return TailRead(True, reason, file_id(st), read_lines(fd, offset, st.st_size, max_line))
    finally:
        os.close(fd)
