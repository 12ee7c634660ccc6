"""Where a command or sidecar keeps its state when no ``--state-dir`` is given: never the current directory.

The rule: ``<run_dir>/state/<name>`` when the command has a run directory; else the user's state
directory, ``$XDG_STATE_HOME/warden/<name>`` (``~/.local/state/warden/<name>`` when unset). A command
run from a checkout or a home directory therefore never leaves a ``./state/`` behind, and two
checkouts share one cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def user_state_home(environ: dict[str, str] | None = None) -> str:
    """``$XDG_STATE_HOME`` when it is an absolute path (the XDG rule), else ``~/.local/state``."""
    env = os.environ if environ is None else environ
    value = env.get("XDG_STATE_HOME", "")
    return value if os.path.isabs(value) else os.path.join(os.path.expanduser("~"), ".local", "state")


def default_state_dir(name: str, run_dir: str | None = None, environ: dict[str, str] | None = None) -> str:
    """The state directory of ``name`` by the rule above (absolute; not created here)."""
    if run_dir:
        return os.path.abspath(os.path.join(run_dir, "state", name))
    return os.path.join(user_state_home(environ), "warden", name)


def resolve_state_dir(
    given: str | None,
    name: str,
    run_dir: str | None = None,
    say: Callable[[str], None] | None = None,
    environ: dict[str, str] | None = None,
) -> str:
    """``given`` (a ``--state-dir`` or a sidecar's configured directory) when set; else the default
    above, told through ``say`` (a command's stderr) as ``state: PATH (--state-dir to choose)``, so
    the user always sees where state goes. Every command with a state directory resolves it here."""
    if given:
        return given
    chosen = default_state_dir(name, run_dir, environ)
    if say is not None:
        say(f"state: {chosen} (--state-dir to choose)")
    return chosen
