"""Pipeline and config semantics the loader applies to every encoding (red-team round 3), each
judged in one place and tested both ways with generated inputs:

- loader-read settings (``encoding_settings``): every row of the tables, safe values clean,
  anything else a problem naming the key and value; every family's configs clean;
- post-processor templates (``pipeline_rules.template_structure_problems``): the structures real
  families write are clean, any swap, repetition, drop or unexpected type id is found;
- model fields (``pipeline_rules.MODEL_FIELDS``): word-length limits, sampling, unknown pieces;
- charsmap mappings of characters newer than this Python's Unicode data, judged by their target;
- normalisers that make vocabulary entries unreachable (cased vocabularies under Lowercase);
- the loader-resolved special tokens (``declared.loader_special_tokens``).
"""

from __future__ import annotations

import json
import shutil
import string
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import charsmap as cm
from warden.tokenscan import encoding_settings as es
from warden.tokenscan import pipeline_rules as pr
from warden.tokenscan import scan_directory
from warden.tokenscan.checks.keys import encoding_key_problems, tokenizer_setting_context
from warden.tokenscan.checks.pipeline import loader_normaliser
from warden.tokenscan.declared import loader_special_tokens
from warden.tokenscan.policy import default_policy

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
FIXTURE_SETTINGS = settings(
    max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FAMILY_NAMES = ("qwen2.5", "bert", "bert-bare", "t5", "gpt2", "gemma", "mistral", "llama4", "deepseek-r1", "gpt-oss")


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("settings-families")
    return {name: fam.build_family(name, root / name) for name in FAMILY_NAMES}


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


# -- loader-read settings --------------------------------------------------------------------------
JUNK = st.one_of(
    st.text(max_size=8), st.integers(-5, 5), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2)
)
BOOLS = st.sampled_from([True, False, None])
NOT_BOOL = JUNK.filter(lambda v: type(v) is not bool and v is not None)
CTX = es.SettingContext(chat=True, markup=frozenset({"<tool_call>", "</tool_call>"}))

SAFE: dict[str, st.SearchStrategy[Any]] = {
    "model_max_length": st.one_of(st.integers(es.MIN_CHAT_MODEL_MAX_LENGTH, 1 << 40), st.just(None), st.just(1e30)),
    "model_input_names": st.lists(st.sampled_from(["token_type_ids", "position_ids"]), max_size=2).map(
        lambda extra: ["input_ids", *extra, "attention_mask"]
    ),
    "truncation_side": st.just("right"),
    "padding_side": st.sampled_from(["right", "left"]),
    "split_special_tokens": st.sampled_from([False, None]),
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": st.sampled_from([False, None]),
    "add_eos_token": st.sampled_from([False, None]),
    "errors": st.sampled_from(["replace", "strict"]),
    "sp_model_kwargs": st.sampled_from([{}, None, {"enable_sampling": False}]),
    "chat_control_tokens": st.one_of(
        st.just(None), st.lists(st.text(max_size=5), max_size=3).map(lambda x: ["<tool_call>", "</tool_call>", *x])
    ),
}
HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "model_max_length": st.one_of(
        st.integers(1, es.MIN_CHAT_MODEL_MAX_LENGTH - 1), st.text(max_size=4), BOOLS.filter(bool)
    ),
    "model_input_names": st.lists(st.sampled_from(["input_ids", "token_type_ids"]), max_size=3),
    "truncation_side": st.one_of(st.just("left"), JUNK.filter(lambda v: v != "right")),
    "padding_side": JUNK.filter(lambda v: v not in ("right", "left")),
    "split_special_tokens": st.one_of(st.just(True), NOT_BOOL),
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": st.one_of(st.just(True), NOT_BOOL),
    "add_eos_token": st.one_of(st.just(True), NOT_BOOL),
    "errors": st.one_of(st.just("ignore"), JUNK.filter(lambda v: v not in ("replace", "strict"))),
    "sp_model_kwargs": st.one_of(
        st.fixed_dictionaries({"enable_sampling": st.just(True), "alpha": st.floats(0.01, 1)}), st.just([1])
    ),
    "chat_control_tokens": st.one_of(st.just([]), st.just(["<tool_call>"]), st.just("x")),
}
BOOLEAN_KEYS = [k for k, s in es.CONFIG_SETTINGS.items() if s.judge is es.BOOLEAN]


def test_every_setting_has_generated_values_both_ways() -> None:
    assert set(SAFE) | set(BOOLEAN_KEYS) == set(es.CONFIG_SETTINGS)
    assert set(HOSTILE) | set(BOOLEAN_KEYS) == set(es.CONFIG_SETTINGS)


@SETTINGS
@given(data=st.data(), key=st.sampled_from(sorted(es.CONFIG_SETTINGS)))
def test_safe_values_are_clean_and_others_named(data: st.DataObject, key: str) -> None:
    safe = data.draw(BOOLS if key in BOOLEAN_KEYS else SAFE[key])
    assert encoding_key_problems({key: safe}, True, CTX) == [], (key, safe)
    hostile = data.draw(NOT_BOOL if key in BOOLEAN_KEYS else HOSTILE[key])
    found = encoding_key_problems({key: hostile}, True, CTX)
    assert [k for k, _why in found] == [key], (key, hostile, found)
    assert found[0][1].startswith(f"{key} "), found


TRUNCATION = st.fixed_dictionaries(
    {"direction": st.just("Right"), "max_length": st.integers(es.MIN_CHAT_MODEL_MAX_LENGTH, 1 << 20),
     "strategy": st.sampled_from(es.TRUNCATION_STRATEGIES), "stride": st.integers(0, 64)}
)  # fmt: skip


@SETTINGS
@given(truncation=TRUNCATION, change=st.sampled_from(["direction", "max_length", "strategy", "stride"]))
def test_tokenizer_json_truncation_both_ways(truncation: dict[str, Any], change: str) -> None:
    ctx = es.SettingContext(chat=True)
    assert es.setting_problems(es.TOKENIZER_JSON_SETTINGS, {"truncation": truncation}, ctx) == []
    bad = {"direction": "Left", "max_length": 16, "strategy": "Sideways", "stride": -1}[change]
    found = es.setting_problems(es.TOKENIZER_JSON_SETTINGS, {"truncation": {**truncation, change: bad}}, ctx)
    assert [k for k, _w in found] == ["truncation"] and change in found[0][1], found


@SETTINGS
@given(
    direction=st.sampled_from(["Right", "Left"]),
    pad_id=st.integers(0, 5),
    change=st.sampled_from(["token", "type", "fixed"]),
)
def test_tokenizer_json_padding_both_ways(direction: str, pad_id: int, change: str) -> None:
    ctx = es.SettingContext(chat=False, specials={"<pad>": pad_id})
    padding: dict[str, Any] = {"direction": direction, "pad_id": pad_id, "pad_token": "<pad>", "pad_type_id": 0,
               "strategy": "BatchLongest", "pad_to_multiple_of": None}  # fmt: skip
    assert es.setting_problems(es.TOKENIZER_JSON_SETTINGS, {"padding": padding}, ctx) == []
    assert (
        es.setting_problems(es.TOKENIZER_JSON_SETTINGS, {"padding": {**padding, "strategy": {"Fixed": 512}}}, ctx) == []
    )
    changes: dict[str, dict[str, Any]] = {
        "token": {"pad_token": "the"},
        "type": {"pad_type_id": 1},
        "fixed": {"strategy": {"Fixed": 4}},
    }
    bad = changes[change]
    assert es.setting_problems(es.TOKENIZER_JSON_SETTINGS, {"padding": {**padding, **bad}}, ctx)


def test_family_settings_are_clean(families: dict[str, Path]) -> None:
    for name, d in families.items():
        config = _json(d / "tokenizer_config.json")
        tok = _json(d / "tokenizer.json")
        ctx = tokenizer_setting_context(tok, "chat_template" in config)
        assert encoding_key_problems(config, ctx.chat, ctx) == [], name
        assert es.setting_problems(es.TOKENIZER_JSON_SETTINGS, tok, ctx) == [], name


# -- post-processor templates ---------------------------------------------------------------------
SPECIAL_IDS = ["[CLS]", "[SEP]", "<s>", "</s>"]


def _special(name: str, type_id: int = 0) -> dict[str, Any]:
    return {"SpecialToken": {"id": name, "type_id": type_id}}


def _seq(name: str, type_id: int = 0) -> dict[str, Any]:
    return {"Sequence": {"id": name, "type_id": type_id}}


SPECIALS = st.lists(st.sampled_from(SPECIAL_IDS), max_size=2)


@st.composite
def real_templates(draw: st.DrawFn) -> dict[str, Any]:
    """Templates of the shapes families write: specials around $A; specials, $A, specials, $B,
    specials, with type ids a run of 0 holding $A, then one segment id (0 or BERT's 1) holding $B
    and maybe the specials before it (transformers' Llama and Gemma: ``<bos>:1 $B:1``)."""
    a0, a1, mid, b1 = (draw(SPECIALS) for _ in range(4))
    segment, split = draw(st.sampled_from([0, 1])), draw(st.integers(0, len(mid)))
    single = [*map(_special, a0), _seq("A"), *map(_special, a1)]
    pair = [*map(_special, a0), _seq("A"), *map(_special, mid[:split])]
    pair += [*(_special(t, segment) for t in mid[split:]), _seq("B", segment), *(_special(t, segment) for t in b1)]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": {}}


@st.composite
def broken_templates(draw: st.DrawFn) -> dict[str, Any]:
    """A real template with one structural change: sequences swapped, repeated or dropped, or a
    type id the convention does not allow (1 at or before $A or in a single template; 2 or more)."""
    node = draw(real_templates())
    key = draw(st.sampled_from(["single", "pair"]))
    pieces = node[key]
    change = draw(st.sampled_from(["swap", "repeat", "drop", "type"]))
    seqs = [i for i, p in enumerate(pieces) if "Sequence" in p]
    if change == "swap" and key == "pair":
        a, b = seqs
        pieces[a], pieces[b] = pieces[b], pieces[a]
    elif change in ("swap", "repeat"):
        pieces.insert(draw(st.integers(0, len(pieces))), _seq(draw(st.sampled_from(["A", "B"]))))
    elif change == "drop":
        del pieces[draw(st.sampled_from(seqs))]
    else:
        at = draw(st.integers(0, len(pieces) - 1))
        low = 1 if key == "single" or at <= seqs[0] else 2
        next(iter(pieces[at].values()))["type_id"] = draw(st.integers(low, 4))
    return node


@SETTINGS
@given(node=real_templates())
def test_real_template_structures_are_clean(node: dict[str, Any]) -> None:
    assert pr.template_structure_problems(node) == [], node


@SETTINGS
@given(node=broken_templates())
def test_broken_template_structures_are_found(node: dict[str, Any]) -> None:
    assert pr.template_structure_problems(node), node


def test_family_post_processors_have_the_real_structure(families: dict[str, Path]) -> None:
    for name, d in families.items():
        tok = _json(d / "tokenizer.json")
        assert [i for i in pr.tokenizer_issues(tok) if i.kind == "structure"] == [], name


def test_two_adding_processors_in_a_sequence_are_found() -> None:
    bert = {"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]}
    found = pr.template_issues({"type": "Sequence", "processors": [bert, dict(bert)]}, {0: "[CLS]", 1: "[SEP]"})
    assert [i.kind for i in found] == ["structure"]


# -- model fields ----------------------------------------------------------------------------------
def _model_rules(model: dict[str, Any]) -> list[str]:
    return [i.detail for i in pr._model_issues(model) if i.kind in ("rule", "unknown")]


@SETTINGS
@given(limit=st.integers(-5, 1000))
def test_wordpiece_word_limit_below_the_default_is_found(limit: int) -> None:
    model = {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "vocab": {},
             "max_input_chars_per_word": limit}  # fmt: skip
    assert bool(_model_rules(model)) == (limit < pr.MIN_CHARS_PER_WORD), limit


@SETTINGS
@given(
    kind=st.sampled_from(["BPE", "WordPiece", "WordLevel"]),
    unk=st.one_of(st.text(string.ascii_letters, min_size=1, max_size=6), st.sampled_from(["[UNK]", "<unk>", None])),
)
def test_unknown_piece_must_not_be_a_word(kind: str, unk: str | None) -> None:
    found = _model_rules({"type": kind, "unk_token": unk, "vocab": {}})
    assert bool(found) == (unk is not None and unk.isalnum()), (kind, unk, found)


@SETTINGS
@given(
    field=st.sampled_from(["continuing_subword_prefix", "end_of_word_suffix"]),
    marker=st.one_of(
        st.sampled_from(["##", "</w>", "@@", None, ""]), st.text(string.ascii_lowercase, min_size=1, max_size=4)
    ),
    dropout=st.one_of(st.none(), st.just(0.0), st.floats(0.01, 1.0)),
)
def test_bpe_markers_and_dropout(field: str, marker: str | None, dropout: float | None) -> None:
    found = _model_rules({"type": "BPE", field: marker, "dropout": dropout, "vocab": {}, "merges": []})
    hostile = bool(marker and marker.isalnum()) or bool(dropout)
    assert bool(found) == hostile, (field, marker, dropout, found)


def test_family_models_are_clean(families: dict[str, Path]) -> None:
    for name, d in families.items():
        assert _model_rules(_json(d / "tokenizer.json")["model"]) == [], name


# -- charsmap mappings of characters this Python does not know --------------------------------------
NEW_CHARS = [chr(c) for c in (0x1FA77, 0x1CCD6, 0x1E030, 0x1FAE8) if unicodedata.category(chr(c)) == "Cn"]


@pytest.mark.skipif(not NEW_CHARS, reason="this Python's Unicode data knows every sample character")
@SETTINGS
@given(
    source=st.sampled_from(NEW_CHARS or ["x"]),
    words=st.lists(st.text(string.ascii_letters, min_size=1, max_size=8), min_size=2, max_size=6),
    one=st.characters(categories=("Lu", "Ll", "Nd")),
)
def test_unassigned_sources_are_judged_by_their_target(source: str, words: list[str], one: str) -> None:
    assert cm.mapping_problem(source.encode(), " ".join(words).encode()) is not None
    assert cm.mapping_problem(source.encode(), ("".join(words) + one).encode()) is not None
    assert cm.mapping_problem(source.encode(), one.encode()) is None  # a compatibility letter (U+1CCD6 -> 'A')
    assert cm.mapping_problem(source.encode(), b"") is None
    assert cm.mapping_problem(("a" + source).encode(), ("b" + one).encode()) is not None  # the known 'a' is lost


# -- normalisers that make vocabulary entries unreachable ---------------------------------------
LOWER_WORDS = st.text(string.ascii_lowercase, min_size=2, max_size=8)


def _tokenizer(vocab: list[str], normalizer: Any, byte_level: bool = False) -> dict[str, Any]:
    entries = ["\u0120" + w if byte_level else w for w in vocab]
    pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"model": {"type": "BPE", "vocab": {e: i for i, e in enumerate(dict.fromkeys(entries))}, "merges": []},
            "normalizer": normalizer, "pre_tokenizer": pre if byte_level else None, "added_tokens": []}  # fmt: skip


CASE_FOLDING = st.sampled_from(
    [{"type": "Lowercase"}, {"type": "BertNormalizer", "lowercase": True},
     {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}]
)  # fmt: skip


@SETTINGS
@given(
    words=st.lists(LOWER_WORDS, min_size=40, max_size=120, unique=True),
    share=st.floats(0.1, 1.0),
    normalizer=CASE_FOLDING,
    byte_level=st.booleans(),
)
def test_case_folding_over_a_cased_vocabulary_is_found(
    words: list[str], share: float, normalizer: dict[str, Any], byte_level: bool
) -> None:
    cased = words[: max(pr.MIN_UNREACHABLE, int(len(words) * share))]
    vocab = words + [w.capitalize() for w in cased]
    found = pr.unreachable_issues(_tokenizer(vocab, normalizer, byte_level))
    assert [i.kind for i in found] == ["unreachable"], found
    assert pr.unreachable_issues(_tokenizer(words, normalizer, byte_level)) == []  # uncased: clean
    assert pr.unreachable_issues(_tokenizer(vocab, {"type": "NFC"}, byte_level)) == []  # no folding: clean
    assert pr.unreachable_issues(_tokenizer(vocab, None, byte_level), ({"type": "Lowercase"},))  # do_lower_case


@SETTINGS
@given(
    words=st.lists(LOWER_WORDS, min_size=40, max_size=80, unique=True),
    config=st.fixed_dictionaries({}, optional={"do_lower_case": BOOLS, "strip_accents": BOOLS}),
    accented=st.booleans(),
)
def test_the_config_s_case_and_accent_folding_is_judged_with_the_vocabulary(
    words: list[str], config: dict[str, Any], accented: bool
) -> None:
    vocab = words + [("\u00e9" if accented else "") + (w if accented else w.capitalize()) for w in words]
    found = pr.unreachable_issues(_tokenizer(vocab, None), loader_normaliser(config))
    lower = config.get("do_lower_case") is True
    strip = config.get("strip_accents") is True or (lower and config.get("strip_accents") is None)
    assert bool(found) == (strip if accented else lower), (config, accented, found)


def test_family_vocabularies_are_reachable(families: dict[str, Path]) -> None:
    for name, d in families.items():
        config = _json(d / "tokenizer_config.json")
        assert pr.unreachable_issues(_json(d / "tokenizer.json"), loader_normaliser(config)) == [], name


@pytest.mark.parametrize("base", ["gpt2", "qwen2.5", "llama4"])
def test_case_folding_normaliser_on_a_cased_family_fails_a_scan(
    families: dict[str, Path], tmp_path: Path, base: str
) -> None:
    d = tmp_path / base
    shutil.copytree(families[base], d)
    tok = _json(d / "tokenizer.json")
    tok["normalizer"] = {"type": "BertNormalizer", "lowercase": True, "clean_text": False, "strip_accents": False,
                         "handle_chinese_chars": False}  # fmt: skip
    for added in tok["added_tokens"]:
        added["normalized"] = False
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    assert "TS1214" in _scan_ids(d)


# -- the loader-resolved special tokens -------------------------------------------------------------
TOKENS = st.sampled_from(["<x>", "<|image|>", "not", "[IMG]", "<tool_call>"])
NAMES = st.text(string.ascii_lowercase, min_size=3, max_size=8).filter(
    lambda n: n not in ("bos", "eos", "pad", "unk", "cls", "sep", "mask")
)


@SETTINGS
@given(
    named=st.dictionaries(NAMES, TOKENS, max_size=3),
    listed=st.lists(TOKENS, max_size=3),
    top=st.dictionaries(NAMES.map(lambda n: n + "_token"), TOKENS, max_size=2),
    legacy_map=st.booleans(),
    as_object=st.booleans(),
)
def test_every_declared_special_token_is_resolved(
    named: dict[str, str], listed: list[str], top: dict[str, str], legacy_map: bool, as_object: bool
) -> None:
    wrap = (lambda t: {"content": t, "__type": "AddedToken"}) if as_object else (lambda t: t)
    config: dict[str, Any] = {"eos_token": "</s>", **{k: wrap(v) for k, v in top.items()}}
    smap: dict[str, Any] = {}
    target = smap if legacy_map else config
    target["extra_special_tokens"] = {k: wrap(v) for k, v in named.items()}
    config["additional_special_tokens"] = [wrap(t) for t in listed]
    resolved = set(loader_special_tokens(config, smap).values())
    assert {*named.values(), *listed, *top.values(), "</s>"} <= resolved


def test_padding_block_pad_token_is_the_pad_where_none_is_declared() -> None:
    tok = {"padding": {"pad_token": "<pad>", "pad_id": 3}, "added_tokens": []}
    assert loader_special_tokens({}, {}, tok)["pad"] == "<pad>"
    assert loader_special_tokens({"pad_token": "<p>"}, {}, tok)["pad"] == "<p>"


# -- whole scans ---------------------------------------------------------------------------------------
def _scan_ids(d: Path) -> list[str]:
    policy = default_policy()
    return [f.id for f in scan_directory(str(d), policy).blocking(policy.fail_severity)]


@FIXTURE_SETTINGS
@given(
    change=st.sampled_from(
        [{"truncation_side": "left"}, {"split_special_tokens": True}, {"extra_special_tokens": {"image_token": "not"}},
         {"extra_special_tokens": ["the"]}, {"video_token": "and"}, {"add_eos_token": True},
         {"chat_control_tokens": []}, {"sp_model_kwargs": {"enable_sampling": True, "alpha": 0.1}}]
    )
)  # fmt: skip
def test_hostile_config_settings_fail_a_scan(families: dict[str, Path], tmp_path: Path, change: dict[str, Any]) -> None:
    d = tmp_path / "d"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(families["qwen2.5"], d)
    config = _json(d / "tokenizer_config.json")
    (d / "tokenizer_config.json").write_text(json.dumps({**config, **change}), encoding="utf-8")
    assert _scan_ids(d), change


@pytest.mark.parametrize(
    "base,change",
    [("qwen2.5", {"padding_side": "left"}), ("qwen2.5", {"clean_up_tokenization_spaces": True}),
     ("qwen2.5", {"truncation_side": "right"}), ("llama4", {"image_token": "<|image|>"}),
     ("qwen2.5", {"extra_special_tokens": {"tool_token": "<tool_call>"}})],
)  # fmt: skip
def test_benign_config_settings_scan_clean(
    families: dict[str, Path], tmp_path: Path, base: str, change: dict[str, Any]
) -> None:
    d = tmp_path / base
    shutil.copytree(families[base], d)
    config = _json(d / "tokenizer_config.json")
    (d / "tokenizer_config.json").write_text(json.dumps({**config, **change}), encoding="utf-8")
    found = [(f.id, f.message) for f in scan_directory(str(d), default_policy()).findings]
    assert found == [], found
