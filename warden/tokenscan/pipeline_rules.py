"""Every rule of a ``tokenizer.json`` pipeline judged statically, by type (pure).

:data:`JUDGES` is the one table: for each section (normalizer, pre_tokenizer, decoder,
post_processor) it maps a rule ``type`` to the function judging one rule of that type. A rule
may change whitespace, metaspace, the byte-level alphabet and Unicode normal forms (NFC/NFD/
NFKC/NFKD, case, accents); a rule that can rewrite, remove or insert any other character of user
text (a letter, a digit, a currency sign, punctuation) is an issue, whatever a corpus holds: a
``Replace`` or ``Split Removed`` is judged by the set of characters its pattern can match and its
content can write (:func:`pattern_reaches_text`: only whitespace and metaspace are allowed), so
``'$' -> '€'`` or a decoder deleting ``'%'`` is a finding like one deleting ``not``. A type missing
from the table is ``unknown`` (the analysis is incomplete, never clean). Patterns are judged from
their source text: no regular expression of the file is compiled or run in this process.

Vocabulary-wide invariants are here too (:func:`vocabulary_issues`): an ordinary entry sharing
a special token's id; a ``normalized: true`` special token that some other user text normalises
into (:func:`folding_rules`, per token and per rule: a rule that deletes characters, as
``clean_text`` and ``Nmt`` delete format and control characters, or whose output characters have
other sources, as NFKC's fullwidth forms, folds); post-processor templates whose tokens are not
special added tokens (a pair template inserting words before every response); and the base
alphabet's ids in one of the standard orders (:func:`alphabet_order_problem`: byte-level
characters by code point or by byte, byte-fallback ``<0xNN>`` pieces by byte).
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any

from warden.tokenscan.charsmap import charsmap_problem, one_char_mappings

MAX_RULES = 256
MAX_DEPTH = 8


@dataclass(frozen=True)
class PipelineIssue:
    """``kind``: rule (a rule rewrites text), unknown (a rule type no judge knows), collision (an
    ordinary entry shares a special id), folding (a special token matched after folding),
    template (a post-processor inserts ordinary tokens), structure (a post-processor template
    reorders, repeats or drops a sequence, or writes an unexpected type id), unreachable (a
    normaliser rewrites vocabulary entries: no text encodes to them)."""

    kind: str
    where: str
    detail: str


Judge = Callable[[Mapping[str, Any]], str | None]  # why the rule rewrites text, or None


# -- what a pattern or a text may contain -------------------------------------------------------
_NOT_SPACE = frozenset("\x1c\x1d\x1e\x1f")  # separators Python calls space; Unicode's White_Space does not
_SAFE_TEXT = frozenset(" \t\n\r\f\v\u2581")  # whitespace and metaspace (byte-level Ġ is a letter of user text)


def _wordy(text: Any) -> str | None:
    """The first letter or digit of ``text`` (a replacement, a prefix), or None."""
    if not isinstance(text, str):
        return None
    return next((ch for ch in text if ch.isalnum() or unicodedata.category(ch)[0] in "LN"), None)


def _only_space(text: Any) -> bool:
    return isinstance(text, str) and all(ch in _SAFE_TEXT or (ch.isspace() and ch not in _NOT_SPACE) for ch in text)


# \s \t \n \r \f \v; \R newline; \X is refused below (oniguruma's \h is a hex digit)
_SPACE_ESCAPES = frozenset("stnrfvRX")


_REGEX_PIECE_RE = re.compile(
    r"\\x\{[0-9A-Fa-f]{1,6}\}|\\x[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\.|\[(?:\\.|[^\]\\])*\]|\(\?:|\{[0-9]*,?[0-9]*\}|.",
    re.S,
)
_REGEX_SYNTAX = frozenset("()|*+?^$")  # groups, alternation, quantifiers, anchors: they match no character


def _space_piece(piece: str) -> bool:
    """Whether one piece of a pattern (a literal, an escape, a class) matches only whitespace or
    metaspace. Classes must be plain lists of such pieces (no negation, no range)."""
    if piece.startswith("[") and len(piece) > 1:
        inner = piece[1:-1]
        if not inner or inner.startswith("^"):
            return False
        return all(_space_piece(m.group(0)) for m in _REGEX_PIECE_RE.finditer(inner))
    if piece.startswith("\\x") or piece.startswith("\\u"):
        code = int(piece[3:-1] if piece.startswith("\\x{") else piece[2:], 16)
        return code <= 0x10FFFF and _only_space(chr(code))
    if piece.startswith("\\") and len(piece) == 2:
        esc = piece[1]
        return (esc in _SPACE_ESCAPES and esc != "X") or (not esc.isalnum() and _only_space(esc))
    return len(piece) == 1 and _only_space(piece)


def pattern_reaches_text(pattern: Any) -> str | None:
    """Why a Replace/Split pattern (``{"String": ...}`` or ``{"Regex": ...}``) may match a character
    other than whitespace or metaspace (any letter, digit, symbol, punctuation or format character
    of user text), or None when every character it can match is whitespace or metaspace. Judged
    from the source alone and conservatively: ``.``, classes that are negated or hold a range, group
    constructs other than ``(?:``, and escapes other than whitespace ones count as reaching text."""
    if not isinstance(pattern, dict) or len(pattern) != 1:
        return "a pattern that is neither String nor Regex"
    kind, source = next(iter(pattern.items()))
    if not isinstance(source, str):
        return "a pattern that is not a string"
    if kind == "String":
        ch = next((c for c in source if not _only_space(c)), None)
        return f"the pattern {source[:40]!r} matches {ch!r}" if ch else None
    if kind != "Regex":
        return f"a pattern of kind {kind!r}"
    for m in _REGEX_PIECE_RE.finditer(source):
        piece = m.group(0)
        if piece in _REGEX_SYNTAX or piece == "(?:" or (piece.startswith("{") and len(piece) > 1):
            continue
        if not _space_piece(piece):
            return f"the pattern {source[:40]!r} may match {piece[:20]!r} (not whitespace or metaspace)"
    return None


def pattern_may_match_empty(pattern: Any) -> bool:
    """Whether a pattern may match the empty string (a Replace then writes its content at every
    position). Conservative: any zero-minimum quantifier or empty alternative counts."""
    if not isinstance(pattern, dict) or len(pattern) != 1:
        return True
    kind, source = next(iter(pattern.items()))
    if not isinstance(source, str) or not source:
        return True
    if kind != "Regex":
        return False
    pieces = [m.group(0) for m in _REGEX_PIECE_RE.finditer(source)]
    zero = any(p in ("*", "?") or p.startswith("{0") or p.startswith("{,") for p in pieces)
    empty_alt = source.startswith("|") or source.endswith("|") or any(x in source for x in ("||", "(|", "|)", "()"))
    return zero or empty_alt


def _rewrites(rule: Mapping[str, Any], what: str) -> str | None:
    """Why a Replace (``what``: its section's word for it) changes more than whitespace: its
    pattern reaches other characters, its content writes them, or it writes at every position."""
    pattern, content = rule.get("pattern"), rule.get("content")
    source = next(iter(pattern.values()), None) if isinstance(pattern, dict) and pattern else pattern
    shown = f"{str(source)[:40]!r} -> {str(content)[:40]!r}"
    if isinstance(pattern, dict) and pattern.get("String") == content and isinstance(content, str) and content:
        return None  # the identity
    if why := pattern_reaches_text(pattern):
        return f"{what} {shown}: {why}"
    if not _only_space(content):
        ch = next((c for c in str(content) if not _only_space(c)), str(content)[:1])
        return f"{what} {shown} writes {ch!r} into the text"
    if content and pattern_may_match_empty(pattern):
        return f"{what} {shown} may match the empty string: its content is written at every position"
    return None


# -- judges, one per rule type ------------------------------------------------------------------
def _ok(_rule: Mapping[str, Any]) -> str | None:
    return None


def _replace(rule: Mapping[str, Any]) -> str | None:
    return _rewrites(rule, "Replace")


def _affix(field: str) -> Judge:
    def judge(rule: Mapping[str, Any]) -> str | None:
        value = rule.get(field)
        return None if value is None or _only_space(value) else f"{rule.get('type')} adds {str(value)[:40]!r}"

    return judge


def _metaspace(rule: Mapping[str, Any]) -> str | None:
    rep = rule.get("replacement", "\u2581")
    if rep not in ("\u2581", " "):
        return f"Metaspace replacement {rep!r} is not '\u2581': that character of user text would decode as a space"
    return None


SPLIT_BEHAVIOURS = frozenset({"removed", "isolated", "mergedwithprevious", "mergedwithnext", "contiguous"})


def _split(rule: Mapping[str, Any]) -> str | None:
    behavior = str(rule.get("behavior", "")).lower()
    if behavior not in SPLIT_BEHAVIOURS:
        return f"Split behavior {rule.get('behavior')!r} is not one this judge knows"
    if behavior != "removed":
        return None  # Isolated, Merged*, Contiguous only split: every character is kept
    if rule.get("invert"):
        return "Split removes everything its pattern does not match (invert with behavior Removed)"
    why = pattern_reaches_text(rule.get("pattern"))
    return f"Split with behavior Removed deletes characters of user text: {why}" if why else None


def _punctuation(rule: Mapping[str, Any]) -> str | None:
    behavior = str(rule.get("behavior", "isolated")).lower()
    if behavior == "removed":
        return "Punctuation with behavior Removed deletes every punctuation character of user text"
    return None if behavior in SPLIT_BEHAVIOURS else f"Punctuation behavior {rule.get('behavior')!r} is not known"


def _delimiter(rule: Mapping[str, Any]) -> str | None:
    ch = rule.get("delimiter")
    ok = isinstance(ch, str) and len(ch) == 1 and _only_space(ch)
    return None if ok else f"CharDelimiterSplit removes {ch!r} from the text (not whitespace)"


def _strip(rule: Mapping[str, Any]) -> str | None:
    content = rule.get("content", " ")
    return None if _only_space(content) else f"Strip decoder removes {str(content)[:20]!r} from tokens"


def _wordpiece_decoder(rule: Mapping[str, Any]) -> str | None:
    prefix = rule.get("prefix", "##")
    if not isinstance(prefix, str) or len(prefix) < 2 or _wordy(prefix) or _only_space(prefix):
        return f"WordPiece decoder prefix {prefix!r} is not a marker of two or more symbols: tokens lose it"
    return None


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
        "Punctuation": _punctuation, "Digits": _ok, "UnicodeScripts": _ok, "Metaspace": _metaspace,
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
    out += alphabet_issues(tok)
    return out


ModelJudge = Callable[[Any], str | None]  # why a model field's value drops or replaces text, or None

MIN_CHARS_PER_WORD = 100
"""WordPiece's ``max_input_chars_per_word`` in ``tokenizers`` and transformers (and every BERT
release): a word longer than it becomes the unknown token whole."""


def _no_dropout(value: Any) -> str | None:
    if value is None or (type(value) in (int, float) and value == 0):
        return None
    return f"dropout {value!r}: the same text encodes differently each time"


def _marker(what: str, letters: bool) -> ModelJudge:
    """A subword prefix or end-of-word suffix: absent, or a marker no ordinary word holds (``##``;
    with ``letters``, markup such as ``</w>`` too); a word-like one would be stripped from, or
    glued onto, real words."""

    def judge(value: Any) -> str | None:
        if value is None or value == "":
            return None
        symbols = isinstance(value, str) and not all(ch.isalnum() or ch.isspace() for ch in value)
        if not symbols or (not letters and _wordy(value)):
            return f"{what} {str(value)[:20]!r} is not a marker of symbols: words lose or gain it"
        return None

    return judge


def _unknown_piece(value: Any) -> str | None:
    """The piece unknown text becomes: absent, or markup (``[UNK]``, ``<unk>``), never a word."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or all(ch.isalnum() or ch.isspace() or ch == "\u2581" for ch in value):
        return f"unknown token {str(value)[:20]!r} is a word: unknown text reads as it"
    return None


def _chars_per_word(value: Any) -> str | None:
    if value is None or (type(value) is int and value >= MIN_CHARS_PER_WORD):
        return None
    return f"max_input_chars_per_word {value!r} below {MIN_CHARS_PER_WORD}: every longer word becomes the unknown token"


def _flag(name: str) -> ModelJudge:
    return lambda v: None if v is None or type(v) is bool else f"{name} {v!r} is not a boolean"


def _unk_id(value: Any) -> str | None:
    return None if value is None or (type(value) is int and value >= 0) else f"unk_id {value!r} is not a vocabulary id"


_PASS: ModelJudge = lambda _v: None  # noqa: E731 - vocab and merges: judged by the vocabulary invariants
MODEL_FIELDS: dict[str, dict[str, ModelJudge]] = {
    "BPE": {"dropout": _no_dropout, "unk_token": _unknown_piece, "fuse_unk": _flag("fuse_unk"),
            "continuing_subword_prefix": _marker("subword prefix", True),
            "end_of_word_suffix": _marker("end-of-word suffix", True),
            "byte_fallback": _flag("byte_fallback"), "ignore_merges": _flag("ignore_merges"),
            "vocab": _PASS, "merges": _PASS},
    "WordPiece": {"unk_token": _unknown_piece, "continuing_subword_prefix": _marker("subword prefix", False),
                  "max_input_chars_per_word": _chars_per_word, "vocab": _PASS},
    "WordLevel": {"unk_token": _unknown_piece, "vocab": _PASS},
    "Unigram": {"unk_id": _unk_id, "byte_fallback": _flag("byte_fallback"), "vocab": _PASS},
}  # fmt: skip
"""Model type -> field -> judge: every parameter of a ``tokenizers`` model that can drop or replace
text (sampling, unknown pieces, markers, word-length limits). A field not listed is ``unknown``."""


def _model_issues(model: Any) -> list[PipelineIssue]:
    """The model's fields through :data:`MODEL_FIELDS` (an untyped model, as old files write it, is
    judged by every table it fits: a field any type refuses is refused)."""
    if not isinstance(model, dict):
        return [PipelineIssue("unknown", "model", "no model object")]
    kind = model.get("type")
    if kind is not None and kind not in MODEL_FIELDS:
        return [PipelineIssue("unknown", "model", f"model type {kind!r} is not judged")]
    tables = [MODEL_FIELDS[kind]] if kind is not None else list(MODEL_FIELDS.values())
    out = []
    for key, value in list(model.items())[:MAX_RULES]:
        if key == "type":
            continue
        judges = [t[key] for t in tables if key in t]
        if not judges:
            out.append(PipelineIssue("unknown", "model", f"{kind or 'model'} field {str(key)[:40]!r} is not judged"))
        elif why := next((w for j in judges if (w := j(value))), None):
            out.append(PipelineIssue("rule", "model", f"{kind or 'model'} {why}"))
    return out


# -- the base alphabet's ids -------------------------------------------------------------------
def _byte_level_chars() -> tuple[str, ...]:
    """The byte-level alphabet (GPT-2's bytes-to-unicode), indexed by byte: printable Latin-1 bytes
    stand for themselves, the other 68 take U+0100 onwards in byte order."""
    kept = {*range(33, 127), *range(161, 173), *range(174, 256)}
    out, shifted = [], 0
    for byte in range(256):
        out.append(chr(byte) if byte in kept else chr(256 + shifted))
        shifted += byte not in kept
    return tuple(out)


BYTE_LEVEL_CHARS = _byte_level_chars()
_BYTE_OF = {ch: b for b, ch in enumerate(BYTE_LEVEL_CHARS)}
_HEX = "0123456789ABCDEF"


def _first_disorder(entries: list[tuple[int, str]], keys: Mapping[str, Callable[[str], int]]) -> str | None:
    """None when the entries (id, text), sorted by id, rise under one of the ``keys`` orders; else
    the first pair out of order under the first order."""
    ranked = [t for _i, t in sorted(entries)]
    for key in keys.values():
        values = [key(t) for t in ranked]
        if all(a < b for a, b in pairwise(values)):
            return None
    key = next(iter(keys.values()))
    ids = {t: i for i, t in entries}
    a, b = next((a, b) for a, b in pairwise(ranked) if key(a) >= key(b))
    return f"{a!r} (id {ids[a]}) comes before {b!r} (id {ids[b]}): not in {' or '.join(keys)} order"


def byte_alphabet_problem(vocab: Mapping[str, Any]) -> str | None:
    """A byte-level BPE vocabulary's single-character entries (its base alphabet) must hold their
    ids in one standard order: by code point (GPT-2's vocab.json, tokenizers' trainer, tiktoken's
    conversions) or by byte (tekken's ranks). Two alphabet entries whose ids were swapped (the
    digits 1 and 7) break both, whatever any corpus holds."""
    entries = [(i, t) for t, i in vocab.items() if type(i) is int and t in _BYTE_OF]
    orders = {"code point": ord, "byte": _BYTE_OF.__getitem__}
    why = _first_disorder(entries, orders)
    return f"byte-level alphabet: {why}" if why else None


def byte_fallback_problem(entries: Iterable[tuple[str, int]]) -> str | None:
    """Byte-fallback pieces ``<0x00>``..``<0xFF>`` must hold their ids in byte order (sentencepiece
    and the converters write them so)."""
    pieces = [
        (i, t) for t, i in entries
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">") and t[3] in _HEX and t[4] in _HEX
    ]  # fmt: skip
    why = _first_disorder(pieces, {"byte": lambda t: int(t[3:5], 16)})
    return f"byte-fallback pieces: {why}" if why else None


def _byte_level(tok: Mapping[str, Any]) -> bool:
    return any(
        r.get("type") == "ByteLevel" for s in ("pre_tokenizer", "decoder", "normalizer") for _w, r in rules(tok, s)
    )


def alphabet_issues(tok: Mapping[str, Any]) -> list[PipelineIssue]:
    """The base alphabet's ids (:func:`byte_alphabet_problem` for a byte-level BPE model,
    :func:`byte_fallback_problem` for any model holding ``<0xNN>`` pieces)."""
    model = tok.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    out = []
    if isinstance(vocab, dict) and _byte_level(tok) and (why := byte_alphabet_problem(vocab)):
        out.append(PipelineIssue("order", "model.vocab", why))
    if why := byte_fallback_problem(_vocab_entries(model)):
        out.append(PipelineIssue("order", "model.vocab", why))
    return out


# -- vocabulary-wide invariants ----------------------------------------------------------------
_IMAGES: dict[str, Callable[[str], str]] = {
    "NFC": lambda t: unicodedata.normalize("NFC", t), "NFD": lambda t: unicodedata.normalize("NFD", t),
    "NFKC": lambda t: unicodedata.normalize("NFKC", t), "NFKD": lambda t: unicodedata.normalize("NFKD", t),
    "Lowercase": str.lower,
}  # fmt: skip
_DELETING = frozenset({"StripAccents", "Nmt"})  # remove marks / control and format characters anywhere


@lru_cache(maxsize=8)
def produced(kind: str) -> frozenset[str]:
    """Every character a normal form (or ``Lowercase``) writes for some *other* input: the
    characters of each code point's image that differ from it, and for the composing forms every
    composed character (written for its decomposition). Exhaustive over the code space (cached;
    about 0.2 s per form)."""
    out: set[str] = set()
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        image = _IMAGES[kind](ch)
        if image != ch:
            out.update(image)
        if kind in ("NFC", "NFKC") and unicodedata.normalize("NFD", ch) != ch:
            out.add(ch)
    return frozenset(out)


def _cjk_spaced(text: str) -> str:
    """BertNormalizer's handle_chinese_chars: a space either side of each CJK ideograph."""
    return "".join(f" {ch} " if unicodedata.name(ch, "").startswith("CJK") else ch for ch in text)


def fold_step(rule: Mapping[str, Any], text: str) -> tuple[str, bool]:
    """(``text`` after the normaliser ``rule``, whether some user text other than ``text`` can
    normalise into an occurrence of it). A normalised added token is matched on the normalised
    text against its own normalised content, so it folds when the rule changes the token, deletes
    characters anywhere (format/control/mark removal, a Replace to nothing), or writes characters
    of the token for other input. Unknown rules fold (conservative)."""
    kind = rule.get("type")
    if isinstance(kind, str) and kind in _IMAGES:
        out = _IMAGES[kind](text)
        return out, out != text or not produced(kind).isdisjoint(out)
    if kind == "Sequence":
        return text, False  # its children follow in order
    if kind == "ByteLevel":  # bytes outside printable ASCII become other characters
        return text, any(not "!" <= ch <= "~" for ch in text)
    if kind == "Strip":
        out = text.lstrip() if rule.get("strip_left", True) else text
        out = out.rstrip() if rule.get("strip_right", True) else out
        return out, out != text
    if kind == "Precompiled" and rule.get("precompiled_charsmap") in (None, ""):
        return text, False
    if kind == "BertNormalizer":
        lower = bool(rule.get("lowercase", True))
        deletes = rule.get("clean_text", True) or rule.get("strip_accents", lower) or lower
        out = _cjk_spaced(text) if rule.get("handle_chinese_chars", True) else text
        return out, bool(deletes) or out != text or " " in out
    if kind == "Replace":
        return _fold_replace(rule, text)
    if kind in ("Prepend", "Append"):
        extra = rule.get(kind.lower())
        if not isinstance(extra, str) or not extra:
            return text, extra != ""
        return (extra + text if kind == "Prepend" else text + extra), True
    if kind in _DELETING:
        return text, True  # the deleted characters can sit anywhere inside the token
    return text, True  # Precompiled (NFKC-like maps), or a type no judge knows


def _fold_replace(rule: Mapping[str, Any], text: str) -> tuple[str, bool]:
    pattern, content = rule.get("pattern"), rule.get("content")
    if not isinstance(content, str) or not content or not isinstance(pattern, dict) or len(pattern) != 1:
        return text, True  # deletes what it matches: that text can be put inside the token
    kind, source = next(iter(pattern.items()))
    writes = not set(content).isdisjoint(text)
    if kind == "String" and isinstance(source, str) and source:
        out = text.replace(source, content)
        return out, out != text or not set(content).isdisjoint(out)
    if kind == "Regex" and pattern_reaches_text(pattern) is None and not any(_only_space(ch) for ch in text):
        return text, writes  # it matches only whitespace, which the token lacks
    return text, True


def folding_rules(tok: Mapping[str, Any], token: str | None = None) -> list[str]:
    """Normaliser rules (types, in order) through which user text other than ``token`` can become
    ``token`` (:func:`fold_step`, applied along the normaliser to the token's own text); without a
    ``token``, every rule that folds some text (any rule other than the identity)."""
    out, text = [], token if token is not None else ""
    for _where, rule in rules(tok, "normalizer"):
        text, folds = fold_step(rule, text)
        if folds or (token is None and rule.get("type") != "Sequence"):
            out.append(str(rule.get("type")))
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


MARKUP_CHARS = frozenset("<>[]|{}")
"""An added token holding one of these is markup (``<tool_call>``, ``<think>``), special or not:
user text must not normalise into it either."""


def vocabulary_issues(tok: Mapping[str, Any], extra_ids: Mapping[int, str] | None = None) -> list[PipelineIssue]:
    """Ordinary entries sharing a special token's id (``extra_ids``: id -> token from another file
    of the loader, ``added_tokens_decoder``), special and markup added tokens matched after
    folding (:data:`MARKUP_CHARS`), and
    post-processor templates adding tokens that are not special added tokens."""
    out = []
    model = tok.get("model")
    specials: dict[int, str] = {}
    seen_ids: dict[int, str] = {}
    for a in _added(tok):
        ident, content = a.get("id"), a.get("content")
        if type(ident) is not int or not isinstance(content, str):
            continue
        if ident in seen_ids and seen_ids[ident] != content:
            out.append(
                PipelineIssue("collision", "added_tokens", f"{content!r} and {seen_ids[ident]!r} share id {ident}")
            )
        seen_ids.setdefault(ident, content)
        if a.get("special"):
            specials[ident] = content
        elif not MARKUP_CHARS.intersection(content):
            continue  # an ordinary added word: folding it onto itself is what normalising is for
        folds = folding_rules(tok, content) if a.get("normalized", not a.get("special")) else []
        if folds:
            what = "special" if a.get("special") else "markup added token"
            folded = ", ".join(sorted(set(folds)))
            detail = f"{what} {content!r} is matched after the normaliser ({folded}): look-alike text becomes it"
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


ADDING_PROCESSORS = frozenset({"TemplateProcessing", "BertProcessing", "RobertaProcessing"})


def _piece(piece: Any) -> tuple[str, Any, Any] | None:
    """(``Sequence`` or ``SpecialToken``, its id, its type id) of one template piece, or None."""
    if not isinstance(piece, dict) or len(piece) != 1:
        return None
    kind, body = next(iter(piece.items()))
    if kind not in ("Sequence", "SpecialToken") or not isinstance(body, dict):
        return None
    return kind, body.get("id"), body.get("type_id", 0)


def _shown(sequences: Iterable[str]) -> str:
    return " ".join("$" + s for s in sequences) or "none"


def _template_shape(pieces: Any, sequences: tuple[str, ...]) -> str | None:
    """Why one template (``single``: sequences ``("A",)``; ``pair``: ``("A", "B")``) is not
    special tokens around each sequence once and in that order, type ids a run of 0 (holding
    ``$A``) then a run of one segment id (0, or BERT's 1; holding ``$B``, and maybe the special
    token before it, as transformers' Llama and Gemma write ``<bos>:1 $B:1``), or None."""
    if not isinstance(pieces, list) or len(pieces) > MAX_RULES:
        return "is not a list of pieces"
    parsed = [p for p in map(_piece, pieces) if p is not None]
    if len(parsed) != len(pieces):
        return "holds a piece that is neither a Sequence nor a SpecialToken"
    order = tuple(str(ident) for kind, ident, _t in parsed if kind == "Sequence")
    if order != sequences:
        return f"holds the sequences {_shown(order)} (expected {_shown(sequences)})"
    types = [t for _k, _i, t in parsed]
    if not all(_is_int(t, 0) or _is_int(t, 1) for t in types) or types != sorted(types):
        return f"writes type ids {types} (one run of 0, then one of BERT's 1)"
    at = [n for n, (kind, _i, _t) in enumerate(parsed) if kind == "Sequence"]
    single_typed = len(at) == 1 and any(types)
    if types[at[0]] != 0 or single_typed or len(set(types[at[-1] :])) > 1:
        return f"writes type ids {types} ($A and a single template are segment 0, $B one id from it on)"
    return None


def _is_int(value: Any, expected: int) -> bool:
    return type(value) is int and value == expected


def template_structure_problems(node: Mapping[str, Any]) -> list[str]:
    """Why a ``TemplateProcessing`` is not the structure of every real family: ``single`` is
    special tokens and ``$A`` once, type id 0; ``pair`` is special tokens, ``$A`` then ``$B`` (never
    swapped, repeated or dropped), type ids 0 then one segment id (0, or BERT's 1) with ``$A`` in
    the first run and ``$B`` in the second. A reward model fed a swapped pair scores the response
    before the prompt."""
    out = []
    for key, sequences in (("single", ("A",)), ("pair", ("A", "B"))):
        if key in node and (why := _template_shape(node.get(key), sequences)):
            out.append(f"TemplateProcessing {key} template {why}")
    return out


def template_issues(processor: Any, specials: Mapping[int, str]) -> list[PipelineIssue]:
    """Post-processors may add only special added tokens: every ``TemplateProcessing`` token (of
    the single and the pair template) maps to exactly one id, that of a special added token of
    the same text; Bert/Roberta processors' cls/sep too. Each template has the structure of
    :func:`template_structure_problems`, and one processor at most adds tokens (a Sequence of
    two adds them twice)."""
    out: list[PipelineIssue] = []
    adding = 0
    special_text = {v: k for k, v in specials.items()}
    stack: list[tuple[Any, int]] = [(processor, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            continue
        kind = node.get("type")
        adding += kind in ADDING_PROCESSORS
        if adding == 2 and kind in ADDING_PROCESSORS:
            out.append(PipelineIssue("structure", "post_processor", "two post-processors add special tokens: "
                                                                    "every encoding gets them twice"))  # fmt: skip
        if kind == "Sequence" and isinstance(node.get("processors"), list):
            stack += [(p, depth + 1) for p in node["processors"][:MAX_RULES]]
        elif kind == "TemplateProcessing":
            out += [PipelineIssue("structure", "post_processor", why) for why in template_structure_problems(node)]
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


def tokenizer_issues(
    tok: Mapping[str, Any],
    extra_ids: Mapping[int, str] | None = None,
    loader_rules: tuple[Mapping[str, Any], ...] = (),
    declared: Mapping[str, Any] | None = None,
) -> list[PipelineIssue]:
    """:func:`rule_issues`, :func:`vocabulary_issues`, :func:`unreachable_issues`,
    :func:`spanning_issues`, :func:`processor_role_issues` and :func:`case_issues` of one parsed
    tokenizer.json (``loader_rules``: normaliser rules the loader adds, as ``do_lower_case``;
    ``declared``: its folder's tokenizer_config)."""
    declared = declared if isinstance(declared, Mapping) else {}
    return (
        rule_issues(tok) + vocabulary_issues(tok, extra_ids) + unreachable_issues(tok, loader_rules)
        + spanning_issues(tok) + processor_role_issues(tok.get("post_processor"), declared)
        + case_issues(tok, loader_rules, declared.get("do_lower_case") is False)
    )  # fmt: skip


MAX_SPANNING = 4  # added tokens named per issue


def spanning_issues(tok: Mapping[str, Any]) -> list[PipelineIssue]:
    """An added token whose text holds a special token's text and more
    (``<|im_end|>\n<|im_start|>assistant\n``): where a template writes that run, one id the model
    never learnt replaces the turn's markup (added tokens are matched before the model)."""
    added = _added(tok)
    specials = {  # whitespace runs are added tokens of their own in some families (Gemma): no markup
        c for a in added if a.get("special") and isinstance(c := a.get("content"), str) and len(c.strip()) >= 3
    }
    if not specials:
        return []
    inside = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))
    spanning = []
    for a in added:
        content = a.get("content")
        if not isinstance(content, str):
            continue
        # a special held inside: the text itself matched whole is no span (look past each end)
        m = (
            inside.search(content)
            if content not in specials
            else inside.search(content[1:]) or inside.search(content[:-1])
        )
        if m:
            spanning.append(f"{content!r} (holds {m.group(0)!r})")
    if not spanning:
        return []
    shown = ", ".join(spanning[:MAX_SPANNING])
    detail = f"added token {shown} spans a special token: text holding it encodes to one untrained id"
    return [PipelineIssue("collision", "added_tokens", detail)]


def processor_role_issues(processor: Any, declared: Mapping[str, Any]) -> list[PipelineIssue]:
    """A Bert/Roberta post-processor adds the config's own cls and sep tokens, in their places
    (swapped, every encoding opens with the separator and the classifier reads the wrong token)."""
    out = []
    for _where, node in rules({"post_processor": processor}, "post_processor"):
        if node.get("type") not in ("BertProcessing", "RobertaProcessing"):
            continue
        for key in ("cls", "sep"):
            pair, want = node.get(key), _declared(declared, f"{key}_token")
            if isinstance(pair, list) and pair and want is not None and pair[0] != want:
                detail = f"{node['type']} {key} is {pair[0]!r} but the config's {key}_token is {want!r}"
                out.append(PipelineIssue("template", "post_processor", detail))
        if isinstance(node.get("cls"), list) and node.get("cls") == node.get("sep"):
            out.append(PipelineIssue("template", "post_processor", f"{node['type']} cls and sep are one token"))
    return out + _template_role_issues(processor, declared)


def _declared(declared: Mapping[str, Any], key: str) -> str | None:
    value = declared.get(key)
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) and value else None


def _template_role_issues(processor: Any, declared: Mapping[str, Any]) -> list[PipelineIssue]:
    """A TemplateProcessing's single template never opens with the config's separator (BERT's
    ``[SEP] $A [CLS]``; XLNet's ``$A <sep> <cls>`` closes with both), and a WordPiece-style
    config declaring both cls and sep has a post-processor that adds them."""
    cls, sep = _declared(declared, "cls_token"), _declared(declared, "sep_token")
    if cls is None or sep is None:
        return []
    if processor is None:
        detail = f"no post-processor, though the config declares cls {cls!r} and sep {sep!r}: encodings carry neither"
        return [PipelineIssue("template", "post_processor", detail)]
    out = []
    for _where, node in rules({"post_processor": processor}, "post_processor"):
        single = node.get("single") if node.get("type") == "TemplateProcessing" else None
        first = _piece(single[0]) if isinstance(single, list) and single else None
        if first is not None and first[0] == "SpecialToken" and first[1] == sep:
            detail = f"TemplateProcessing single template opens with the separator {sep!r}"
            out.append(PipelineIssue("template", "post_processor", detail))
    return out


MIN_CASED_LETTERS = 200  # vocabulary entries with letters a WordPiece vocabulary needs to be judged for case


def case_issues(
    tok: Mapping[str, Any], loader_rules: tuple[Mapping[str, Any], ...], keeps_case: bool
) -> list[PipelineIssue]:
    """An uncased WordPiece vocabulary (no entry with a capital) under a normaliser that keeps
    case (``keeps_case``: the config's ``do_lower_case`` is false, and the loader rebuilds the
    normaliser from it): every capitalised word becomes the unknown token."""
    model = tok.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        return []
    image = normaliser_image(tok, () if keeps_case else loader_rules)
    if not keeps_case and image is not None and image("PARIS") != "PARIS":
        return []
    lettered = capital = 0
    added = {t for a in _added(tok) if isinstance(t := a.get("content"), str)}  # [CLS], [UNK]: not words
    for entry, _ident in _vocab_entries(model):
        if entry not in added and any(c.isalpha() for c in entry):
            lettered += 1
            capital += entry != entry.lower()
    if lettered < MIN_CASED_LETTERS or capital:
        return []
    detail = f"an uncased vocabulary ({lettered} entries, none with a capital) under a normaliser that keeps case"
    return [PipelineIssue("unreachable", "model.vocab", detail + ": capitalised words become the unknown token")]


# -- vocabulary entries the normaliser never lets through ----------------------------------------
MIN_UNREACHABLE = 8
UNREACHABLE_SHARE = 0.01
"""An issue from this many rewritten entries and this share of the judged ones on: a vocabulary
trained under its own normaliser holds none (a stray decomposed sequence under NFC is not a
family's capitals under Lowercase)."""


def _strip_marks(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")


def _rule_image(rule: Mapping[str, Any]) -> Callable[[str], str] | None:
    """What one normaliser rule writes for a text, where that is known exactly enough to say an
    entry can never come out of it: the normal forms and Lowercase, accents stripped, BERT's
    lowercase and accent stripping, a charsmap's one-character mappings. None: the identity
    here (whitespace rules, Replace, Prepend: judged by :data:`JUDGES`)."""
    kind = rule.get("type")
    if isinstance(kind, str) and kind in _IMAGES:
        return _IMAGES[kind]
    if kind == "StripAccents":
        return lambda t: "".join(ch for ch in t if unicodedata.category(ch) != "Mn")
    if kind == "BertNormalizer":
        lower = rule.get("lowercase", True) is not False
        strip = rule.get("strip_accents")
        strip = lower if strip is None else bool(strip)
        return _composed([f for f, on in ((_strip_marks, strip), (str.lower, lower)) if on])
    if kind == "Precompiled" and isinstance(raw := rule.get("precompiled_charsmap"), str) and raw:
        table = _charsmap_chars(raw)
        return (lambda t: "".join(table.get(ch, ch) for ch in t)) if table else None
    return None


@lru_cache(maxsize=8)
def _charsmap_chars(raw: str) -> dict[str, str]:
    """The one-character mappings of a base64 charsmap (empty when it does not decode)."""
    try:
        return one_char_mappings(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError):
        return {}


def normaliser_image(
    tok: Mapping[str, Any], loader_rules: tuple[Mapping[str, Any], ...] = ()
) -> Callable[[str], str] | None:
    """The known part of the normaliser (:func:`_rule_image` along its rules, then ``loader_rules``)
    as one function, or None when no rule of it rewrites text."""
    steps = [f for _w, r in rules(tok, "normalizer") if (f := _rule_image(r))]
    return _composed(steps + [f for r in loader_rules if (f := _rule_image(r))])


def _composed(steps: list[Callable[[str], str]]) -> Callable[[str], str] | None:
    """``steps`` applied in order, as one function (None: no step)."""
    if not steps:
        return None

    def image(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return image


_FROM_BYTE_LEVEL = {ord(ch): chr(b) for b, ch in enumerate(BYTE_LEVEL_CHARS)}


def entry_text(entry: str, byte_level: bool, prefix: str | None) -> str | None:
    """The user text a vocabulary entry stands for: byte-level characters decoded (None: not whole
    UTF-8), metaspace as a space, a WordPiece continuing prefix removed; None for byte pieces."""
    if byte_level:
        try:
            return entry.translate(_FROM_BYTE_LEVEL).encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return None
    if len(entry) == 6 and entry.startswith("<0x") and entry.endswith(">"):
        return None
    if prefix and entry.startswith(prefix) and len(entry) > len(prefix):
        entry = entry[len(prefix) :]
    return entry.replace("\u2581", " ")


def unreachable_entries(
    tok: Mapping[str, Any], loader_rules: tuple[Mapping[str, Any], ...] = ()
) -> tuple[int, list[str]]:
    """(entries judged, entries the normaliser rewrites): an ordinary vocabulary entry whose text the
    known normaliser (:func:`normaliser_image`) changes is never the output of that normaliser, so
    no text encodes to it ('Apple' under Lowercase). Added tokens are matched before it and skipped."""
    image = normaliser_image(tok, loader_rules)
    model = tok.get("model")
    if image is None or not isinstance(model, dict):
        return 0, []
    added = {t for a in _added(tok) if isinstance(t := a.get("content"), str)}
    byte_level = _byte_level(tok)
    prefix = model.get("continuing_subword_prefix") if model.get("type") == "WordPiece" else None
    judged, out = 0, []
    for entry, _ident in _vocab_entries(model):
        text = None if entry in added else entry_text(entry, byte_level, prefix if isinstance(prefix, str) else None)
        if not text or text.isspace():
            continue
        judged += 1
        if image(text) != text:
            out.append(entry)
    return judged, out


def unreachable_issues(tok: Mapping[str, Any], loader_rules: tuple[Mapping[str, Any], ...] = ()) -> list[PipelineIssue]:
    """One issue when the normaliser rewrites :data:`MIN_UNREACHABLE` or more entries and
    :data:`UNREACHABLE_SHARE` of those judged (:func:`unreachable_entries`): a Lowercase or
    ``do_lower_case`` over a cased vocabulary; an uncased one (BERT uncased) has none."""
    out = _unreachable_byte_pieces(tok)
    judged, rewritten = unreachable_entries(tok, loader_rules)
    if len(rewritten) < max(MIN_UNREACHABLE, UNREACHABLE_SHARE * judged):
        return out
    shown = ", ".join(map(repr, rewritten[:4]))
    detail = f"the normaliser rewrites {len(rewritten)}/{judged} vocabulary entries ({shown}): no text encodes to them"
    return [*out, PipelineIssue("unreachable", "model.vocab", detail)]


def _unreachable_byte_pieces(tok: Mapping[str, Any]) -> list[PipelineIssue]:
    """A BPE vocabulary holding byte pieces (``<0x00>``...) under ``byte_fallback: false``: no text
    encodes to them, and every character outside the vocabulary becomes the unknown token."""
    model = tok.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("byte_fallback") is True:
        return []
    vocab = model.get("vocab")
    names = (f"<0x{b:02X}>" for b in range(256))  # a lookup per byte, not a pass over the vocabulary
    pieces = sum(1 for n in names if n in vocab) if isinstance(vocab, dict) else 0
    if pieces < 64:
        return []
    detail = f"{pieces} byte pieces (<0x00>...) in the vocabulary but byte_fallback is off: no text encodes to them"
    return [PipelineIssue("unreachable", "model.byte_fallback", detail + ", unknown characters become <unk>")]


def looks_like_tokenizer(data: Any) -> bool:
    """Whether a parsed JSON document is a ``tokenizers`` serialisation (whatever its name:
    ``fast_tokenizer_files`` may point the loader at ``tokenizer.4.0.json``)."""
    return isinstance(data, dict) and isinstance(data.get("model"), dict) and "added_tokens" in data
