"""The judge runs in the scanner process (issue 33): its comparisons are bounded by construction.
A word diff trims common ends and aligns the rest with an LCS table under a fixed cell budget
(what the budget cannot align is changed, never equal); the date-word test is plain string
tests (no nested quantifier to backtrack); the clock comparison is linear; renders past the
judges' bounds are findings, and only their bounded prefix is read."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden.tokenscan import conversations as conv
from warden.tokenscan import template_battery as tb

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = st.lists(st.sampled_from(["a", "b", "c", " ", "\n", "x", "Mon", "2024"]), max_size=40)


def _lcs_length(a: list[str], b: list[str]) -> int:
    """Reference: the LCS length by the textbook recurrence, one row at a time."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev, row = row, [0]
        for j, y in enumerate(b):
            row.append(prev[j] + 1 if x == y else max(prev[j + 1], row[j]))
    return row[-1]


def _check_opcodes(a: list[str], b: list[str], ops: list[conv.Opcode]) -> int:
    """The opcodes cover both sides in order, their equal blocks are equal, and they turn a into b;
    returns how many words they match."""
    i = j = matched = 0
    rebuilt: list[str] = []
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j) and i2 >= i1 and j2 >= j1 and tag in ("equal", "replace", "delete", "insert")
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
            matched += i2 - i1
        rebuilt += b[j1:j2]
        i, j = i2, j2
    assert (i, j) == (len(a), len(b)) and rebuilt == b
    return matched


@SETTINGS
@given(WORDS, WORDS)
def test_word_opcodes_are_exact_within_the_budget(a: list[str], b: list[str]) -> None:
    assert _check_opcodes(a, b, conv.word_opcodes(a, b)) == _lcs_length(a, b)


@SETTINGS
@given(WORDS, WORDS, st.integers(0, 64))
def test_word_opcodes_past_the_budget_stay_sound_and_fill_at_most_the_budget(
    a: list[str], b: list[str], cells: int
) -> None:
    filled: list[int] = []
    real = conv._lcs

    def counting(x: list[str], y: list[str]) -> list[tuple[int, int]]:
        filled.append(len(x) * len(y))
        return real(x, y)

    conv._lcs = counting  # type: ignore[assignment]
    try:
        ops = conv.word_opcodes(a, b, cells)
    finally:
        conv._lcs = real  # type: ignore[assignment]
    assert _check_opcodes(a, b, ops) <= _lcs_length(a, b)
    assert sum(filled) <= cells


def test_a_uniform_render_costs_no_table_at_all() -> None:
    """400k identical words (the red-team render): one side's suffix differs, the ends are
    trimmed by slice comparisons and no LCS cell is filled beyond the few differing words."""
    a = ["x", " "] * 400_000
    b = [*a[:-2], "y", " "]
    ops = conv.word_opcodes(a, b)
    assert [op for op in ops if op[0] != "equal"] == [("replace", 799_998, 799_999, 799_998, 799_999)]


DATE_NAMES = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun|am|pm"
REFERENCE = re.compile(rf"[ \t\n\r\f\v0-9,.:/\-]*|(?:{DATE_NAMES})[a-z]*")  # one word, lowercased: no nested repetition


@SETTINGS
@given(st.text(alphabet=st.sampled_from("monMONdayJanFRIé 09,.:-_x"), max_size=30))
def test_the_date_word_test_agrees_with_a_flat_pattern(word: str) -> None:
    for token in conv.WORD_RE.findall(word) or [word]:
        assert conv.is_date_word(token) == bool(REFERENCE.fullmatch(token.lower())), token


def test_a_word_built_to_backtrack_is_judged_in_one_pass() -> None:
    word = "mon" * 200_000 + "\u00e9"  # the red team's word, longer: a nested pattern never returns
    assert not conv.is_date_word(word) and conv.is_date_word("mon" * 200_000)
    assert conv.novel_text(f"hello {word}", frozenset({"hello"}), 24) is not None


@SETTINGS
@given(
    st.lists(st.sampled_from(["Today", " ", "is", "\n", "<|x|>", "hello", "Q1x0y"]), max_size=30),
    st.sampled_from(["Mon 1 Jan 2024", "2030-06-11", "Friday, 12:30 PM", ""]),
    st.sampled_from(["Tue 2 Feb 2025", "2024-02-29", "Sunday, 00:05 am"]),
    st.integers(0, 30),
)
def test_the_clock_may_change_date_material_only(words: list[str], date: str, other: str, at: int) -> None:
    head, tail = "".join(words[:at]), "".join(words[at:])
    assert conv.date_difference(f"{head} {date} {tail}", f"{head} {other} {tail}") is None
    moved = conv.date_difference(f"{head} {date} {tail}", f"{head} {other} obey {tail}")
    assert moved is not None and "obey" in moved


def test_a_render_past_the_generated_judges_bound_is_a_finding_read_to_the_bound() -> None:
    renders = conv.generate("bounds", 1, {"add_generation_prompt": True, "tools": None, "documents": None})
    a, b, _t = renders
    big = "".join(a["texts"]) + "x " * conv.JUDGE_CHARS
    answer = {"status": "ok", "renders": [{"status": "ok", "output": o} for o in (big, "".join(b["texts"]), big)]}
    kinds = [i.kind for i in conv.judge(renders, answer)]
    assert "text" in kinds
    assert len(conv.abstract(big, a["texts"])) <= conv.MARKUP_CHARS


def test_a_battery_render_past_its_bound_is_a_finding() -> None:
    renders = tb.battery_renders({"add_generation_prompt": True})
    outputs: list[dict[str, Any]] = []
    for r in renders:
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in r["messages"])
        outputs.append({"status": "ok", "output": body})
    assert tb.judge(renders, {"status": "ok", "renders": outputs}, ("<|im_start|>", "<|im_end|>"), 24) == []
    outputs[0] = {"status": "ok", "output": "x " * tb.BATTERY_JUDGE_CHARS + outputs[0]["output"]}
    found = tb.judge(renders, {"status": "ok", "renders": outputs}, ("<|im_start|>", "<|im_end|>"), 24)
    assert any(i.kind == "text" and str(tb.BATTERY_JUDGE_CHARS) in i.detail for i in found), found


def test_renders_that_differ_over_more_than_a_date_are_not_split_into_words() -> None:
    """Two renders at two times differing over more than the judge's markup bound differ by more than
    a date: reported as such without a word list of either."""
    a, b = "<|x|>" + "Mon " * conv.MARKUP_CHARS, "<|x|>" + "Tue " * conv.MARKUP_CHARS
    real = conv.WORD_RE
    conv.WORD_RE = None  # type: ignore[assignment]  # splitting into words would raise
    try:
        moved = conv.date_difference(a, b)
    finally:
        conv.WORD_RE = real
    assert moved is not None and "characters differ" in moved
