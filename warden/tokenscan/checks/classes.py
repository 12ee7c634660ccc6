"""Checks 3 and 4: ``tokenizer_class`` (and processor class references) and ``model_type``
exactly on the policy's whitelists."""

from __future__ import annotations

from typing import Any

from warden.tokenscan.checks.common import named, short, walk_keys
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

PROCESSOR_KEYS = ("processor_class", "image_processor_type", "feature_extractor_type", "video_processor_type")


def _allowed(value: Any, allowed: tuple[str, ...]) -> bool:
    return isinstance(value, str) and value in allowed


def check_tokenizer_class(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    allowed = policy.allowed_tokenizer_classes
    for doc in named(snap, "tokenizer_config.json", "config.json"):
        value = doc.data.get("tokenizer_class")
        if value is not None and not _allowed(value, allowed):
            out.append(
                finding(
                    "TS301",
                    doc.rel,
                    f"tokenizer_class {short(value)!r} is not one of: {', '.join(allowed) or '(none allowed)'}",
                    key="tokenizer_class",
                )
            )
    for doc in snap.configs():
        if not doc.config:
            continue
        for key in PROCESSOR_KEYS:
            value = doc.data.get(key)
            if value is not None and not _allowed(value, policy.allowed_processor_classes):
                out.append(finding("TS302", doc.rel, f"{key} {short(value)!r} is not on the whitelist", key=key))
    return out


def check_model_type(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    allowed = policy.allowed_model_types
    for doc in named(snap, "config.json"):
        for path, key, value in walk_keys(doc.data):
            if key == "model_type" and not _allowed(value, allowed):
                out.append(
                    finding(
                        "TS401",
                        doc.rel,
                        f"model_type {short(value)!r} is not one of: {', '.join(allowed) or '(none allowed)'}",
                        key=path,
                    )
                )
    return out
