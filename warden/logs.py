"""JSON-lines logging to stderr, one object per record.

Fields: ``time`` (RFC 3339 UTC), ``level``, ``logger``, ``msg`` and whatever was passed
in ``extra={"fields": {...}}``. Exceptions are rendered into ``exc`` as text, never as a
bare traceback on the terminal.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
import time
from typing import Any, TextIO

from warden.errors import quote_untrusted


def utc_timestamp(now: float) -> str:
    """RFC 3339 UTC time with microseconds, e.g. ``2026-11-30T03:12:45.123456Z``."""
    moment = _dt.datetime.fromtimestamp(now, tz=_dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


LOG_MESSAGE_LIMIT = 4000
"""Characters of one log message; the rest is cut (a message may quote a file of any size)."""


def safe_message(record: logging.LogRecord) -> str:
    """The record's message as one printable line: every log line goes through the one sanitiser
    (:func:`warden.errors.quote_untrusted`), so a name the storage writer chose can never forge a
    line, move the cursor or hide text, whatever the call site forgot to quote."""
    return quote_untrusted(record.getMessage(), LOG_MESSAGE_LIMIT)


class SafeTextFormatter(logging.Formatter):
    """``logging.Formatter`` whose ``%(message)s`` is :func:`safe_message` (tracebacks stay as they are)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = safe_message(record)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": safe_message(record),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_json_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Routes the root logger to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.Formatter.converter = time.gmtime


def log_fields(**fields: Any) -> dict[str, Any]:
    """``logger.info("msg", extra=log_fields(path=p))`` attaches structured fields."""
    return {"fields": fields}
