"""The one table of sidecars: name -> "module:Class".

Classes are imported only when a sidecar is run, so ``warden --help`` stays fast and
importing the registry never pulls a sidecar's dependencies. Adding a sidecar touches
this table, its policy file, its alert rules and its tests, nothing else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Deployment:
    """What one kind of deployment adds to the sidecars' scrape jobs and rules (docs/integrations.md).

    Every kind scrapes every sidecar and loads meta.yml, sidecars.yml and each sidecar's rules;
    on top of that, its trainer side: ``jobs`` (scrape jobs), ``rules`` (rule files under
    alerts/, the trainer side's absent alert among them). tests/test_registry.py checks each
    kind's ``prometheus`` config (under alerts/) against this.
    """

    prometheus: str
    jobs: tuple[str, ...]
    rules: tuple[str, ...]


DEPLOYMENTS: dict[str, Deployment] = {
    # Warden's own trainer (the default stack); the bridge job and rules stay for a verl job
    # beside it, with no target until alerts/targets/bridge*.json lists one.
    "warden": Deployment(
        "prometheus.yml",
        jobs=("trainer", "bridge"),
        rules=("rules/meta-trainer.yml", "rules/trainer.yml", "rules/rollout-causes.yml", "rules/bridge.yml"),
    ),
    # verl: `warden bridge verl` is the trainer side; no bridge target listed pages.
    "verl": Deployment("prometheus.verl.yml", jobs=("bridge",), rules=("rules/bridge.yml", "rules/meta-bridge.yml")),
    # HF Trainer / TRL with WardenCallback, metrics_port 0 (its default): no /metrics, nothing trainer-side.
    "hf": Deployment("prometheus.hf.yml", jobs=(), rules=()),
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
