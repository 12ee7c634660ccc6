"""Check 7: dangerous config keys (trust_remote_code, private keys, hub kernels, RAG indexes, GGUF) and
tokenizer_config keys that change what every encoding returns (TS707)."""

from __future__ import annotations

import os
from typing import Any

from warden.tokenscan.checks.common import basename, doc_keys, short, strings_in
from warden.tokenscan.findings import Finding, Severity, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

RAG_KEYS = frozenset({"index_name", "index_path", "passages_path"})
CUSTOM_CODE_KEYS = frozenset({"custom_pipelines"})


def _is_kernel_key(key: str) -> bool:
    return "attn_implementation" in key or "kernel" in key.lower()


def check_dangerous_keys(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    templates = {os.path.dirname(t.rel) for t in snap.templates if t.rel.endswith(".jinja")}
    for doc in snap.configs():
        if not doc.config:
            continue  # vocab.json / added_tokens.json: keys are tokens ("_" is one), not settings
        for path, key, value in doc_keys(doc):
            out += _key_findings(doc.rel, path, key, value, policy)
        if basename(doc.rel) == "tokenizer_config.json":
            chat = "chat_template" in doc.data or os.path.dirname(doc.rel) in templates
            out += [finding("TS707", doc.rel, why, key=key) for key, why in encoding_key_problems(doc.data, chat)]
    return out


# The shortest context of any tokenizer family a loader may meet: encoder and text-tower
# tokenizers truncate at 64 (SigLIP), 77 (CLIP), 512 (BERT, T5); every chat family's context is
# 2048 tokens or more. Below these, every longer prompt is cut (``truncation=True``).
MIN_MODEL_MAX_LENGTH = 64
MIN_CHAT_MODEL_MAX_LENGTH = 1024
REQUIRED_INPUT_NAMES = ("input_ids", "attention_mask")


def encoding_key_problems(config: dict[str, Any], chat: bool) -> list[tuple[str, str]]:
    """(key, why) for each ``tokenizer_config.json`` value that changes what every encoding
    returns: ``model_max_length`` not a number or below the shortest context of any family
    (:data:`MIN_MODEL_MAX_LENGTH`; :data:`MIN_CHAT_MODEL_MAX_LENGTH` for a tokenizer with a chat
    template), ``model_input_names`` without ``input_ids`` and ``attention_mask`` (the tokenizer
    stops returning the mask: padding is then attended to). ``chat``: the tokenizer has a template."""
    out = []
    if "model_max_length" in config and config["model_max_length"] is not None:
        value = config["model_max_length"]
        floor = MIN_CHAT_MODEL_MAX_LENGTH if chat else MIN_MODEL_MAX_LENGTH
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out.append(("model_max_length", f"model_max_length {short(value)!r} is not a number of tokens"))
        elif value < floor:
            kind = "a chat tokenizer's" if chat else "any tokenizer's"
            out.append(("model_max_length", f"model_max_length {value:g} truncates prompts far below {kind} "
                                            f"context (at least {floor})"))  # fmt: skip
    if "model_input_names" in config:
        names = config["model_input_names"]
        missing = [n for n in REQUIRED_INPUT_NAMES if not (isinstance(names, list) and n in names)]
        if missing:
            out.append(("model_input_names", f"model_input_names {short(names)!r} lacks {', '.join(missing)}"))
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
