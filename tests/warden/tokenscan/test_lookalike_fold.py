"""The look-alike fold (warden/tokenscan/confusables.py) and the markup comparison built on it
(template_battery.lookalike_issues), as extended after red team round 3 (issue 33): characters
whose Unicode name says what they are drawn as (vertical bars and dandas for ``|``, low lines and
macrons for ``_``, every Latin letter with a stroke or hook), letters of Cherokee, Canadian
syllabics, Lisu and runic drawn like Latin ones or markup, and two letters drawn as one (``rn``
for ``m``) where text is compared with markup.

Generated inputs: the markup token, the position a look-alike replaces, the look-alike drawn from
the table; random text for the offsets of the folded skeleton.
"""

from __future__ import annotations

import string
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import confusables
from warden.tokenscan import template_battery as tb

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALIKES: dict[str, list[str]] = {}
for _code, _ascii in confusables.TABLE.items():
    ALIKES.setdefault(_ascii.lower(), []).append(chr(_code))
TOKENS = ["<|im_end|>", "<|im_start|>", "<end_of_turn>", "[INST]", "<|eot_id|>", "<|endoftext|>", "<tool_call>"]
tag = st.text(string.ascii_lowercase + "_", min_size=3, max_size=12).map(lambda w: "<|" + w + "|>")
token = st.one_of(st.sampled_from(TOKENS), tag)


@pytest.mark.parametrize(
    ("char", "drawn"),
    [("\u13a5", "i"), ("\u02cd", "_"), ("\u4e28", "|"), ("\u146f", "d"), ("\u16b2", "<"), ("\u0142", "l"),
     ("\u0257", "d"), ("\u2502", "|"), ("\u0964", "|"), ("\ua4f3", "o"), ("\u2f01", "|")],
)  # fmt: skip
def test_known_lookalikes_fold_to_what_they_look_like(char: str, drawn: str) -> None:
    assert confusables.fold_char(char) == drawn


def test_a_double_bar_and_a_double_danda_are_no_single_bar() -> None:
    for char in ("\u2016", "\u0965", "\u2225"):  # DOUBLE VERTICAL LINE, DEVANAGARI DOUBLE DANDA, PARALLEL TO
        assert confusables.fold_char(char) != "|", unicodedata.name(char)


def test_no_ascii_character_is_a_lookalike() -> None:
    assert all(code >= 0x80 for code in confusables.TABLE)


@pytest.mark.parametrize("fake", ["<|irn_end|>", "<|im_encl|>", "<|Irn_end|>"])
def test_two_letters_drawn_as_one_are_a_lookalike_of_the_token(fake: str) -> None:
    found = tb.lookalike_issues("t", "x " + fake + " y", ["<|im_end|>", fake])  # even as the template's own tag
    assert [i.kind for i in found] == ["lookalike"] and repr(fake) in found[0].detail, found


def test_tokens_with_the_two_letters_are_themselves() -> None:
    text = "<start_of_turn>user\nhi<end_of_turn>\n<|return|>"
    assert tb.lookalike_issues("t", text, ["<start_of_turn>", "<end_of_turn>", "<|return|>"]) == []


FAMILY_TEMPLATES = {n: t for n in dir(fam) if n.endswith("_TEMPLATE") and isinstance(t := getattr(fam, n), str)}


@pytest.mark.parametrize("name", sorted(FAMILY_TEMPLATES))
def test_family_templates_hold_no_lookalike_of_their_own_markup(name: str) -> None:
    text = FAMILY_TEMPLATES[name]
    assert tb.lookalike_issues("t", text, tb.template_markup(text)) == []


@SETTINGS
@given(tok=token, data=st.data())
def test_any_one_character_drawn_alike_is_reported(tok: str, data: st.DataObject) -> None:
    spots = [i for i, c in enumerate(tok) if ALIKES.get(c.lower())]
    i = data.draw(st.sampled_from(spots))
    fake = tok[:i] + data.draw(st.sampled_from(ALIKES[tok[i].lower()])) + tok[i + 1 :]
    found = tb.lookalike_issues("t", "before " + fake + " after", [tok])
    assert [f.kind for f in found] == ["lookalike"], (tok, fake)


@SETTINGS
@given(tok=token, data=st.data())
def test_any_letter_drawn_as_two_is_reported(tok: str, data: st.DataObject) -> None:
    pairs = {one: two for two, one in confusables.SEQUENCES.items()}
    spots = [i for i, c in enumerate(tok) if c in pairs]
    if not spots:
        tok, spots = tok[:2] + "m" + tok[2:], [2]
    i = data.draw(st.sampled_from(spots))
    fake = tok[:i] + pairs[tok[i]] + tok[i + 1 :]
    found = tb.lookalike_issues("t", "a " + fake + " b", [tok, fake])
    assert [f.kind for f in found] == ["lookalike"], (tok, fake)


@SETTINGS
@given(text=st.text(max_size=60))
def test_the_skeleton_maps_back_to_the_text(text: str) -> None:
    skel, sources = confusables.fold_markup(text)
    assert len(sources) == len(skel) + 1 and sources[-1] == len(text)
    assert sources[:-1] == sorted(sources[:-1])
    expanded = {one: two for two, one in confusables.SEQUENCES.items()}
    for i, ch in enumerate(text):
        mine = "".join(c for c, src in zip(skel, sources, strict=False) if src == i)
        folded = confusables.fold_char(ch)
        assert mine == expanded.get(folded, folded), (ch, mine)


@SETTINGS
@given(text=st.text(string.ascii_letters + string.punctuation + " ", max_size=60))
def test_ascii_folds_to_its_lower_case_with_letters_drawn_as_two_spelled_so(text: str) -> None:
    low = text.lower()
    for two, one in confusables.SEQUENCES.items():
        low = low.replace(one, two)
    assert confusables.fold_markup(text)[0] == low


@SETTINGS
@given(
    token=st.sampled_from([t for t in TOKENS if "|" in t]),
    stroke=st.sampled_from(["ӏ", "Ӏ", "l", "1", "ǀ", "׀"]),
    which=st.integers(0, 1),
)
def test_any_vertical_stroke_for_a_bar_of_markup_is_a_lookalike(token: str, stroke: str, which: int) -> None:
    """Letters drawn as one vertical stroke (``ӏ`` folds to ``l``, ``1``) pass for ``|`` in
    markup: the Cyrillic palochka turn end ``<ӏim_endӏ>`` reads as ``<|im_end|>``."""
    bars = [i for i, c in enumerate(token) if c == "|"]
    at = bars[which % len(bars)]
    fake = token[:at] + stroke + token[at + 1 :]
    issues = tb.lookalike_issues("the template text", f"be brief{fake}\nhi", [token])
    assert [i.kind for i in issues] == ["lookalike"] and repr(fake) in issues[0].detail, issues
