"""What the loader builds from a directory's added tokens and JSON, judged as the loader sees it
(red-team round 4), each tested both ways with generated inputs:

- strict JSON (``reader._parse_json``): NaN, Infinity and lone surrogate escapes anywhere are
  malformed; everything else parses as ``json.loads`` does (escaped surrogate pairs included);
- the config's ``added_tokens_decoder`` loaded into the tokenizer child (a special word added only
  there is judged like one in tokenizer.json);
- every special added token matched where it stands in text (``single_word``: TS1215);
- byte pieces without ``byte_fallback`` (TS1214) and ordinary words added past the vocabulary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import pipeline_rules as pr
from warden.tokenscan import scan_directory
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.policy import default_policy
from warden.tokenscan.reader import _parse_json

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=6))  # fmt: skip
DOCS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                    max_size=3), max_leaves=12)  # fmt: skip


def _spliced(doc: Any, bad: str) -> str:
    """``doc`` as JSON with the JSON text ``bad`` written as the value of a new key, or list item,
    at the first container (or as the whole document)."""
    text = json.dumps({"wrapped": doc, "at": "\x00MARK"})
    return text.replace(json.dumps("\x00MARK"), bad)


@SETTINGS
@given(DOCS, st.booleans())
def test_json_the_loader_would_read_differently_is_malformed_and_the_rest_parses(doc: Any, ascii_only: bool) -> None:
    text = json.dumps(doc, ensure_ascii=ascii_only)
    parsed = _parse_json("x.json", text.encode())
    assert parsed.error is None and parsed.data == json.loads(text)
    for bad in ("NaN", "Infinity", "-Infinity", '"a\\ud800b"', '"\\udfff"', '{"\\ud83d": 1}'):
        assert _parse_json("x.json", _spliced(doc, bad).encode()).error, bad
    pair = _parse_json("x.json", _spliced(doc, '"\\ud83d\\ude00"').encode())  # an escaped emoji: a pair
    assert pair.error is None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loader-tokens")
    return {name: fam.build_family(name, root / name) for name in ("qwen2.5", "mistral", "bert")}


def _variant(base: Path, tmp: Path, edit_tok: Any = None, edit_config: Any = None) -> Path:
    d = tmp / f"v{len(list(tmp.iterdir()))}"
    shutil.copytree(base, d)
    for name, edit in (("tokenizer.json", edit_tok), ("tokenizer_config.json", edit_config)):
        if edit is not None:
            data = json.loads((d / name).read_text(encoding="utf-8"))
            edit(data)
            (d / name).write_text(json.dumps(data), encoding="utf-8")
    return d


def _ids(d: Path) -> set[str]:
    return {f.id for f in scan_directory(str(d), default_policy()).blocking(default_policy().fail_severity)}


@pytest.mark.parametrize("family", ["qwen2.5", "mistral", "bert"])
@pytest.mark.parametrize("flag", ["single_word", "lstrip", "rstrip"])
def test_a_special_token_must_match_inside_text(built: dict[str, Path], tmp_path: Path, family: str, flag: str) -> None:
    """single_word on any special added token is TS1215; lstrip/rstrip (Phi-3 ships them) are not."""

    def flagged(tok: dict[str, Any]) -> None:
        for entry in tok["added_tokens"]:
            if entry.get("special"):
                entry[flag] = True

    found = _ids(_variant(built[family], tmp_path, flagged))
    assert ("TS1215" in found) is (flag == "single_word"), found


@pytest.mark.parametrize("family", ["qwen2.5", "mistral"])
@pytest.mark.parametrize("word", [w for w in tbe.CORPUS[0].split() if w.isalpha()][:3])
def test_a_special_word_added_only_in_the_config_is_judged_as_the_loader_adds_it(
    built: dict[str, Path], tmp_path: Path, family: str, word: str
) -> None:
    def added(config: dict[str, Any]) -> None:
        config.setdefault("added_tokens_decoder", {})["999999"] = {"content": " " + word, "special": True}

    assert _ids(_variant(built[family], tmp_path, edit_config=added)) & {"TS1203", "TS1005"}


@SETTINGS
@given(st.integers(0, 256), st.sampled_from([True, False, None]), st.integers(0, 300))
def test_byte_pieces_no_text_reaches_are_unreachable(pieces: int, fallback: bool | None, words: int) -> None:
    vocab = {f"<0x{b:02X}>": b for b in range(pieces)} | {f"w{i}": 256 + i for i in range(words)}
    model: dict[str, Any] = {"type": "BPE", "vocab": vocab, "merges": []}
    if fallback is not None:
        model["byte_fallback"] = fallback
    found = [i for i in pr.unreachable_issues({"model": model}) if i.where == "model.byte_fallback"]
    assert bool(found) is (pieces >= 64 and fallback is not True)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["Paris", "hello", "<tool_call>", "  ", "x-y", "[MASK]"]), st.booleans(),
                          st.integers(0, 200)), max_size=6), st.integers(50, 150))  # fmt: skip
def test_an_ordinary_word_added_past_the_vocabulary_is_found(tokens: list[tuple[str, bool, int]], size: int) -> None:
    tok = {"added_tokens": [{"content": c, "special": s, "id": i} for c, s, i in tokens]}
    found = {i.detail.split("'")[1] for i in tbe.added_words(tok, size)}
    expected = {c for c, s, i in tokens if not s and i >= size and tbe.WORDLIKE_RE.match(c.strip())}
    assert found == expected  # at most 6 drawn: under the 8 reported
