"""Schema of ``policies/signer.yaml``: the signing key, watched roots, timings.

Loaded with :func:`warden.policy.load_policy`; a bad value raises PolicyError naming the
file and key, e.g. ``policies/signer.yaml: watch[0]: layout: ...``. Paths expand ``~``
and ``$VARS`` and are relative to the working directory. The private key path is taken
from ``WARDEN_SIGNING_KEY`` when that variable is set, else from ``signing_key``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from warden.errors import ConfigError
from warden.lease import LeaseSettings
from warden.signing.manifest import SERIALIZATION_METHOD, SHARDS_METHOD, Serialization

SHARD_SIZE = 256 << 20
"""Default ``shard_size`` for ``serialization: shards`` (see policies/README.md for the measurement)."""
LAYOUTS = ("warden", "hf", "verl")
"""``warden``: ``step-N/`` renamed into place (complete by name); ``hf``: ``checkpoint-N/``
complete once it holds ``trainer_state.json`` and is stable; ``verl``: ``global_step_N/``,
only the step named by ``latest_checkpointed_iteration.txt``, once both are stable."""

SIGNING_KEY_ENV = "WARDEN_SIGNING_KEY"


def expand_path(path: str) -> str:
    """``~`` and ``$VARS`` expanded, made absolute against the working directory."""
    return os.path.abspath(os.path.expandvars(os.path.expanduser(path)))


def resolve_key_path(path: str, base: str | None, what: str) -> str:
    """``path`` (``~``/``$VARS`` expanded) made absolute against ``base``, never against the cwd.

    ``base`` is the policy file's directory; a relative ``path`` without one raises
    ConfigError naming ``what``, so a key is never picked up from wherever the process
    happens to start.
    """
    expanded = os.path.expandvars(os.path.expanduser(path))
    if os.path.isabs(expanded):
        return os.path.normpath(expanded)
    if base is None:
        raise ConfigError(
            f"{what}: {path!r} is a relative path and there is no policy file to resolve it against; "
            "give an absolute path"
        )
    return os.path.normpath(os.path.join(base, expanded))


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
    serialization: str = SERIALIZATION_METHOD
    shard_size: int = SHARD_SIZE
    hash_algorithm: str = "sha256"
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    """One signer per run across nodes (warden/lease.py; docs/deploy.md "Multi-node")."""

    def __post_init__(self) -> None:
        self.signing_serialization()  # raises ValueError naming the field
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

    def signing_serialization(self) -> Serialization:
        """What new signatures use: ``serialization`` with ``shard_size`` and ``hash_algorithm``.

        Verification always follows the signature's own serialization, whatever this says.
        """
        if self.serialization not in (SERIALIZATION_METHOD, SHARDS_METHOD):
            raise ValueError(f"serialization: expected files or shards, got {self.serialization!r}")
        if self.hash_algorithm not in ("sha256", "blake3"):
            raise ValueError(f"hash_algorithm: expected sha256 or blake3, got {self.hash_algorithm!r}")
        if self.serialization == SHARDS_METHOD:
            if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1 << 20:
                raise ValueError(f"shard_size: an integer number of bytes >= 1048576, got {self.shard_size!r}")
            if self.hash_algorithm != "sha256":
                raise ValueError("hash_algorithm: blake3 goes with serialization files (shards are sha256)")
            return Serialization(SHARDS_METHOD, "sha256", self.shard_size)
        return Serialization(SERIALIZATION_METHOD, self.hash_algorithm)

    def key_path(self, environ: dict[str, str] | None = None, base: str | None = None) -> str | None:
        """The private key file: ``$WARDEN_SIGNING_KEY`` (absolute) if set, else ``signing_key``.

        ``base``: the policy file's directory, against which a relative ``signing_key`` resolves.
        """
        env = os.environ if environ is None else environ
        if env.get(SIGNING_KEY_ENV):
            return resolve_key_path(env[SIGNING_KEY_ENV], None, SIGNING_KEY_ENV)
        return resolve_key_path(self.signing_key, base, "signing_key") if self.signing_key else None

    def trusted_keys_path(self, base: str | None = None) -> str | None:
        """``trusted_keys`` made absolute against ``base`` (the policy file's directory); None if unset."""
        return resolve_key_path(self.trusted_keys, base, "trusted_keys") if self.trusted_keys else None
