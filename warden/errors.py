"""Exit codes and the error bases the CLI maps to them (docs/design.md section 7).

0 clean, 1 a policy violation was found, 2 usage or configuration error, 3 the check
could not be completed. Each sidecar module derives its own base from one of these, so
the CLI prints the message (which names the file, key or step) and never a traceback.
"""

from __future__ import annotations

import enum


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


QUOTE_LIMIT = 200


def quote_untrusted(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``text`` flattened to one line and cut to ``limit`` characters, for messages and logs.

    Values read from files an attacker may write (signatures, records, tokenizer files)
    can be megabytes long or hold newlines that forge log lines; quote them through this.
    """
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
