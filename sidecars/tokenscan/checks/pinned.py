"""Pinned directories: the manifest digest must equal the policy's ``pinned_directories`` entry."""

from __future__ import annotations

from sidecars.tokenscan.findings import Finding
from sidecars.tokenscan.manifest import pin_finding
from sidecars.tokenscan.policy import TokenscanPolicy
from sidecars.tokenscan.snapshot import Snapshot


def check_pinned_directory(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    pinned = policy.pinned_digest(snap.root) or policy.pinned_digest(snap.root_real)
    if pinned is None or snap.manifest is None:
        return []
    hit = pin_finding(pinned, snap.manifest)
    return [hit] if hit else []
