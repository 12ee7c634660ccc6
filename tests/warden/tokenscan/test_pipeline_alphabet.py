"""Pipeline rules judged over the whole alphabet (``warden.tokenscan.pipeline_rules``, issue 33).

The judges read a rule's pattern and content, never a corpus: a rule that can rewrite, delete or
insert any character of user text other than whitespace and metaspace is a finding, whatever
character it is (a currency sign, punctuation, a format character, a byte-level letter). These
tests generate rules over the alphabet (printable ASCII, the byte-level alphabet, format and
control characters, a few other scripts) and hold the judge to what the real ``tokenizers``
library does with them: a rule judged clean changes only whitespace and metaspace of the whole
alphabet; a String rule judged a finding really changes some other character. Folding: a
``normalized: true`` special token judged safe under a normaliser is never produced from
generated look-alike text. Base alphabet ids: any swap of two alphabet entries is caught, the
standard orders (by code point, by byte) are clean.
"""

from __future__ import annotations

import copy
import json
import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan.families import build_family
from warden.tokenscan import pipeline_rules as pr

tokenizers = pytest.importorskip("tokenizers")

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "25"))
SETTINGS = settings(
    max_examples=EXAMPLES * 4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
SPACE = " \t\n\u2581"
FORMAT = "\u200b\u200c\u200d\u2060\ufeff\u00ad\x01\x1f\x7f"
OTHER = "é€£¥½→∞ＡＫ＜｜＞ﬁ\u212a\u0301ßÄ中あ"
ALPHABET = "".join(
    dict.fromkeys([chr(c) for c in range(0x21, 0x7F)] + list(pr.BYTE_LEVEL_CHARS) + list(FORMAT + OTHER))
)
TEXT_CHARS = st.sampled_from(ALPHABET)  # never whitespace or metaspace
SPACE_CHARS = st.sampled_from(SPACE)
ANY_CHARS = st.sampled_from(ALPHABET + SPACE)


def _tok(section: str, rule: dict[str, Any]) -> Any:
    """A minimal tokenizer holding ``rule`` in ``section`` (a WordLevel model over the alphabet)."""
    vocab = {ch: i for i, ch in enumerate(dict.fromkeys([*ALPHABET, *SPACE, "[UNK]"]))}
    data: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }  # fmt: skip
    data[section] = rule
    return tokenizers.Tokenizer.from_str(json.dumps(data))


def _applied(section: str, rule: dict[str, Any], text: str, literal: str = "") -> str:
    """What the real library does with ``text`` + ``literal`` under ``rule``: the normalised
    string, the pre-tokenized words joined, or the decoder's output for one token per character
    of ``text`` and ``literal`` as one more token (decoders rewrite token by token)."""
    tok = _tok(section, rule)
    if section == "normalizer":
        return str(tok.normalizer.normalize_str(text + literal))
    if section == "pre_tokenizer":
        return "".join(w for w, _span in tok.pre_tokenizer.pre_tokenize_str(text + literal))
    return str(tok.decoder.decode([*text, literal] if literal else list(text)))


def _visible(text: str) -> str:
    return "".join(ch for ch in text if ch not in SPACE and not ch.isspace())


def _rule_issue(section: str, rule: dict[str, Any]) -> str | None:
    judge = pr.JUDGES[section][rule["type"]]
    return judge(rule)


STRING_RULES = st.one_of(
    st.tuples(st.sampled_from(["normalizer", "decoder"]), st.text(ANY_CHARS, min_size=1, max_size=3),
              st.text(ANY_CHARS, max_size=3)).map(
        lambda t: (t[0], {"type": "Replace", "pattern": {"String": t[1]}, "content": t[2]})
    ),
    st.text(ANY_CHARS, min_size=1, max_size=2).map(
        lambda p: ("pre_tokenizer", {"type": "Split", "pattern": {"String": p}, "behavior": "Removed", "invert": False})
    ),
    ANY_CHARS.map(lambda c: ("pre_tokenizer", {"type": "CharDelimiterSplit", "delimiter": c})),
    st.tuples(st.just("Prepend"), st.text(ANY_CHARS, min_size=1, max_size=2)).map(  # no Append in tokenizers 0.2x
        lambda t: ("normalizer", {"type": t[0], t[0].lower(): t[1]})
    ),
)  # fmt: skip


@SETTINGS
@given(rule=STRING_RULES)
def test_a_string_rule_is_a_finding_exactly_when_it_changes_a_character_of_the_alphabet(rule):
    """Exact both ways for literal rules: the judge flags the rule iff the real library, run on the
    whole alphabet (each character alone, between spaces) and the rule's own pattern as user text,
    writes, deletes or rewrites a character other than whitespace or metaspace."""
    section, body = rule
    literal = body.get("pattern", {}).get("String") or body.get("delimiter") or ""
    text = " " + " ".join(ALPHABET) + " "
    changed = _visible(_applied(section, body, text, literal)) != _visible(text + literal)
    if body["type"] == "Replace" and body["content"] and not _visible(body["content"]):
        changed = changed or _visible(body["pattern"]["String"]) != ""  # it rewrites text into spaces
    issue = _rule_issue(section, body)
    assert (issue is not None) == changed, (body, issue)


PIECES_SPACE = st.sampled_from([" ", r"\s", r"\t", r"\n", r"\x20", r"\u2581", "[ \\t]", r"\ "])
PIECES_TEXT = st.one_of(
    TEXT_CHARS.filter(lambda c: c not in "()|*+?^$[]{}\\").map(str),
    st.sampled_from([".", r"\w", r"\d", r"\S", r"\p{P}", "[^ ]", "[a-z]", "[!-/]", r"\$", r"\%", r"\x24", r"\u20ac",
                     r"\u200b", "(?i)a", "(?=x)", r"\b", r"\h", r"\1"]),
)  # fmt: skip
QUANT = st.sampled_from(["", "+", "{2,}", "{1,3}"])


@st.composite
def regexes(draw: st.DrawFn, text: bool) -> str:
    """A regex of whitespace pieces, with (``text``) at least one piece that reaches other characters."""
    pieces = draw(st.lists(st.tuples(PIECES_SPACE, QUANT), min_size=1, max_size=3))
    out = [p + q for p, q in pieces]
    if text:
        out.insert(draw(st.integers(0, len(out))), draw(PIECES_TEXT) + draw(QUANT))
    glue = draw(st.sampled_from(["", "|"]))
    source = glue.join(out)
    return f"(?:{source})" if draw(st.booleans()) else source


@SETTINGS
@given(source=regexes(text=True), section=st.sampled_from(["normalizer", "decoder", "pre_tokenizer"]))
def test_a_regex_reaching_any_character_is_a_finding(source, section):
    rule = (
        {"type": "Split", "pattern": {"Regex": source}, "behavior": "Removed", "invert": False}
        if section == "pre_tokenizer"
        else {"type": "Replace", "pattern": {"Regex": source}, "content": ""}
    )
    assert _rule_issue(section, rule) is not None, source


@SETTINGS
@given(source=regexes(text=False), content=st.text(SPACE_CHARS, min_size=1, max_size=2))
def test_a_regex_judged_clean_changes_only_whitespace_in_the_real_library(source, content):
    """Soundness: whatever the judge lets through keeps every visible character of the alphabet
    (run by ``tokenizers`` on the alphabet joined by runs of whitespace)."""
    text = "  ".join(ALPHABET) + "\t\n" + " \u2581 ".join(ALPHABET[::7])
    for section, rule in (
        ("normalizer", {"type": "Replace", "pattern": {"Regex": source}, "content": content}),
        ("decoder", {"type": "Replace", "pattern": {"Regex": source}, "content": content}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": source}, "behavior": "Removed", "invert": False}),
    ):
        if _rule_issue(section, rule) is None:
            assert _visible(_applied(section, rule, text)) == _visible(text), (section, rule)


def test_known_rules_each_way():
    """Known cases: the red-team round 2 rules are findings, the families' own rules are not."""
    findings = [
        ("normalizer", {"type": "Replace", "pattern": {"String": "$"}, "content": "€"}),
        ("decoder", {"type": "Replace", "pattern": {"String": "%"}, "content": ""}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"String": "?"}, "behavior": "Removed", "invert": False}),
        ("pre_tokenizer", {"type": "Punctuation", "behavior": "Removed"}),
        ("normalizer", {"type": "Replace", "pattern": {"Regex": "``"}, "content": " "}),
        ("normalizer", {"type": "Replace", "pattern": {"String": "\u200b"}, "content": ""}),
        ("normalizer", {"type": "Replace", "pattern": {"Regex": " *"}, "content": " "}),  # spaces every position
        ("normalizer", {"type": "Replace", "pattern": {"Regex": r"\h"}, "content": ""}),  # oniguruma: a hex digit
        ("pre_tokenizer", {"type": "Metaspace", "replacement": "$", "prepend_scheme": "always", "split": True}),
        ("decoder", {"type": "WordPiece", "prefix": "#", "cleanup": True}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": False}),
    ]
    clean = [
        ("normalizer", {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}),
        ("decoder", {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}),
        ("normalizer", {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}),
        ("normalizer", {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False}),
        ("decoder", {"type": "WordPiece", "prefix": "##", "cleanup": True}),
        ("normalizer", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                        "strip_accents": None, "lowercase": True}),
        ("normalizer", {"type": "Nmt"}),
    ]  # fmt: skip
    for section, rule in findings:
        assert _rule_issue(section, rule) is not None, rule
    for section, rule in clean:
        assert _rule_issue(section, rule) is None, rule


# -- folding: user text reaching a normalized special token ------------------------------------------
FOLD_RULES = st.one_of(
    st.sampled_from(
        [{"type": t} for t in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Nmt")]
        + [{"type": "Strip", "strip_left": True, "strip_right": True}]
        + [{"type": "BertNormalizer", "clean_text": c, "handle_chinese_chars": h, "strip_accents": s, "lowercase": lo}
           for c in (True, False) for h in (True, False) for s in (None, False) for lo in (True, False)]
        + [{"type": "ByteLevel"}]
    ),
    st.tuples(st.text(ANY_CHARS, min_size=1, max_size=2), st.text(ANY_CHARS, max_size=2)).map(
        lambda t: {"type": "Replace", "pattern": {"String": t[0]}, "content": t[1]}
    ),
    st.sampled_from([" ", "\u2581"]).map(lambda c: {"type": "Prepend", "prepend": c}),
)  # fmt: skip
KNOWN_TOKENS = ["<|im_end|>", "[SEP]", "<eos>", "<｜end▁of▁sentence｜>", "<|eot_id|>", "</s>", "<0x0A>", "[/INST]"]
TOKENS = st.one_of(st.sampled_from(KNOWN_TOKENS), st.text(st.sampled_from("<>|[]/_-!#01Kk"), min_size=3, max_size=8))


def _lookalikes(token: str) -> list[str]:
    """Other texts that might normalise into ``token``: a format, control or combining character
    put inside it, one character's other case, its fullwidth or compatibility forms."""
    out = [token[:i] + ch + token[i:] for i in range(1, len(token)) for ch in "\u200b\x01\u0301\u00ad"]
    for i, ch in enumerate(token):
        for other in {ch.upper(), ch.lower(), chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch, "\u212a"}:
            if (
                other != ch
                and unicodedata.normalize("NFKC", other).lower() == unicodedata.normalize("NFKC", ch).lower()
            ):
                out.append(token[:i] + other + token[i + 1 :])
    return [t for t in out if t != token]


def _special_id(rule: dict[str, Any], token: str, text: str) -> bool:
    data = json.loads(_tok("normalizer", rule).to_str())
    data["added_tokens"] = [{"id": 9999, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": True, "special": True}]  # fmt: skip
    loaded = tokenizers.Tokenizer.from_str(json.dumps(data))
    return loaded.token_to_id(token) in loaded.encode(f"a {text} b").ids


@SETTINGS
@given(rule=FOLD_RULES, token=TOKENS)
def test_a_normalized_special_judged_safe_is_never_reached_from_lookalike_text(rule, token):
    tok = {"normalizer": rule}
    if pr.folding_rules(tok, token):
        return
    for text in _lookalikes(token):
        assert not _special_id(rule, token, text), (rule, token, text)


def test_folding_known_cases():
    assert pr.folding_rules({"normalizer": {"type": "Nmt"}}, "<|im_end|>") == ["Nmt"]
    bert = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False, "strip_accents": False,
            "lowercase": False}  # fmt: skip
    assert pr.folding_rules({"normalizer": bert}, "<|im_end|>") == ["BertNormalizer"]
    assert _special_id(bert, "<|im_end|>", "<|im_\u200bend|>")  # what the judge says, the library does
    assert pr.folding_rules({"normalizer": {"type": "NFKC"}}, "<|im_end|>") == ["NFKC"]
    assert pr.folding_rules({"normalizer": {"type": "NFC"}}, "<|im_end|>") == []
    assert pr.folding_rules({"normalizer": {"type": "NFC"}}, "<|KILL|>") == ["NFC"]  # U+212A KELVIN SIGN
    space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    assert pr.folding_rules({"normalizer": space}, "<|im_end|>") == []
    assert pr.folding_rules({"normalizer": space}, "<｜end▁of▁sentence｜>") == ["Replace"]


# -- base alphabet ids -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("alphabet-bases")
    return {
        name: json.loads((build_family(name, root / name) / "tokenizer.json").read_text(encoding="utf-8"))
        for name in ("phi4", "qwen2.5", "gpt2", "gemma")
    }


def _alphabet_ids(tok: dict[str, Any]) -> list[str]:
    vocab = tok["model"]["vocab"]
    if tok["model"].get("byte_fallback"):
        return [t for t in vocab if len(t) == 6 and t.startswith("<0x")]
    return [t for t in vocab if t in pr.BYTE_LEVEL_CHARS]


@SETTINGS
@given(data=st.data())
def test_any_swap_of_two_alphabet_ids_is_caught(bases, data):
    name = data.draw(st.sampled_from(sorted(bases)))
    tok = copy.deepcopy(bases[name])
    entries = _alphabet_ids(tok)
    a, b = data.draw(st.lists(st.sampled_from(entries), min_size=2, max_size=2, unique=True))
    vocab = tok["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    assert "order" in {i.kind for i in pr.tokenizer_issues(tok)}, (name, a, b)


@SETTINGS
@given(data=st.data())
def test_standard_alphabet_orders_are_clean(bases, data):
    """Dropping alphabet entries keeps the order; renumbering the byte-level alphabet by byte (as
    tekken's ranks are) is the other standard order."""
    name = data.draw(st.sampled_from(sorted(bases)))
    tok = copy.deepcopy(bases[name])
    vocab = tok["model"]["vocab"]
    entries = _alphabet_ids(tok)
    for gone in data.draw(st.lists(st.sampled_from(entries), max_size=20, unique=True)):
        del vocab[gone]
    if not tok["model"].get("byte_fallback") and data.draw(st.booleans()):
        kept = sorted(vocab[t] for t in vocab if t in pr.BYTE_LEVEL_CHARS)
        by_byte = [ch for ch in pr.BYTE_LEVEL_CHARS if ch in vocab]
        vocab.update(zip(by_byte, kept, strict=True))
    assert [i for i in pr.tokenizer_issues(tok) if i.kind == "order"] == []


def test_the_byte_level_alphabet_is_gpt2s():
    assert len(set(pr.BYTE_LEVEL_CHARS)) == 256
    assert pr.BYTE_LEVEL_CHARS[ord(" ")] == "\u0120" and pr.BYTE_LEVEL_CHARS[ord("\n")] == "\u010a"
    assert sorted(pr.BYTE_LEVEL_CHARS) == sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())


def test_slow_vocab_json_alphabet(tmp_path: Path):
    """A vocab.json + merges.txt layout (no tokenizer.json) is judged by the same order."""
    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    d = build_family("gpt2", tmp_path / "gpt2")
    (d / "tokenizer.json").unlink()
    assert not [f for f in scan_directory(str(d), default_policy()).findings if f.id == "TS1205"]
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    vocab["1"], vocab["7"] = vocab["7"], vocab["1"]
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    found = [f for f in scan_directory(str(d), default_policy()).findings if f.id == "TS1205"]
    assert [f.path for f in found] == ["vocab.json"] and "byte-level alphabet" in found[0].message, found


# -- the alphabet round trip in the tokenizer child (defence in depth beside the static judges) ----------
def _child_answer(tok: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The tokenizer child's answer for ``tok`` (its request handler, run in this process)."""
    import hashlib

    from warden.tokenscan import tokenizer_behaviour as tbe
    from warden.tokenscan import tokenizer_child

    path = tmp / "tokenizer.json"
    data = json.dumps(tok).encode()
    path.write_bytes(data)
    req = tbe.request("tokenizer", str(path), hashlib.sha256(data).hexdigest(), len(data), {})
    return tokenizer_child.serve_one({**req, "corpus": []})


@SETTINGS
@given(data=st.data())
def test_a_generated_decoder_or_normalizer_rewrite_breaks_the_alphabet_round_trip(bases, tmp_path, data):
    """Any visible character rewritten or deleted by a generated rule shows in the child's
    alphabet round trip, named, on the byte-level and byte-fallback families alike."""
    from warden.tokenscan import tokenizer_behaviour as tbe

    name = data.draw(st.sampled_from(sorted(bases)))
    tok = copy.deepcopy(bases[name])
    char = data.draw(st.sampled_from([c for c in tbe.ALPHABET if tbe.folded(c)]))
    into = data.draw(st.sampled_from(["", "€", "$", "x", "0"]).filter(lambda c: tbe.folded(c) != tbe.folded(char)))
    section = data.draw(st.sampled_from(["normalizer", "decoder"]))
    rule = {"type": "Replace", "pattern": {"String": char}, "content": into}
    key = {"normalizer": "normalizers", "decoder": "decoders"}[section]
    tok[section] = {"type": "Sequence", key: [r for r in (tok.get(section), rule) if r]}
    issues = tbe.alphabet_issues(_child_answer(tok, tmp_path))
    assert len(issues) == 1 and repr(char) in issues[0].detail, (name, rule, issues)


def test_the_alphabet_round_trip_of_the_family_tokenizers_is_clean(bases, tmp_path):
    from warden.tokenscan import tokenizer_behaviour as tbe

    for name, tok in bases.items():
        answer = _child_answer(tok, tmp_path)
        assert len(answer["alphabet"]) == len(set(tbe.ALPHABET)), name
        assert tbe.alphabet_issues(answer) == [], name


def test_alphabet_issues_known_cases():
    from warden.tokenscan import tokenizer_behaviour as tbe

    ok = {"alphabet": [["A", "a", ""], ["é", "e", ""], ["½", "1⁄2", ""], ["ﬁ", "fi", ""], ["$", "[UNK]", "unk"]]}
    assert tbe.alphabet_issues(ok) == []
    bad = {"alphabet": [["$", "€", ""], ["%", "", ""], ["?", " ", ""]]}
    (issue,) = tbe.alphabet_issues(bad)
    assert issue.kind == "roundtrip" and "3 alphabet character(s)" in issue.detail
    assert tbe.alphabet_issues({"alphabet": [["$", 7, ""], "junk"]}) == []  # hostile answers never raise


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
NORMALIZER_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from([*sorted(pr.JUDGES["normalizer"]), "Bogus"])},
    optional={k: JSON for k in ("pattern", "content", "prepend", "append", "normalizers", "clean_text", "lowercase",
                                "strip_accents", "handle_chinese_chars", "strip_left", "precompiled_charsmap")},
)  # fmt: skip


@SETTINGS
@given(rule=NORMALIZER_LIKE | JSON, token=st.text(max_size=8), vocab=st.dictionaries(ANY_CHARS, st.integers(0, 9)))
def test_hostile_normalizers_and_vocabularies_never_raise(rule, token, vocab):
    tok = {
        "normalizer": rule,
        "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "added_tokens": [{"id": 10, "content": token, "special": True, "normalized": True}],
    }
    pr.folding_rules(tok, token)
    for issue in pr.tokenizer_issues(tok):
        assert issue.kind in ("rule", "unknown", "collision", "folding", "template", "order")


def test_a_markup_added_token_under_nfkc_is_reached_from_fullwidth_text(tmp_path: Path):
    """Qwen's ``<tool_call>`` is an added token that is not special and is normalized: harmless
    under its NFC, reached from fullwidth user text under NFKC (what the library does, and the
    judge says so)."""
    tok = json.loads((build_family("qwen3", tmp_path / "q") / "tokenizer.json").read_text(encoding="utf-8"))
    assert [i for i in pr.tokenizer_issues(tok) if i.kind == "folding"] == []
    tok["normalizer"] = {"type": "NFKC"}
    loaded = tokenizers.Tokenizer.from_str(json.dumps(tok))
    assert loaded.token_to_id("<tool_call>") in loaded.encode("say \uff1ctool_call\uff1e now").ids
    found = [i.detail for i in pr.tokenizer_issues(tok) if i.kind == "folding"]
    assert any("markup added token '<tool_call>'" in d for d in found), found


def test_added_tokens_decoder_marking_a_markup_token_normalized_is_judged(tmp_path: Path):
    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    d = build_family("qwen3", tmp_path / "q")
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tok["normalizer"] = {"type": "NFKC"}
    for a in tok["added_tokens"]:
        a["normalized"] = False  # tokenizer.json itself is safe
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = {str(a["id"]): {**a, "normalized": a["content"] == "<tool_call>"} for a in tok["added_tokens"]}
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": decoder}), encoding="utf-8")
    found = [(f.path, f.message) for f in scan_directory(str(d), default_policy()).findings if f.id == "TS1211"]
    assert found == [
        ("tokenizer_config.json", "added_tokens_decoder: markup token '<tool_call>' is normalized under NFKC")
    ]


@pytest.mark.parametrize(("family", "name"), [("gemma", "tokenizer.model"), ("t5", "spiece.model")])
def test_the_alphabet_round_trip_of_sentencepiece_models_is_clean(tmp_path: Path, family: str, name: str):
    import hashlib

    pytest.importorskip("sentencepiece")
    from warden.tokenscan import tokenizer_behaviour as tbe
    from warden.tokenscan import tokenizer_child

    path = build_family(family, tmp_path / family) / name
    data = path.read_bytes()
    req = tbe.request("sentencepiece", str(path), hashlib.sha256(data).hexdigest(), len(data), {})
    answer = tokenizer_child.serve_one({**req, "corpus": []})
    assert answer["status"] == "ok" and len(answer["alphabet"]) == len(set(tbe.ALPHABET))
    assert tbe.alphabet_issues(answer) == []


def test_the_alphabet_order_follows_the_id_order_switch(tmp_path: Path):
    """A swap of two alphabet ids is TS1205 by default; behaviour.bpe_ids_follow_merges: false
    (TS1205's documented switch, after review) turns the order checks off, this one included."""
    import dataclasses

    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    d = build_family("phi4", tmp_path / "p")
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    vocab["1"], vocab["7"] = vocab["7"], vocab["1"]
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    policy = default_policy()
    assert [f.id for f in scan_directory(str(d), policy).findings] == ["TS1205"]
    off = dataclasses.replace(policy, behaviour=dataclasses.replace(policy.behaviour, bpe_ids_follow_merges=False))
    assert [f.id for f in scan_directory(str(d), off).findings] == []
