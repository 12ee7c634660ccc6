"""Check 7: dangerous config keys (trust_remote_code, private keys, hub kernels, RAG indexes, GGUF)."""

from __future__ import annotations

from warden.tokenscan.checks.common import doc_keys, short, strings_in
from warden.tokenscan.findings import Finding, Severity, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

RAG_KEYS = frozenset({"index_name", "index_path", "passages_path"})
CUSTOM_CODE_KEYS = frozenset({"custom_pipelines"})


def _is_kernel_key(key: str) -> bool:
    return "attn_implementation" in key or "kernel" in key.lower()


def check_dangerous_keys(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for doc in snap.configs():
        if not doc.config:
            continue  # vocab.json / added_tokens.json: keys are tokens ("_" is one), not settings
        for path, key, value in doc_keys(doc):
            out += _key_findings(doc.rel, path, key, value, policy)
    return out


def _key_findings(rel: str, path: str, key: str, value: object, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    if key == "trust_remote_code":
        sev = Severity.CRITICAL if value else Severity.MEDIUM
        out.append(finding("TS701", rel, f"trust_remote_code: {short(value)}", key=path, severity=sev))
    if key.startswith("_") and key not in policy.allowed_private_keys:
        out.append(finding("TS702", rel, f"internal key {key!r} = {short(value, 60)!r}", key=path))
    if _is_kernel_key(key):
        hub = [s for s in strings_in(value) if "/" in s]
        if hub:
            out.append(finding("TS703", rel, f"{key} references hub code {short(hub[0])!r}", key=path))
    if key in RAG_KEYS and value not in (None, ""):
        out.append(finding("TS704", rel, f"{key} = {short(value)!r}", key=path))
    if key == "gguf_file" and value not in (None, ""):
        out.append(finding("TS705", rel, f"gguf_file = {short(value)!r}", key=path))
    if key in CUSTOM_CODE_KEYS and value:
        out.append(finding("TS706", rel, f"{key} registers custom code: {short(value)!r}", key=path))
    return out
