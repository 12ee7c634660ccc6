"""Pinned directories: the manifest digest must equal the policy's ``pinned_directories`` entry."""

from __future__ import annotations

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.manifest import pin_finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot


def check_pinned_token_ids(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """TS1207: the corpus encodes to other ids than the pinned tokenizer's (swapped or remapped
    words), or the tokenizer could not be exercised to tell."""
    pinned = policy.pinned_digest(snap.root, "pinned_token_ids") or policy.pinned_digest(
        snap.root_real, "pinned_token_ids"
    )
    if pinned is None or pinned == snap.token_ids_digest:
        return []
    got = snap.token_ids_digest or "nothing (the tokenizer was not exercised)"
    return [finding("TS1207", ".", f"the built-in corpus encodes to ids with digest {got}, pinned {pinned}")]


def check_pinned_directory(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    pinned = policy.pinned_digest(snap.root) or policy.pinned_digest(snap.root_real)
    if pinned is None or snap.manifest is None:
        return []
    hit = pin_finding(pinned, snap.manifest)
    return [hit] if hit else []
