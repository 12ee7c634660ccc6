"""Vocabulary-wide rules added after red team round 6 (issue 33), judged from the parsed
tokenizer.json and its folder's config (warden/tokenscan/pipeline_rules.py):

- an added token whose text holds a special token's and more spans it (``spanning_issues``);
- a Bert/Roberta post-processor adds the config's own cls and sep, in their places
  (``processor_role_issues``);
- an uncased WordPiece vocabulary under a normaliser that keeps case (``case_issues``).

Generated inputs: the special tokens, what surrounds a special inside an added token, the
vocabulary's words; the family fixtures (built offline with the tokenizers library) stay clean.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan.families import build_family
from warden.tokenscan import pipeline_rules as pr

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
tag = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=2, max_size=10).map(lambda w: f"<|{w}|>")
word = st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=8)


def _added(*tokens: tuple[str, bool]) -> dict:
    return {"added_tokens": [{"id": i, "content": c, "special": s} for i, (c, s) in enumerate(tokens)]}


@SETTINGS
@given(specials=st.lists(tag, min_size=1, max_size=4, unique=True), before=st.text(max_size=6),
       after=st.text(min_size=1, max_size=6), special=st.booleans(), pick=st.integers(0, 3))  # fmt: skip
def test_an_added_token_holding_a_special_and_more_spans_it(specials, before, after, special, pick):
    held = specials[pick % len(specials)]
    spanning = before + held + after
    tok = _added(*((s, True) for s in specials), (spanning, special))
    if spanning in specials:
        return  # the text is itself one of the specials: nothing spans
    issues = pr.spanning_issues(tok)
    assert len(issues) == 1 and repr(spanning) in issues[0].detail, issues


@SETTINGS
@given(specials=st.lists(tag, min_size=1, max_size=4, unique=True), words=st.lists(word, max_size=5))
def test_added_words_and_specials_alone_span_nothing(specials, words):
    tok = _added(*((s, True) for s in specials), *((w, False) for w in words))
    assert pr.spanning_issues(tok) == []


@SETTINGS
@given(cls=st.sampled_from(["[CLS]", "<s>"]), sep=st.sampled_from(["[SEP]", "</s>"]), swap=st.booleans(),
       kind=st.sampled_from(["BertProcessing", "RobertaProcessing"]))  # fmt: skip
def test_a_bert_processor_adds_the_configs_cls_and_sep_in_their_places(cls, sep, swap, kind):
    first, second = (sep, cls) if swap else (cls, sep)
    processor = {"type": kind, "cls": [first, 1], "sep": [second, 2]}
    issues = pr.processor_role_issues(processor, {"cls_token": cls, "sep_token": {"content": sep}})
    assert (len(issues) == 2) is swap and all("config" in i.detail for i in issues), issues


def test_a_bert_processor_with_one_token_for_cls_and_sep_is_an_issue():
    issues = pr.processor_role_issues({"type": "BertProcessing", "cls": ["[X]", 1], "sep": ["[X]", 1]}, {})
    assert [i.detail for i in issues] == ["BertProcessing cls and sep are one token"]


def _wordpiece(words: list[str], lowercase: bool) -> dict:
    vocab = {w: i for i, w in enumerate(["[UNK]", "[CLS]", *words])}
    specials = [{"id": 0, "content": "[UNK]", "special": True}, {"id": 1, "content": "[CLS]", "special": True}]
    return {
        "model": {"type": "WordPiece", "vocab": vocab, "continuing_subword_prefix": "##"},
        "normalizer": {"type": "BertNormalizer", "lowercase": lowercase},
        "added_tokens": specials,
    }


@SETTINGS
@given(words=st.lists(word, min_size=pr.MIN_CASED_LETTERS, max_size=pr.MIN_CASED_LETTERS + 50, unique=True),
       file_lowercases=st.booleans())  # fmt: skip
def test_an_uncased_vocabulary_under_a_case_keeping_load_is_an_issue(words, file_lowercases):
    """The config's ``do_lower_case: false`` makes the loader rebuild a case-keeping normaliser,
    whatever the file's says; a file that keeps case over an uncased vocabulary is an issue too."""
    tok = _wordpiece(words, file_lowercases)
    from_config = pr.case_issues(tok, (), keeps_case=True)
    from_file = pr.case_issues(tok, (), keeps_case=False)
    assert len(from_config) == 1 and "capitalised words become the unknown token" in from_config[0].detail
    assert (from_file == []) is file_lowercases, from_file


@SETTINGS
@given(words=st.lists(word, min_size=pr.MIN_CASED_LETTERS, max_size=pr.MIN_CASED_LETTERS + 50, unique=True))
def test_a_cased_vocabulary_keeps_case_without_issue(words):
    words = [*words, words[0].title()]
    assert pr.case_issues(_wordpiece(words, False), (), keeps_case=True) == []


@pytest.mark.parametrize("family", ["bert", "bert-bare", "qwen2.5", "llama3.1", "t5", "gpt2"])
def test_family_tokenizers_have_none_of_these_issues(tmp_path, family):
    d = build_family(family, tmp_path / family)
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    config_path = d / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    assert pr.spanning_issues(tok) == []
    assert pr.processor_role_issues(tok.get("post_processor"), config) == []
    assert pr.case_issues(tok, (), config.get("do_lower_case") is False) == []


def _single(*pieces: str) -> dict:
    def piece(p: str) -> dict:
        return {"Sequence": {"id": "A", "type_id": 0}} if p == "$A" else {"SpecialToken": {"id": p, "type_id": 0}}

    return {"type": "TemplateProcessing", "single": [piece(p) for p in pieces]}


@pytest.mark.parametrize(
    "pieces,flagged",
    [(("[CLS]", "$A", "[SEP]"), False), (("$A", "[SEP]", "[CLS]"), False), (("[SEP]", "$A", "[CLS]"), True),
     (("[SEP]", "$A"), True)],
)  # fmt: skip
def test_a_template_never_opens_with_the_configs_separator(pieces, flagged):
    """BERT's ``[CLS] $A [SEP]`` and XLNet's ``$A <sep> <cls>`` are the families' orders; an
    encoding opening with the separator feeds the classifier the wrong token."""
    issues = pr.processor_role_issues(_single(*pieces), {"cls_token": "[CLS]", "sep_token": "[SEP]"})
    assert (len(issues) == 1 and "opens with the separator" in issues[0].detail) is flagged, issues


def test_a_config_declaring_cls_and_sep_needs_a_post_processor():
    issues = pr.processor_role_issues(None, {"cls_token": "[CLS]", "sep_token": "[SEP]"})
    assert [i.detail for i in issues] == [
        "no post-processor, though the config declares cls '[CLS]' and sep '[SEP]': encodings carry neither"
    ]
    assert pr.processor_role_issues(None, {"bos_token": "<s>"}) == []
