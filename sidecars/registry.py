"""The one table of sidecars: name -> "module:Class".

Classes are imported only when a sidecar is run, so ``warden --help`` stays fast and
importing the registry never pulls a sidecar's dependencies. Adding a sidecar touches
this table, its policy file, its alert rules and its tests, nothing else.
"""

from __future__ import annotations

import importlib

from sidecars.runtime import Sidecar
from warden.errors import ConfigError

SIDECARS: dict[str, str] = {
    "journal": "sidecars.journal.sidecar:JournalSidecar",
    "paths": "sidecars.paths.sidecar:PathsSidecar",
    "signer": "sidecars.signer.sidecar:SignerSidecar",
    "archiver": "sidecars.archiver.sidecar:ArchiverSidecar",
    "tokenscan": "sidecars.tokenscan.sidecar:TokenscanSidecar",
    "deps": "sidecars.deps.sidecar:DepsSidecar",
    "shadow": "sidecars.shadow.sidecar:ShadowSidecar",
}


class UnknownSidecar(ConfigError):
    """No sidecar of that name is registered."""


def sidecar_class(name: str) -> type[Sidecar]:
    """The class registered as ``name``. Raises UnknownSidecar (exit 2)."""
    try:
        target = SIDECARS[name]
    except KeyError:
        raise UnknownSidecar(f"no sidecar named {name!r}; `warden sidecar list` shows {', '.join(SIDECARS)}") from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Sidecar)):
        raise TypeError(f"registry entry {name!r} -> {target} is not a Sidecar subclass")
    return cls
