"""Schema of ``policies/signer.yaml``: the signing key, watched roots, timings.

Loaded with :func:`sidecars.policy.load_policy`; a bad value raises PolicyError naming the
file and key, e.g. ``policies/signer.yaml: watch[0]: layout: ...``. Paths expand ``~``
and ``$VARS`` and are relative to the working directory. The private key path is taken
from ``WARDEN_SIGNING_KEY`` when that variable is set, else from ``signing_key``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LAYOUTS = ("warden", "hf", "verl")
"""``warden``: ``step-N/`` renamed into place (complete by name); ``hf``: ``checkpoint-N/``
complete once it holds ``trainer_state.json`` and is stable; ``verl``: ``global_step_N/``,
only the step named by ``latest_checkpointed_iteration.txt``, once both are stable."""

SIGNING_KEY_ENV = "WARDEN_SIGNING_KEY"


def expand_path(path: str) -> str:
    """``~`` and ``$VARS`` expanded, made absolute against the working directory."""
    return os.path.abspath(os.path.expandvars(os.path.expanduser(path)))


@dataclass(frozen=True)
class WatchRoot:
    """A directory whose checkpoint subdirectories another trainer writes.

    ``run_id`` goes into each signature's provenance (default: the root's basename).
    """

    path: str
    layout: str = "hf"
    run_id: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if not self.path:
            raise ValueError("path: must not be empty")

    @property
    def resolved(self) -> str:
        """The root as an absolute path."""
        return expand_path(self.path)

    @property
    def effective_run_id(self) -> str:
        """``run_id``, or the root directory's name."""
        return self.run_id or os.path.basename(self.resolved.rstrip(os.sep)) or "unknown"


@dataclass(frozen=True)
class SignerPolicy:
    """The signer sidecar's settings; see policies/signer.yaml for the field notes."""

    signing_key: str | None = None
    trusted_keys: str | None = None
    hash_workers: int | None = None
    sign_run_checkpoints: bool = True
    watch: tuple[WatchRoot, ...] = ()
    check_interval_seconds: float = 1.0
    rescan_seconds: float = 30.0
    stable_seconds: float = 30.0
    reverify_interval_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("check_interval_seconds", "rescan_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        for name in ("stable_seconds", "reverify_interval_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 disables re-verification)")
        if self.hash_workers is not None and self.hash_workers < 1:
            raise ValueError("hash_workers: must be >= 1 (or null for one per core)")
        seen = set()
        for index, root in enumerate(self.watch):
            if root.resolved in seen:
                raise ValueError(f"watch[{index}].path: {root.path} is listed twice")
            seen.add(root.resolved)

    def key_path(self, environ: dict[str, str] | None = None) -> str | None:
        """The private key file: ``$WARDEN_SIGNING_KEY`` if set, else ``signing_key``."""
        env = os.environ if environ is None else environ
        chosen = env.get(SIGNING_KEY_ENV) or self.signing_key
        return expand_path(chosen) if chosen else None
