"""Check 12: what the tokenizer does (the invariants of :mod:`..tokenizer_behaviour`)."""

from __future__ import annotations

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

RULE_OF_KIND = {
    "load": "TS1201",
    "panic": "TS1201",
    "roundtrip": "TS1202",
    "special": "TS1203",
    "added": "TS1204",
    "order": "TS1205",
    "rule": "TS1209",  # a sentencepiece .model's charsmap rewrites text (judged as tokenizer.json's)
    "timeout": "TS1206",
    "lookalike": "TS1004",
    "ordinary": "TS1005",
    "unmatched": "TS1215",
    "unavailable": "TS910",  # analysis incomplete: tokenizers/sentencepiece missing where the scan runs
}


def check_tokenizer_behaviour(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    return [finding(RULE_OF_KIND[issue.kind], rel, issue.detail) for rel, issue in snap.tokenizer_issues]
