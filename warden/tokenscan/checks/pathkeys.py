"""Check 5: file-name keys must be plain basenames (no '/', '..', absolute or home paths)."""

from __future__ import annotations

from typing import Any

from warden.tokenscan.checks.common import doc_keys, short
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

PATH_KEYS = frozenset(
    {
        "fast_tokenizer_files",
        "vocab_file",
        "merges_file",
        "tokenizer_file",
        "spm_file",
        "chat_template_file",
        "added_tokens_file",
    }
)


def path_problem(value: Any) -> str | None:
    """Why ``value`` is not a plain file name, or None when it is one."""
    if not isinstance(value, str):
        return f"is not a string ({type(value).__name__})"
    if not value or value in (".", ".."):
        return "is empty or a directory reference"
    if value.startswith(("/", "~")) or (len(value) > 1 and value[1] == ":"):
        return "is an absolute or home path"
    if "/" in value or "\\" in value:
        return "contains a path separator" + (" and '..'" if ".." in value else "")
    if "\0" in value:
        return "contains a NUL byte"
    return None


def check_path_keys(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for doc in snap.configs():
        for path, key, value in doc_keys(doc):
            if key not in PATH_KEYS or value is None:
                continue
            items = value if isinstance(value, list) else [value]
            for item in items:
                problem = path_problem(item)
                if problem:
                    out.append(finding("TS501", doc.rel, f"{key} value {short(item)!r} {problem}", key=path))
    return out
