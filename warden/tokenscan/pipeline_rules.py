"""Every rule of a ``tokenizer.json`` pipeline judged statically, by type (pure).

:data:`JUDGES` is the one table: for each section (normalizer, pre_tokenizer, decoder,
post_processor) it maps a rule ``type`` to the function judging one rule of that type. A rule
may change whitespace, metaspace, the byte-level alphabet and Unicode normal forms (NFC/NFD/
NFKC/NFKD, case, accents); a rule that can change, remove or insert letters, digits or words
is an issue, whatever the corpus holds (a single-character ``Replace``, a ``Split`` that
``Removed`` words, a decoder that strips a letter prefix). A type missing from the table is
``unknown`` (the analysis is incomplete, never clean). Patterns are judged from their source
text: no regular expression of the file is compiled or run in this process.

Vocabulary-wide invariants are here too (:func:`vocabulary_issues`): an ordinary entry sharing
a special token's id, special tokens matched after a normaliser that folds look-alikes into
them (``normalized: true`` under NFKC/lowercase), post-processor templates whose tokens are
not special added tokens (a pair template inserting words before every response).
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from warden.tokenscan.charsmap import charsmap_problem

MAX_RULES = 256
MAX_DEPTH = 8


@dataclass(frozen=True)
class PipelineIssue:
    """``kind``: rule (a rule rewrites text), unknown (a rule type no judge knows), collision (an
    ordinary entry shares a special id), folding (a special token matched after folding),
    template (a post-processor inserts ordinary tokens)."""

    kind: str
    where: str
    detail: str


Judge = Callable[[Mapping[str, Any]], str | None]  # why the rule rewrites text, or None


# -- what a pattern or a text may contain -------------------------------------------------------
_SAFE_TEXT = frozenset(" \t\n\r\f\v\u2581\u0120\u010a")  # whitespace, metaspace, byte-level space/newline


def _wordy(text: Any) -> str | None:
    """The first letter or digit of ``text`` (a replacement, a prefix), or None."""
    if not isinstance(text, str):
        return None
    return next((ch for ch in text if ch.isalnum() or unicodedata.category(ch)[0] in "LN"), None)


def _only_space(text: Any) -> bool:
    return isinstance(text, str) and all(ch in _SAFE_TEXT or ch.isspace() for ch in text)


_ESCAPE_RE = re.compile(
    r"\\(x\{[0-9A-Fa-f]+\}|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|p\{[^}]*\}|P\{[^}]*\}|p[A-Za-z]|.)", re.S
)
_SPACE_ESCAPES = frozenset("stnrfvhRX")  # \s \t \n \r \f \v \h (oniguruma); \R newline; \X is refused below
_WIDE_ESCAPES = frozenset("wWdDSbBAzZGkKgpP")


def pattern_matches_words(pattern: Any) -> str | None:
    """Why a Replace/Split pattern (``{"String": ...}`` or ``{"Regex": ...}``) may match a letter
    or digit, or None when it matches only whitespace, metaspace or punctuation. Conservative:
    ``.``, negated classes, ranges, word/digit classes and any escape it does not know count as
    matching letters."""
    if not isinstance(pattern, dict) or len(pattern) != 1:
        return "a pattern that is neither String nor Regex"
    kind, source = next(iter(pattern.items()))
    if not isinstance(source, str):
        return "a pattern that is not a string"
    if kind == "String":
        ch = _wordy(source)
        return f"the pattern {source[:40]!r} contains {ch!r}" if ch else None
    if kind != "Regex":
        return f"a pattern of kind {kind!r}"
    return _regex_matches_words(source)


def _regex_matches_words(source: str) -> str | None:
    rest = source
    for m in _ESCAPE_RE.finditer(source):
        esc = m.group(1)
        if esc[0] in ("x", "u") and len(esc) > 1:
            code = esc[2:-1] if esc.startswith("x{") else esc[1:]
            ch = chr(int(code, 16)) if int(code, 16) <= 0x10FFFF else "?"
            if _wordy(ch):
                return f"the pattern escapes a letter or digit ({m.group(0)})"
        elif esc[0] in _WIDE_ESCAPES or (esc[0].isalnum() and esc[0] not in _SPACE_ESCAPES):
            return f"the pattern uses {m.group(0)!r} (may match letters or digits)"
    rest = _ESCAPE_RE.sub("", source)
    rest = re.sub(r"\{[0-9]*,?[0-9]*\}", "", rest)  # quantifiers {2,}
    if "." in rest:
        return "the pattern uses '.' (matches letters)"
    if "[^" in rest or re.search(r"[^\\]-[^\]]", rest.split("[", 1)[1] if "[" in rest else ""):
        return "the pattern uses a negated class or a range (may match letters)"
    if "(?" in rest and re.search(r"\(\?[^:=!<]", rest):
        return "the pattern uses a group flag or construct this judge does not know"
    letter = _wordy(rest)
    return f"the pattern {source[:40]!r} matches {letter!r}" if letter else None


# -- judges, one per rule type ------------------------------------------------------------------
def _ok(_rule: Mapping[str, Any]) -> str | None:
    return None


def _replace(rule: Mapping[str, Any]) -> str | None:
    why = pattern_matches_words(rule.get("pattern"))
    if why:
        return f"Replace: {why}"
    ch = _wordy(rule.get("content"))
    return f"Replace inserts {str(rule.get('content'))[:40]!r} ({ch!r})" if ch else None


def _affix(field: str) -> Judge:
    def judge(rule: Mapping[str, Any]) -> str | None:
        value = rule.get(field)
        return None if value is None or _only_space(value) else f"{rule.get('type')} adds {str(value)[:40]!r}"

    return judge


def _metaspace(rule: Mapping[str, Any]) -> str | None:
    rep = rule.get("replacement", "\u2581")
    if not isinstance(rep, str) or len(rep) != 1 or _wordy(rep):
        return f"Metaspace replacement {rep!r} is not one non-letter character"
    return None


def _split(rule: Mapping[str, Any]) -> str | None:
    behavior = str(rule.get("behavior", "")).lower()
    if behavior != "removed":
        return None  # Isolated, Merged*, Contiguous only split: every character is kept
    if rule.get("invert"):
        return "Split removes everything its pattern does not match (invert with behavior Removed)"
    why = pattern_matches_words(rule.get("pattern"))
    return f"Split with behavior Removed deletes words: {why}" if why else None


def _delimiter(rule: Mapping[str, Any]) -> str | None:
    ch = rule.get("delimiter")
    return f"CharDelimiterSplit removes {ch!r} from the text" if _wordy(ch) else None


def _strip(rule: Mapping[str, Any]) -> str | None:
    content = rule.get("content", " ")
    return None if _only_space(content) else f"Strip decoder removes {str(content)[:20]!r} from tokens"


def _wordpiece_decoder(rule: Mapping[str, Any]) -> str | None:
    prefix = rule.get("prefix", "##")
    return None if not _wordy(prefix) else f"WordPiece decoder strips the prefix {prefix!r} (letters) from tokens"


def _bpe_decoder(rule: Mapping[str, Any]) -> str | None:
    suffix = rule.get("suffix", "</w>")
    if isinstance(suffix, str) and suffix and not all(ch.isalnum() for ch in suffix):
        return None  # '</w>': never the end of an ordinary word
    return f"BPEDecoder suffix {suffix!r} can be the end of an ordinary word (removed as a space)"


def _ctc(_rule: Mapping[str, Any]) -> str | None:
    return "CTC decoder collapses repeated tokens and drops its pad token (a speech decoder on text)"


def _precompiled(rule: Mapping[str, Any]) -> str | None:
    """Sentencepiece's charsmap decoded (:mod:`.charsmap`), every mapping judged."""
    raw = rule.get("precompiled_charsmap")
    if raw is None or raw == "":
        return None  # an empty map: the identity
    if not isinstance(raw, str):
        return "Precompiled charsmap is not a base64 string"
    try:
        blob = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return "Precompiled charsmap is not valid base64"
    return charsmap_problem(blob)


def _bert_normalizer(rule: Mapping[str, Any]) -> str | None:
    return None  # clean_text (controls, whitespace), Chinese spacing, lowercase, accents: all allowed


def _sequence(_rule: Mapping[str, Any]) -> str | None:
    return None  # its children are judged one by one


def _processor(rule: Mapping[str, Any]) -> str | None:
    return None  # the tokens it adds are judged by template_issues


JUDGES: dict[str, dict[str, Judge]] = {
    "normalizer": {
        "NFC": _ok, "NFD": _ok, "NFKC": _ok, "NFKD": _ok, "Lowercase": _ok, "StripAccents": _ok,
        "Strip": _ok, "Nmt": _ok, "BertNormalizer": _bert_normalizer, "ByteLevel": _ok,
        "Precompiled": _precompiled, "Replace": _replace, "Prepend": _affix("prepend"), "Append": _affix("append"),
        "Sequence": _sequence,
    },
    "pre_tokenizer": {
        "ByteLevel": _ok, "Whitespace": _ok, "WhitespaceSplit": _ok, "BertPreTokenizer": _ok,
        "Punctuation": _ok, "Digits": _ok, "UnicodeScripts": _ok, "Metaspace": _metaspace,
        "Split": _split, "CharDelimiterSplit": _delimiter, "FixedLength": _ok, "Sequence": _sequence,
    },
    "decoder": {
        "ByteLevel": _ok, "Metaspace": _metaspace, "ByteFallback": _ok, "Fuse": _ok, "Strip": _strip,
        "Replace": _replace, "WordPiece": _wordpiece_decoder, "BPEDecoder": _bpe_decoder, "CTC": _ctc,
        "Sequence": _sequence,
    },
    "post_processor": {
        "TemplateProcessing": _processor, "BertProcessing": _processor, "RobertaProcessing": _processor,
        "ByteLevel": _ok, "Sequence": _sequence,
    },
}  # fmt: skip
"""Section -> rule type -> judge. ``Precompiled`` is sentencepiece's compiled map, decoded."""

_CHILDREN = ("normalizers", "pretokenizers", "decoders", "processors")


def rules(tok: Mapping[str, Any], section: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, rule) of every rule of ``section``, Sequences flattened (bounded depth and count)."""
    stack: list[tuple[str, Any, int]] = [(section, tok.get(section), 0)]
    count = 0
    while stack and count < MAX_RULES:
        where, node, depth = stack.pop()
        if node is None:
            continue
        count += 1
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            yield where, {"type": f"<{type(node).__name__} at depth {depth}>"}
            continue
        yield where, node
        for key in _CHILDREN:
            if isinstance(node.get(key), list):
                stack += [(f"{where}.{key}[{i}]", child, depth + 1) for i, child in enumerate(node[key])][::-1]
    if stack:
        yield section, {"type": f"<more than {MAX_RULES} rules>"}


def rule_issues(tok: Mapping[str, Any]) -> list[PipelineIssue]:
    """Every normaliser, pre-tokenizer, decoder and post-processor rule through :data:`JUDGES`."""
    out = []
    for section, table in JUDGES.items():
        for where, rule in rules(tok, section):
            kind = rule.get("type")
            judge = table.get(kind) if isinstance(kind, str) else None
            if judge is None:
                out.append(PipelineIssue("unknown", where, f"{section} rule type {kind!r} is not judged"))
            elif why := judge(rule):
                out.append(PipelineIssue("rule", where, why))
    out += _model_issues(tok.get("model"))
    return out


def _model_issues(model: Any) -> list[PipelineIssue]:
    if not isinstance(model, dict):
        return [PipelineIssue("unknown", "model", "no model object")]
    kind = model.get("type")
    if kind not in ("BPE", "WordPiece", "WordLevel", "Unigram", None):
        return [PipelineIssue("unknown", "model", f"model type {kind!r} is not judged")]
    dropout = model.get("dropout")
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and dropout > 0:
        return [PipelineIssue("rule", "model", f"BPE dropout {dropout}: the same text encodes differently each time")]
    prefix = model.get("continuing_subword_prefix")
    if kind == "WordPiece" and isinstance(prefix, str) and _wordy(prefix):
        return [PipelineIssue("rule", "model", f"WordPiece subword prefix {prefix!r} holds letters")]
    return []


# -- vocabulary-wide invariants ----------------------------------------------------------------
FOLDING = frozenset({"NFKC", "NFKD", "Lowercase", "Precompiled", "StripAccents", "Replace", "Prepend", "Append"})


def folding_rules(tok: Mapping[str, Any]) -> list[str]:
    """Normaliser rules that can map different text onto a special token's text (compatibility
    forms, case, accents, replacements)."""
    out = []
    for _where, rule in rules(tok, "normalizer"):
        kind = rule.get("type")
        if kind in FOLDING or (kind == "BertNormalizer" and (rule.get("lowercase", True) or rule.get("strip_accents"))):
            out.append(str(kind))
    return out


def _vocab_entries(model: Any) -> Iterator[tuple[str, int]]:
    """(entry, id) of every entry of the model's vocabulary (a dict, or Unigram's list)."""
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        yield from ((str(t), i) for t, i in vocab.items() if type(i) is int)
    elif isinstance(vocab, list):
        yield from ((str(e[0]), i) for i, e in enumerate(vocab) if isinstance(e, list) and e)


def _special_id_entries(model: Any, specials: Mapping[int, str]) -> list[tuple[str, int]]:
    """Vocabulary entries other than the special token itself that hold a special token's id
    (one pass over a dict vocabulary; direct lookups in Unigram's list)."""
    vocab = model.get("vocab") if isinstance(model, dict) and specials else None
    if isinstance(vocab, dict):
        ids = [i for i in vocab.values() if type(i) is int]
        shared = specials.keys() & set(ids)  # C-level passes; the loop below is rare
        counts = Counter(ids) if shared else Counter()
        if all(counts[i] == 1 and vocab.get(specials[i]) == i for i in shared):
            return []
        return [(str(t), i) for t, i in vocab.items() if i in shared and specials[i] != t]
    if isinstance(vocab, list):
        out = []
        for ident, text in specials.items():
            entry = vocab[ident] if 0 <= ident < len(vocab) else None
            if isinstance(entry, list) and entry and str(entry[0]) != text:
                out.append((str(entry[0]), ident))
        return out
    return []


def _vocab_ids(model: Any) -> dict[int, str]:
    """id -> entry of the model's vocabulary (the first entry per id)."""
    out: dict[int, str] = {}
    for text, ident in _vocab_entries(model):
        out.setdefault(ident, text)
    return out


def _added(tok: Mapping[str, Any]) -> list[dict[str, Any]]:
    added = tok.get("added_tokens")
    return [a for a in added if isinstance(a, dict)] if isinstance(added, list) else []


def vocabulary_issues(tok: Mapping[str, Any], extra_ids: Mapping[int, str] | None = None) -> list[PipelineIssue]:
    """Ordinary entries sharing a special token's id (``extra_ids``: id -> token from another file
    of the loader, ``added_tokens_decoder``), special tokens matched after folding, and
    post-processor templates adding tokens that are not special added tokens."""
    out = []
    model = tok.get("model")
    specials: dict[int, str] = {}
    seen_ids: dict[int, str] = {}
    folds = folding_rules(tok)
    for a in _added(tok):
        ident, content = a.get("id"), a.get("content")
        if type(ident) is not int or not isinstance(content, str):
            continue
        if ident in seen_ids and seen_ids[ident] != content:
            out.append(
                PipelineIssue("collision", "added_tokens", f"{content!r} and {seen_ids[ident]!r} share id {ident}")
            )
        seen_ids.setdefault(ident, content)
        if not a.get("special"):
            continue
        specials[ident] = content
        if a.get("normalized") and folds:
            folded = ", ".join(sorted(set(folds)))
            detail = f"special {content!r} is matched after the normaliser ({folded}): look-alike text becomes it"
            out.append(PipelineIssue("folding", "added_tokens", detail))
    for entry, ident in _special_id_entries(model, specials):
        detail = f"ordinary entry {entry!r} has special {specials[ident]!r}'s id {ident}"
        out.append(PipelineIssue("collision", "model.vocab", detail))
    by_id = _vocab_ids(model) if extra_ids else {}
    for ident, other in (extra_ids or {}).items():
        known = seen_ids.get(ident, by_id.get(ident))
        if known is not None and known != other:
            detail = f"id {ident} is {known!r} here and {other!r} in the loader's other file"
            out.append(PipelineIssue("collision", "added_tokens", detail))
    out += template_issues(tok.get("post_processor"), specials)
    return out


def _template_tokens(node: Mapping[str, Any]) -> Iterator[str]:
    for key in ("single", "pair"):
        pieces = node.get(key)
        for piece in pieces[:MAX_RULES] if isinstance(pieces, list) else []:
            special = piece.get("SpecialToken") if isinstance(piece, dict) else None
            if isinstance(special, dict):
                yield str(special.get("id"))


def template_issues(processor: Any, specials: Mapping[int, str]) -> list[PipelineIssue]:
    """Post-processors may add only special added tokens: every ``TemplateProcessing`` token (of
    the single and the pair template) maps to exactly one id, that of a special added token of
    the same text; Bert/Roberta processors' cls/sep too."""
    out: list[PipelineIssue] = []
    special_text = {v: k for k, v in specials.items()}
    stack: list[tuple[Any, int]] = [(processor, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            continue
        kind = node.get("type")
        if kind == "Sequence" and isinstance(node.get("processors"), list):
            stack += [(p, depth + 1) for p in node["processors"][:MAX_RULES]]
        elif kind == "TemplateProcessing":
            table: dict[str, Any] = node["special_tokens"] if isinstance(node.get("special_tokens"), dict) else {}
            for name in sorted(set(_template_tokens(node))):
                spec = table.get(name)
                ids = spec.get("ids") if isinstance(spec, dict) else None
                ok = isinstance(ids, list) and len(ids) == 1 and type(ids[0]) is int and specials.get(ids[0]) == name
                if not ok:
                    out.append(
                        PipelineIssue(
                            "template",
                            "post_processor",
                            f"template token {name!r} (ids {ids}) is not one special added token",
                        )
                    )
        elif kind in ("BertProcessing", "RobertaProcessing"):
            for key in ("cls", "sep"):
                pair = node.get(key)
                if not (isinstance(pair, list) and len(pair) == 2 and special_text.get(str(pair[0])) == pair[1]):
                    out.append(
                        PipelineIssue(
                            "template", "post_processor", f"{kind} {key} {pair!r} is not a special added token"
                        )
                    )
    return out


def tokenizer_issues(tok: Mapping[str, Any], extra_ids: Mapping[int, str] | None = None) -> list[PipelineIssue]:
    """:func:`rule_issues` and :func:`vocabulary_issues` of one parsed tokenizer.json."""
    return rule_issues(tok) + vocabulary_issues(tok, extra_ids)


def looks_like_tokenizer(data: Any) -> bool:
    """Whether a parsed JSON document is a ``tokenizers`` serialisation (whatever its name:
    ``fast_tokenizer_files`` may point the loader at ``tokenizer.4.0.json``)."""
    return isinstance(data, dict) and isinstance(data.get("model"), dict) and "added_tokens" in data
