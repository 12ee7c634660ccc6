"""Errors of the bridge; each derives from the Warden base that gives its exit code.

2: a flag is wrong (no input given, a path that is not a directory); 3: something could
not be read or written (the journal, the state file, an input without permission).
"""

from __future__ import annotations

from warden.errors import ConfigError, IncompleteError, WardenError


class BridgeError(WardenError):
    """Base of the bridge's errors (exit 3 unless a subclass says otherwise)."""


class BridgeConfigError(BridgeError, ConfigError):
    """A flag or path is wrong; the message names it (exit 2)."""


class BridgeIncomplete(BridgeError, IncompleteError):
    """An input, the journal or the state could not be read or written (exit 3)."""
