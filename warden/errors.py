"""Exit codes and the error bases the CLI maps to them (docs/design.md section 7).

0 clean, 1 a policy violation was found, 2 usage or configuration error, 3 the check
could not be completed. Each sidecar module derives its own base from one of these, so
the CLI prints the message (which names the file, key or step) and never a traceback.
"""

from __future__ import annotations

import enum
import unicodedata


class ExitCode(enum.IntEnum):
    """The one set of exit codes (also a sidecar's :class:`~sidecars.runtime.Outcome`).

    Ordered by severity for ``max()``: a check that could not complete (3) outranks a
    violation (1), which outranks clean (0); 2 is only ever a CLI usage error.
    """

    OK = 0
    VIOLATION = 1
    USAGE = 2
    INCOMPLETE = 3


EXIT_OK = ExitCode.OK
EXIT_VIOLATION = ExitCode.VIOLATION
EXIT_USAGE = ExitCode.USAGE
EXIT_INCOMPLETE = ExitCode.INCOMPLETE


class WardenError(Exception):
    """Base of every expected failure. ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT_INCOMPLETE


class ViolationError(WardenError):
    """A check ran to the end and found something wrong (tampered, unsafe, unhealthy)."""

    exit_code = EXIT_VIOLATION


class ConfigError(WardenError):
    """A flag, policy or config file is wrong; the message names the file and key."""

    exit_code = EXIT_USAGE


class IncompleteError(WardenError):
    """A check could not be completed (store unreachable, file unreadable)."""

    exit_code = EXIT_INCOMPLETE


class TryAgainLater(IncompleteError):
    """An event cannot be handled now (a hash abandoned on stop, the store unreachable): the
    sidecar adapters turn it into the runtime's RetryLater with this message, so the event's
    cursor is not advanced and the event is handled again later."""


def error_kind(exc: BaseException) -> str:
    """A bounded label value for an exception: its class name in snake case."""
    out = []
    for i, ch in enumerate(type(exc).__name__):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


QUOTE_LIMIT = 200


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(char: str) -> bool:
    """True for a character a terminal shows as itself: not a control, format (bidi, zero-width),
    surrogate, private-use, unassigned or line/paragraph separator character. A backslash is escaped
    too, so an escape in the output always stands for exactly one input character."""
    category = unicodedata.category(char)
    return char != "\\" and not (category[0] == "C" or category in ("Zl", "Zp"))


def quote_untrusted(text: object, limit: int = QUOTE_LIMIT) -> str:
    """The one sanitiser: ``text`` as one printable line of at most ``limit`` characters.

    Values read from storage an attacker may write (file, key and object names, signatures,
    records, tokenizer files) can be megabytes long or hold newlines, carriage returns, escape
    sequences or bidi overrides that forge report and log lines. Runs of whitespace become one
    space; every other character a terminal would not show as itself is escaped (``\\x1b``,
    ``\\u202e``), so two different names never print alike and nothing can move the cursor.
    """
    flat = " ".join(str(text).split())
    if not all(map(_shown, flat)):
        flat = "".join(c if _shown(c) else _escape(c) for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def escape_untrusted(text: str) -> str:
    """``text`` with every character a terminal would act on or hide escaped, newlines kept: what the
    CLI prints (:func:`warden.cliutil.echo`), so a report naming a file the storage writer chose can
    neither move the cursor, recolour, erase nor reorder what is shown. Unlike :func:`quote_untrusted`
    it keeps the layout (spaces, line breaks) and the length."""
    if all(c == "\n" or c == "\\" or _shown(c) for c in text):
        return text
    return "".join(c if c == "\n" or c == "\\" or _shown(c) else _escape(c) for c in text)
