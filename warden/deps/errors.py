"""Error bases of the deps auditor; the CLI maps them to exit codes (2 usage, 3 incomplete)."""

from __future__ import annotations

from warden.errors import ConfigError, IncompleteError


class DepsConfigError(ConfigError):
    """A flag or policy value of the deps auditor is wrong (exit 2)."""


class DepsIncomplete(IncompleteError):
    """The audit could not be completed: target unreadable, OSV data missing (exit 3)."""


class TargetError(DepsIncomplete):
    """The environment to audit could not be discovered or read."""
