"""Check 10: the special tokens PPO relies on are defined (``required``), every declared one is in
the vocabulary, and pad differs from eos when the policy asks."""

from __future__ import annotations

from typing import Any

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

END_PROCESSORS = ("BertProcessing", "RobertaProcessing")


def implied_end_token(processor: Any, depth: int = 0) -> str | None:
    """The token tokenizer.json's post-processor ends every sequence with (BERT's [SEP], T5's
    </s>): an encoder tokenizer that declares no eos/sep in its config still has one."""
    if not isinstance(processor, dict) or depth > 4:
        return None
    kind = processor.get("type")
    if kind in END_PROCESSORS and isinstance(processor.get("sep"), list) and processor["sep"]:
        return str(processor["sep"][0])
    if kind == "TemplateProcessing" and isinstance(processor.get("single"), list) and processor["single"]:
        last = processor["single"][-1]
        special = last.get("SpecialToken") if isinstance(last, dict) else None
        return str(special["id"]) if isinstance(special, dict) and "id" in special else None
    if kind == "Sequence" and isinstance(processor.get("processors"), list):
        found = (implied_end_token(p, depth + 1) for p in processor["processors"])
        return next((t for t in found if t), None)
    return None


def check_special_tokens(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    if not snap.has_tokenizer:
        return []
    present = {e.rel for e in snap.entries}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if name in present and snap.top(name) is None:
            return []  # unread (link, cap) or unparsable: that finding stands; tokens cannot be judged
    where = "tokenizer_config.json" if snap.top("tokenizer_config.json") is not None else "."
    out = []
    tokens = snap.special_tokens
    for name in ("bos", "eos", "pad", "unk"):
        value = tokens.get(name)
        if not value:
            implied = implied_end_token((snap.top("tokenizer.json") or {}).get("post_processor"))
            if name == "eos" and (tokens.get("sep") or implied):
                continue  # an encoder tokenizer (BERT) ends sequences with sep / its post-processor's token
            if name in policy.special_tokens.required:
                out.append(finding("TS1001", where, f"{name}_token is not defined", key=f"{name}_token"))
        elif snap.vocabulary is not None and value not in snap.vocabulary:
            out.append(
                finding("TS1002", where, f"{name}_token {value!r} is not in the vocabulary", key=f"{name}_token")
            )
    pad, eos = tokens.get("pad"), tokens.get("eos")
    if policy.special_tokens.pad_distinct_from_eos and pad and pad == eos:
        out.append(finding("TS1003", where, f"pad_token and eos_token are both {pad!r}", key="pad_token"))
    return out
