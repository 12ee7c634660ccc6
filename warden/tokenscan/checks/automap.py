"""Check 1: ``auto_map`` anywhere in a JSON config (dict and legacy list forms, repo--module refs)."""

from __future__ import annotations

from typing import Any

from warden.tokenscan.checks.common import doc_keys, short, strings_in
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot


def describe_auto_map(value: Any) -> str:
    """``'tokenization_x.Tok' (legacy list form); from another repository: 'evil/repo'``."""
    refs = [s for s in strings_in(value) if "." in s or "--" in s]
    form = " (legacy list form)" if isinstance(value, list) else ""
    text = ", ".join(repr(short(r, 60)) for r in refs[:4]) or short(value)
    repos = sorted({r.split("--", 1)[0] for r in refs if "--" in r})
    other = f"; code from another repository: {', '.join(repos)}" if repos else ""
    return f"references {text}{form}{other}"


def check_auto_map(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for doc in snap.configs():
        for path, key, value in doc_keys(doc):
            if key == "auto_map":
                out.append(finding("TS101", doc.rel, f"auto_map {describe_auto_map(value)}", key=path))
    return out
