"""What the signer's services share, and how its keys and roots come from the policy.

:class:`SignerState` holds the settings, keys, stores, instruments and clock that
:class:`~warden.signer.announced_signing.AnnouncedSigning` (``checkpoint.saved``),
:class:`~warden.signer.root_scanning.RootScan` (the roots: sign what is stable, audit the
run's own root), :class:`~warden.signer.reverification.Reverification` and
:class:`~warden.signer.resume_checking.ResumeChecking` (``run.resumed``) work on, plus the
one piece of bookkeeping two of them touch: the watched roots' unsigned checkpoints and their
failed attempts (any signature written, from an event too, takes its checkpoint off both).
What only one service needs stays in that service.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import ec

from warden.errors import ConfigError
from warden.signer.announcements import AnnouncementStore
from warden.signer.instruments import SignerInstruments
from warden.signer.policy import SIGNING_KEY_ENV, SignerPolicy
from warden.signer.runs import RunRegistry
from warden.signer.watch import VERL_TRACKER, Candidate, TreeState
from warden.signing.keys import TrustedKeys, load_private_key, load_trusted_keys, trusted_keys_from

RUN_CHECKPOINTS = "checkpoints"
Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Root:
    """A directory of checkpoints the sidecar looks after."""

    path: str
    layout: str
    run_id: str | None
    default_run_id: str | None = None
    announced_only: bool = False
    """The run's own root: signed only on an event announcing the digest; the scan audits, never signs."""

    def extras(self) -> list[str]:
        """Files outside the checkpoint whose stability counts too (verl's tracker)."""
        return [os.path.join(self.path, VERL_TRACKER)] if self.layout == "verl" else []


@dataclass
class Unsigned:
    """A complete checkpoint without a signature, as last observed."""

    candidate: Candidate
    root: Root
    state: TreeState
    observed_at: float
    ready_at: float


@dataclass
class SignerState:
    """The signer's shared state; each service keeps the rest of what it remembers itself."""

    name: str
    """The sidecar's name, in every log record's ``sidecar`` field."""
    policy: SignerPolicy
    key: ec.EllipticCurvePrivateKey
    trusted: TrustedKeys
    """The signer's own public key plus the policy's ``trusted_keys``."""
    metrics: SignerInstruments
    roots: list[Root]
    runs: RunRegistry
    announced: AnnouncementStore
    log: logging.Logger
    clock: Callable[[], float]
    """Unix time (the sidecar context's clock)."""
    stop: threading.Event
    """Set on SIGTERM: a hash in progress is abandoned within one read."""
    run_dir: str | None = None
    fence: Callable[[], Callable[[], None] | None] | None = None
    """Runs right before a ``.sig`` is written; raises LeaseLost when this process does not hold the
    run's lease with the current token (multi-node, warden/lease.py), else returns the check run right
    after the write (a late write pages). None: no lease."""
    unsigned: dict[str, Unsigned] = field(default_factory=dict)
    """Complete checkpoints of the watched roots without a signature, by path."""
    failed: dict[str, tuple[Fingerprint, float]] = field(default_factory=dict)
    """Path -> (the content that failed to sign, when to try it again)."""


def roots_of(policy: SignerPolicy, run_dir: str | None) -> list[Root]:
    """The run's own root (``<run_dir>/checkpoints``, when signed at all) and then the policy's watch roots."""
    roots = []
    if policy.sign_run_checkpoints and run_dir:
        roots.append(Root(os.path.join(run_dir, RUN_CHECKPOINTS), "warden", None, announced_only=True))
    for spec in policy.watch:
        if spec.resolved not in {r.path for r in roots}:
            roots.append(Root(spec.resolved, spec.layout, spec.run_id, spec.effective_run_id))
    return roots


def signing_key(policy: SignerPolicy, policy_path: str | None) -> ec.EllipticCurvePrivateKey:
    """Loads the policy's (or ``$WARDEN_SIGNING_KEY``'s) key; refuses loose permissions or owners.

    A relative ``signing_key`` is relative to the policy file's directory (see policy.py).
    """
    path = policy.key_path(base=policy_dir(policy_path))
    if path is None:
        where = policy_path or "the signer policy"
        raise ConfigError(f"{where}: signing_key is not set; set it or {SIGNING_KEY_ENV} to a private key file")
    return load_private_key(path)


def policy_dir(policy_path: str | None) -> str | None:
    """The directory relative key paths of the policy resolve against; None without a policy file."""
    return os.path.dirname(os.path.abspath(policy_path)) if policy_path else None


def trust_set(key: ec.EllipticCurvePrivateKey, extra: str | None) -> TrustedKeys:
    """The signer's own public key, plus every key in ``extra`` (a .pub file or directory)."""
    own = trusted_keys_from([key.public_key()], "the signing key")
    if not extra:
        return own
    loaded = load_trusted_keys(extra)
    return TrustedKeys({**loaded.by_id, **own.by_id}, f"{loaded.source} and the signing key")
