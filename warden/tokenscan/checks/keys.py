"""Check 7: dangerous config keys (trust_remote_code, private keys, hub kernels, RAG indexes, GGUF) and
the loader-read settings of tokenizer_config.json and tokenizer.json that change how text becomes ids
(TS707, judged by :mod:`..encoding_settings`)."""

from __future__ import annotations

import os
from typing import Any

from warden.tokenscan import encoding_settings as es
from warden.tokenscan import pipeline_rules as pr
from warden.tokenscan.checks.common import basename, doc_keys, short, strings_in
from warden.tokenscan.findings import Finding, Severity, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

# re-exported: the floors are the settings table's (tests and docs name them here)
MIN_MODEL_MAX_LENGTH = es.MIN_MODEL_MAX_LENGTH
MIN_CHAT_MODEL_MAX_LENGTH = es.MIN_CHAT_MODEL_MAX_LENGTH
REQUIRED_INPUT_NAMES = es.REQUIRED_INPUT_NAMES

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
            ctx = tokenizer_setting_context(_beside(snap, doc.rel, "tokenizer.json"), chat)
            out += [finding("TS707", doc.rel, why, key=key) for key, why in encoding_key_problems(doc.data, chat, ctx)]
    for rel, doc in sorted(snap.json.items()):
        if pr.looks_like_tokenizer(doc.data):
            chat = _has_template(snap, rel, templates)
            ctx = tokenizer_setting_context(doc.data, chat)
            found = es.setting_problems(es.TOKENIZER_JSON_SETTINGS, doc.data, ctx)
            out += [finding("TS707", rel, why, key=key) for key, why in found]
    return out


def _beside(snap: Snapshot, rel: str, name: str) -> dict[str, Any] | None:
    folder = os.path.dirname(rel)
    doc = snap.json.get(os.path.join(folder, name) if folder else name)
    return doc.data if doc is not None and isinstance(doc.data, dict) else None


def _has_template(snap: Snapshot, rel: str, templates: set[str]) -> bool:
    """Whether the tokenizer folder of ``rel`` has a chat template (in its config or a file)."""
    config = _beside(snap, rel, "tokenizer_config.json") or {}
    return "chat_template" in config or os.path.dirname(rel) in templates


def encoding_key_problems(
    config: dict[str, Any], chat: bool, ctx: es.SettingContext | None = None
) -> list[tuple[str, str]]:
    """(key, why) for each ``tokenizer_config.json`` value that changes how text becomes ids
    (:data:`..encoding_settings.CONFIG_SETTINGS`, one row per key the loader reads).
    ``chat``: the tokenizer has a template; ``ctx``: the tokenizer.json beside (markup tokens)."""
    ctx = ctx or es.SettingContext()
    return es.setting_problems(es.CONFIG_SETTINGS, config, es.SettingContext(chat, ctx.markup, ctx.specials))


def tokenizer_setting_context(tok: dict[str, Any] | None, chat: bool) -> es.SettingContext:
    """The special added tokens (content -> id) and the markup added tokens that are not special
    of a parsed tokenizer.json (None: there is none)."""
    added = [a for a in (tok or {}).get("added_tokens") or [] if isinstance(a, dict)]
    specials = {str(a.get("content")): a["id"] for a in added if a.get("special") and type(a.get("id")) is int}
    markup = frozenset(
        str(a["content"]) for a in added
        if not a.get("special") and isinstance(a.get("content"), str) and pr.MARKUP_CHARS.intersection(a["content"])
    )  # fmt: skip
    return es.SettingContext(chat, markup, specials)


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
