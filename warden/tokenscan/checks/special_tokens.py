"""Check 10: the special tokens PPO relies on are defined (``required``), every declared one is in
the vocabulary, and pad differs from eos when the policy asks; judged per folder a loader loads a
tokenizer from (the root, ``tokenizer/``, ``tokenizer_2/``), each on its own files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from warden.tokenscan import loader_files as lf
from warden.tokenscan.declared import SPECIAL_NAMES, loader_special_tokens, token
from warden.tokenscan.declared import _tokenizer_vocab as tokenizer_vocab
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


DECLARING = frozenset({"tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"})


@dataclass(frozen=True)
class FolderTokens:
    """What one tokenizer folder declares: ``tokens`` (bos, eos, pad, unk, sep as the loader
    merges the configs), ``vocabulary`` (None: none readable), ``processor`` (tokenizer.json's)."""

    folder: str
    tokens: dict[str, str | None]
    vocabulary: frozenset[str] | None
    processor: Any


def tokenizer_folders(snap: Snapshot) -> list[str]:
    """The folders a loader loads a tokenizer from (``from_pretrained(path, subfolder=...)``;
    :func:`~..loader_files.tokenizer_roots`) that say which tokens are special: a configuration
    or a ``tokenizer.json`` of their own; the root also with only a ``tokenizer.model``. A root
    whose tokenizer lives in ``tokenizer/`` is not a tokenizer itself; Llama's ``original/``
    (a bare ``tokenizer.model``, no configuration) declares nothing to judge."""
    names: dict[str, set[str]] = {}
    for e in snap.entries:
        names.setdefault(os.path.dirname(e.rel), set()).add(os.path.basename(e.rel))
    out = []
    for folder in lf.tokenizer_roots(e.rel for e in snap.entries):
        here = names.get(folder, set())
        if here & DECLARING or (folder == "" and "tokenizer.model" in here):
            out.append(folder)
    return out


def _doc(snap: Snapshot, folder: str, name: str) -> dict[str, Any] | None:
    doc = snap.json.get(os.path.join(folder, name) if folder else name)
    return doc.data if doc and isinstance(doc.data, dict) else None


def folder_tokens(snap: Snapshot, folder: str) -> FolderTokens:
    """The root's tokens are the snapshot's (:mod:`..declared`); a subfolder's are read from its
    own files the same way (a sentencepiece model's pieces are known for the whole tree only)."""
    tok = _doc(snap, folder, "tokenizer.json") or {}
    if not folder:
        return FolderTokens("", dict(snap.special_tokens), snap.vocabulary, tok.get("post_processor"))
    config, smap = (
        _doc(snap, folder, "tokenizer_config.json") or {},
        _doc(snap, folder, "special_tokens_map.json") or {},
    )
    resolved = loader_special_tokens(config, smap, tok)  # the one resolution the root's tokens come from too
    tokens: dict[str, str | None] = {n: resolved.get(n) for n in SPECIAL_NAMES}
    parts: list[frozenset[str]] = [tokenizer_vocab(tok)] if tok else []
    parts += [frozenset(map(str, d)) for d in (_doc(snap, folder, n) for n in ("vocab.json", "added_tokens.json")) if d]
    lines = snap.vocab_lines.get(os.path.join(folder, "vocab.txt"))
    parts += [frozenset(t for t in lines if t)] if lines else []
    decoder = config.get("added_tokens_decoder")
    parts += [frozenset(t for t in (token(v) for v in decoder.values()) if t)] if isinstance(decoder, dict) else []
    if any(e.rel.startswith(folder + "/") and e.rel.endswith(".model") for e in snap.entries) and snap.vocabulary:
        parts.append(snap.vocabulary)
    vocabulary = frozenset().union(*parts) if parts else None
    return FolderTokens(folder, tokens, vocabulary, tok.get("post_processor"))


def check_special_tokens(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """Each tokenizer folder (:func:`tokenizer_folders`) judged on its own declarations."""
    present = {e.rel for e in snap.entries}
    out = []
    for folder in tokenizer_folders(snap):
        names = [os.path.join(folder, n) if folder else n for n in ("tokenizer_config.json", "special_tokens_map.json")]
        if any(rel in present and (rel not in snap.json or not isinstance(snap.json[rel].data, dict)) for rel in names):
            continue  # unread (link, cap) or unparsable: that finding stands; tokens cannot be judged
        where = names[0] if names[0] in snap.json else folder or "."
        out += _folder_findings(folder_tokens(snap, folder), where, policy)
    return out


def _folder_findings(ft: FolderTokens, where: str, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    tokens = ft.tokens
    for name in ("bos", "eos", "pad", "unk"):
        value = tokens.get(name)
        if not value:
            if name == "eos" and (tokens.get("sep") or implied_end_token(ft.processor)):
                continue  # an encoder tokenizer (BERT) ends sequences with sep / its post-processor's token
            if name in policy.special_tokens.required:
                out.append(finding("TS1001", where, f"{name}_token is not defined", key=f"{name}_token"))
        elif ft.vocabulary is not None and value not in ft.vocabulary:
            out.append(
                finding("TS1002", where, f"{name}_token {value!r} is not in the vocabulary", key=f"{name}_token")
            )
    pad, eos = tokens.get("pad"), tokens.get("eos")
    if policy.special_tokens.pad_distinct_from_eos and pad and pad == eos:
        out.append(finding("TS1003", where, f"pad_token and eos_token are both {pad!r}", key="pad_token"))
    return out
