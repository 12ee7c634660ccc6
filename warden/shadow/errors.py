"""Errors of the shadow comparison."""

from __future__ import annotations

from warden.errors import ConfigError, IncompleteError


class ShadowConfigError(ConfigError):
    """A run to compare is not named or not a journal (exit 2)."""


class NothingToCompare(IncompleteError):
    """The runs share no step with a judged metric or reward snapshot (exit 3)."""


class ShadowInputError(IncompleteError):
    """A followed journal cannot be read (not a regular file); the check is incomplete."""
