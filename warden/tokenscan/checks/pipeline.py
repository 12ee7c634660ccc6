"""Checks 13-14: every pipeline rule and vocabulary-wide invariant of every tokenizer file the
loader reads (:mod:`..pipeline_rules`), vocabulary files of slow layouts (``merges.txt``,
``vocab.json``-only, ``tiktoken.model``, ``tekken.json``), ``generation_config.json`` beside
the tokenizer, and the files a loader reads that no check understands (:mod:`..loader_files`)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from typing import Any

from warden.tokenscan import encoding_settings as es
from warden.tokenscan import loader_files as lf
from warden.tokenscan import pipeline_rules as pr
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.checks.common import basename, short
from warden.tokenscan.declared import token
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

RULE_OF_KIND = {"rule": "TS1209", "unknown": "TS910", "collision": "TS1210", "folding": "TS1211", "template": "TS1212",
                "order": "TS1205", "structure": "TS1213", "unreachable": "TS1214"}  # fmt: skip
Bounds = tuple[type | tuple[type, ...], float, float]
GENERATION_ALLOWED: dict[str, Bounds] = {
    "temperature": ((int, float), 0.0, 2.0), "top_p": ((int, float), 0.0, 1.0), "top_k": (int, 0, 1000),
    "min_p": ((int, float), 0.0, 1.0), "typical_p": ((int, float), 0.0, 1.0), "do_sample": (bool, 0, 1),
    "repetition_penalty": ((int, float), 0.9, 1.5), "length_penalty": ((int, float), 0.0, 2.0),
    "num_beams": (int, 1, 16), "num_return_sequences": (int, 1, 16), "max_new_tokens": (int, 32, 1 << 24),
    "max_length": (int, 64, 1 << 24), "min_new_tokens": (int, 0, 1), "min_length": (int, 0, 1),
    "no_repeat_ngram_size": (int, 0, 0), "use_cache": (bool, 0, 1), "_from_model_config": (bool, 0, 1),
    "transformers_version": (str, 0, 32), "early_stopping": (bool, 0, 1), "num_beam_groups": (int, 1, 1),
    "diversity_penalty": ((int, float), 0.0, 0.0), "output_scores": (bool, 0, 1),
    "return_dict_in_generate": (bool, 0, 1), "output_attentions": (bool, 0, 1),
    "output_hidden_states": (bool, 0, 1), "cache_implementation": (str, 0, 32),
}  # fmt: skip
"""generation_config.json keys a vendor ships, each with its type and allowed range (strings:
length). Any other key, or a value outside its range, is a finding: an allow-list, so a field
this scanner does not know (a new logits processor) is never clean."""
GENERATION_FORCING = ("suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
                      "forced_decoder_ids", "bad_words_ids", "force_words_ids", "sequence_bias", "logit_bias",
                      "token_healing", "watermarking_config", "stop_strings", "constraints", "guidance_scale",
                      "exponential_decay_length_penalty", "renormalize_logits", "remove_invalid_values",
                      "epsilon_cutoff", "eta_cutoff", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
                      "assistant_model", "prompt_lookup_num_tokens", "max_time", "stop_after")  # fmt: skip
"""Keys known to suppress, force, bias or cut generation (TS1301); other unknown keys are TS910."""
MAX_GENERATION_IDS = 1024  # ids of one generation_config key judged (more: not analysed, TS910)
GENERATION_IDS = ("eos_token_id", "bos_token_id", "pad_token_id", "decoder_start_token_id")


def _folder_doc(snap: Snapshot, rel: str, name: str) -> dict[str, Any] | None:
    doc = snap.json.get(lf._join(os.path.dirname(rel), name))
    return doc.data if doc is not None and isinstance(doc.data, dict) else None


def _decoder_ids(config: dict[str, Any] | None) -> dict[int, str]:
    decoder = (config or {}).get("added_tokens_decoder")
    out: dict[int, str] = {}
    if isinstance(decoder, dict):
        for key, value in decoder.items():
            text = token(value)
            if text and str(key).isascii() and str(key).isdigit() and len(str(key)) < 10:
                out[int(key)] = text
    return out


def _added_json_ids(doc: dict[str, Any] | None) -> dict[int, str]:
    """added_tokens.json (token -> id; the slow tokenizers' legacy file) as id -> token."""
    return {i: str(t) for t, i in (doc or {}).items() if type(i) is int}


def _tokenizers(snap: Snapshot) -> list[tuple[str, dict[str, Any]]]:
    return [(rel, d.data) for rel, d in sorted(snap.json.items()) if pr.looks_like_tokenizer(d.data)]


def _issues_of(snap: Snapshot, rel: str, tok: dict[str, Any]) -> list[Any]:
    """:func:`~.pipeline_rules.tokenizer_issues` of the tokenizer ``rel`` with what its folder's
    config adds (the loader's extra ids and normaliser rules)."""
    config = _folder_doc(snap, rel, "tokenizer_config.json")
    extra = _decoder_ids(config) | _added_json_ids(_folder_doc(snap, rel, "added_tokens.json"))
    return pr.tokenizer_issues(tok, extra, loader_normaliser(config), config)


def judge_pipelines(snap: Snapshot, judged: Any) -> None:
    """Fills ``snap.pipeline_issues``, each tokenizer's judged once per content and config
    (``judged``: the scan resources' cache; a vocabulary-wide pass costs tens of ms)."""
    for rel, tok in _tokenizers(snap):
        config = _folder_doc(snap, rel, "tokenizer_config.json")
        digest = snap.digests.get(rel)
        if not digest:
            continue
        what = [digest, config, _folder_doc(snap, rel, "added_tokens.json")]
        key = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
        snap.pipeline_issues[rel] = judged.get_or_make(("pipeline", key), lambda r=rel, t=tok: _issues_of(snap, r, t))


def check_pipeline(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for rel, tok in _tokenizers(snap):
        config = _folder_doc(snap, rel, "tokenizer_config.json")
        issues = snap.pipeline_issues.get(rel)
        for issue in issues if issues is not None else _issues_of(snap, rel, tok):
            if issue.kind == "order" and not policy.behaviour.bpe_ids_follow_merges:
                continue  # the operator reviewed this vocabulary's id order (TS1205's documented switch)
            out.append(finding(RULE_OF_KIND[issue.kind], rel, f"{issue.where}: {issue.detail}"))
        out += _config_folding(rel, tok, config)
        if rel != "tokenizer.json":  # the root's is judged with the behaviour (exercise.py)
            model: dict[str, Any] = tok["model"] if isinstance(tok.get("model"), dict) else {}
            problem = tbe.merge_order_problem(model) or tbe.score_order_problem(model)
            if problem and policy.behaviour.bpe_ids_follow_merges:
                out.append(finding("TS1205", rel, problem))
    out += _slow_vocabularies(snap, policy)
    return out


def loader_normaliser(config: dict[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """The normaliser a BERT-style class rebuilds from the config (transformers 5's BertTokenizer:
    ``BertNormalizer(lowercase=do_lower_case, strip_accents=strip_accents)``), when it folds: judged
    with the file's own for entries it makes unreachable (a cased vocabulary with do_lower_case)."""
    lower, strip = (config or {}).get("do_lower_case") is True, (config or {}).get("strip_accents")
    strip = strip if isinstance(strip, bool) else None  # None: accents stripped where it lowercases
    folds = lower or strip is True
    return ({"type": "BertNormalizer", "lowercase": lower, "strip_accents": strip},) if folds else ()


def _config_folding(rel: str, tok: dict[str, Any], config: dict[str, Any] | None) -> list[Finding]:
    """``added_tokens_decoder`` of the config marks a special or markup token ``normalized: true``
    (the loader builds its added tokens from it) under a normaliser of the tokenizer that folds
    other user text into that token (:func:`..pipeline_rules.folding_rules`)."""
    decoder = (config or {}).get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return []
    where = lf._join(os.path.dirname(rel), "tokenizer_config.json")
    out = []
    for value in decoder.values():
        text = token(value)
        if not (isinstance(value, dict) and value.get("normalized") and text):
            continue
        if not (value.get("special") or pr.MARKUP_CHARS.intersection(text)):
            continue
        folds = pr.folding_rules(tok, text)
        if folds:
            what = "special" if value.get("special") else "markup token"
            detail = f"added_tokens_decoder: {what} {text!r} is normalized under {', '.join(sorted(set(folds)))}"
            out.append(finding("TS1211", where, detail))
    return out


def _merges(lines: tuple[str, ...]) -> list[str]:
    return [line for line in lines if line and not line.startswith("#version")]


def _slow_vocabularies(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """merges.txt against tokenizer.json's merges; a vocab.json + merges.txt layout in merge
    order; vocab.txt / vocab.json against the folder's tokenizer.json below the root; tiktoken
    and tekken ranks in id order."""
    out = []
    for rel, lines in sorted(snap.vocab_lines.items()):
        folder, name = os.path.split(rel)
        tok = _folder_doc(snap, rel, "tokenizer.json")
        model = tok.get("model") if tok and isinstance(tok.get("model"), dict) else None
        if name == "merges.txt":
            merges = _merges(lines)
            if model is not None and isinstance(model.get("merges"), list):
                theirs = [" ".join(map(str, m)) if isinstance(m, list) else str(m) for m in model["merges"]]
                if theirs != merges:
                    pairs = enumerate(zip(theirs, merges, strict=False))
                    differ = next((i for i, (a, b) in pairs if a != b), min(len(theirs), len(merges)))
                    out.append(finding("TS1205", rel, f"merges.txt and tokenizer.json differ from merge {differ} on"))
            vocab = _folder_doc(snap, rel, "vocab.json")
            if vocab is not None and policy.behaviour.bpe_ids_follow_merges:
                problem = tbe.merge_order_problem({"type": "BPE", "vocab": vocab, "merges": merges})
                if problem:
                    out.append(finding("TS1205", rel, f"with vocab.json: {problem}"))
            byte_level = vocab is not None and "\u0120" in vocab and policy.behaviour.bpe_ids_follow_merges
            if byte_level and vocab is not None and (problem := pr.byte_alphabet_problem(vocab)):
                out.append(finding("TS1205", lf._join(folder, "vocab.json"), problem))  # a byte-level vocab.json
        elif name == "vocab.txt" and folder and isinstance((model or {}).get("vocab"), dict):
            found = tbe.vocab_disagreement(model["vocab"], tbe.vocab_txt_ids(lines), "vocab.txt")  # type: ignore[index]
            if found:
                out.append(finding("TS1205", rel, found))
        elif name.endswith(".model"):
            out += _tiktoken(rel, lines)
    for rel, doc in sorted(snap.json.items()):
        if basename(rel) == "vocab.json" and os.path.dirname(rel) and isinstance(doc.data, dict):
            tok = _folder_doc(snap, rel, "tokenizer.json")
            vocab = (tok or {}).get("model", {}).get("vocab") if isinstance((tok or {}).get("model"), dict) else None
            if isinstance(vocab, dict) and (found := tbe.vocab_disagreement(vocab, doc.data, "vocab.json")):
                out.append(finding("TS1205", rel, found))
        elif basename(rel) == "tekken.json" and isinstance(doc.data, dict):
            out += _tekken(rel, doc.data)
    return out


def _tiktoken(rel: str, lines: tuple[str, ...]) -> list[Finding]:
    """``tiktoken.model``: ``base64 rank`` per line, ranks 0, 1, 2... (the id of each token)."""
    seen: set[bytes] = set()
    for i, line in enumerate(x for x in lines if x.strip()):
        parts = line.split()
        try:
            raw, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (IndexError, ValueError, binascii.Error):
            return [finding("TS910", rel, f"line {i + 1} is not 'base64 rank': not analysed")]
        if rank != i or raw in seen:
            return [finding("TS1205", rel, f"token {short(raw, 30)} has rank {rank} at line {i + 1}: ids not in order")]
        seen.add(raw)
    return []


def _tekken(rel: str, data: dict[str, Any]) -> list[Finding]:
    vocab = data.get("vocab")
    if not isinstance(vocab, list):
        return [finding("TS910", rel, "tekken.json without a vocab list: not analysed")]
    for i, entry in enumerate(vocab):
        if not isinstance(entry, dict) or entry.get("rank") != i:
            return [finding("TS1205", rel, f"vocab entry {i} has rank {short(entry, 40)}: ids not in order")]
    return []


def _special_ids(snap: Snapshot, rel: str) -> tuple[dict[int, str], dict[int, str]] | None:
    """(special added id -> text, vocab id -> entry) of the tokenizer.json beside ``rel`` or above it."""
    folder = os.path.dirname(rel)
    while True:
        tok = snap.json.get(lf._join(folder, "tokenizer.json"))
        if tok is not None and pr.looks_like_tokenizer(tok.data):
            specials = {
                a["id"]: str(a.get("content"))
                for a in pr._added(tok.data)
                if a.get("special") and type(a.get("id")) is int
            }
            return specials, pr._vocab_ids(tok.data.get("model"))
        if not folder:
            return None
        folder = os.path.dirname(folder)


def _ids(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _generation_value(key: str, value: Any) -> str | None:
    """Why ``value`` of the allow-listed ``key`` is outside its type or range, or None."""
    kind, low, high = GENERATION_ALLOWED[key]
    if value is None:
        return None
    if (kind is not bool and type(value) is bool) or not isinstance(value, kind):
        return f"{key} = {short(value, 40)} is not of the expected type"
    size = len(value) if isinstance(value, str) else float(value) if isinstance(value, (int, float)) else 0.0
    if not low <= size <= high:
        return f"{key} = {short(value, 40)} is outside the allowed {low:g}..{high:g}"
    return None


def _generation_keys(rel: str, data: dict[str, Any]) -> list[Finding]:
    out = []
    for key, value in sorted(data.items(), key=lambda kv: str(kv[0])):
        if key in GENERATION_IDS:
            continue
        if key in GENERATION_ALLOWED:
            why = _generation_value(key, value)
            if why:
                out.append(finding("TS1301", rel, why, key=key))
        elif key in GENERATION_FORCING:
            if value not in (None, [], {}, False):
                out.append(finding("TS1301", rel, f"{key} = {short(value, 60)}", key=key))
        else:
            out.append(finding("TS910", rel, f"key {short(key, 40)} is not a known generation setting: not analysed"))
    return out


def _generation_ids(rel: str, data: dict[str, Any], known: tuple[dict[int, str], dict[int, str]]) -> list[Finding]:
    """eos/bos/pad/decoder-start ids: integers naming special added tokens of the tokenizer."""
    specials, vocab = known
    out = []
    for key in GENERATION_IDS:
        ids = _ids(data.get(key))
        if len(ids) > MAX_GENERATION_IDS:  # a bounded read says what it left
            out.append(
                finding("TS910", rel, f"{key} lists {len(ids)} ids: past {MAX_GENERATION_IDS} not analysed", key=key)
            )
        for ident in ids[:MAX_GENERATION_IDS]:
            if ident is None:
                continue
            if type(ident) is not int:
                out.append(finding("TS1301", rel, f"{key} {short(ident, 30)} is not a token id", key=key))
            elif ident in vocab and ident not in specials:
                out.append(finding("TS1301", rel, f"{key} {ident} is the ordinary entry {vocab[ident]!r}", key=key))
            elif ident not in specials:
                out.append(finding("TS1301", rel, f"{key} {ident} is no token of the tokenizer", key=key))
    return out


def _chat_room(rel: str, data: dict[str, Any], chat: bool) -> list[Finding]:
    """With a chat template, ``max_length`` (prompt and answer together) is at least what
    ``model_max_length`` must be for a chat model: a chat prompt alone (a default system prompt,
    the tools) fills less, and nothing is generated past it."""
    value = data.get("max_length")
    floor = es.MIN_CHAT_MODEL_MAX_LENGTH
    if not chat or type(value) is not int or value >= floor:
        return []
    why = f"max_length = {value} is below {floor} with a chat template: a chat prompt leaves no room to answer"
    return [finding("TS1301", rel, why, key="max_length")]


def check_generation_config(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """generation_config.json beside a tokenizer: only allow-listed keys within their ranges
    (:data:`GENERATION_ALLOWED`; suppressing, forcing, biasing, cutting keys are TS1301, unknown
    keys TS910); its eos/bos/pad/decoder-start ids are special tokens of that tokenizer."""
    out = []
    for rel, doc in sorted(snap.json.items()):
        if basename(rel) != "generation_config.json" or not isinstance(doc.data, dict):
            continue
        out += _generation_keys(rel, doc.data)
        out += _chat_room(rel, doc.data, any(t.text for t in snap.templates))
        known = _special_ids(snap, rel)
        if known is not None:
            out += _generation_ids(rel, doc.data, known)
    return out


def _understood(snap: Snapshot, f: lf.LoaderFile, links: set[str]) -> str | None:
    """Why no check understands file ``f`` the loader reads, or None (``links``: names that are
    not regular files; the link checks judge those)."""
    facts = snap.facts.get(f.rel)
    doc = snap.json.get(f.rel)
    if facts is None:
        return None if f.rel in links else "it was not read"
    if facts.over_cap is not None or facts.spm_error or facts.problems or (doc is not None and doc.error):
        return None  # that file has a finding of its own
    if f.role in ("config", "added_tokens", "generation", "template_json", "vocab_json", "tekken"):
        return None if doc is not None and isinstance(doc.data, dict) else "it is not a JSON object"
    if f.role == "template":
        return None if any(t.rel == f.rel for t in snap.templates) else "it is not a chat template"
    if f.role == "tokenizer":
        if doc is None or not pr.looks_like_tokenizer(doc.data):
            return "it is not a tokenizers serialisation"
        return None if f.rel in snap.tokenizer_files else "it was not exercised"
    if f.role in ("merges", "vocab_txt"):
        return None if f.rel in snap.vocab_lines else "it was not read as a vocabulary"
    if f.role == "model":
        return None if f.rel in snap.tokenizer_files or f.rel in snap.vocab_lines else "it is no known model format"
    return f"role {f.role} has no check"


def check_loader_files(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """Every file a loader reads is understood by some check (else analysis incomplete, TS910);
    where tokenizer_config.json and special_tokens_map.json disagree, TS1006."""
    names = [e.rel for e in snap.entries if e.kind in ("file", "symlink")]
    configs = {rel: d.data for rel, d in snap.json.items() if basename(rel) == "tokenizer_config.json"}
    links = {e.rel for e in snap.entries if e.kind != "file"}
    unanalysed = dict(snap.unanalysed)
    out = []
    for f in lf.resolve(names, configs):
        why = _understood(snap, f, links) if f.rel not in unanalysed else None
        if why:
            loaders = ", ".join(f.loaders)
            out.append(finding("TS910", f.rel, f"transformers {loaders} read this {f.role} file, but {why}"))
    for rel, config in sorted(configs.items()):
        smap = _folder_doc(snap, rel, "special_tokens_map.json")
        if not isinstance(config, dict) or smap is None:
            continue
        for key, winner in sorted(lf.special_token_sources(config, smap).items()):
            mine, theirs = token(config.get(key)), token(smap.get(key))
            if mine != theirs:
                detail = (
                    f"{key} is {mine!r} in tokenizer_config.json, {theirs!r} in special_tokens_map.json ({winner} wins)"
                )
                out.append(finding("TS1006", rel, detail, key=key))
    return out
