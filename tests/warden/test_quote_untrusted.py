"""The one sanitiser, warden.errors.quote_untrusted, over any Unicode (hypothesis).

Whatever text the storage writer chooses (file, key and object names, record fields), what is shown
is one line, at most the cap, holds no character a terminal would act on or hide (controls, escape
sequences, carriage returns, bidi overrides, zero-width characters, line/paragraph separators), and
two different inputs of printable text never show alike.
"""

from __future__ import annotations

import os
import unicodedata

from hypothesis import example, given, settings
from hypothesis import strategies as st

from warden.errors import quote_untrusted

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "300"))


def _acts_on_a_terminal(char: str) -> bool:
    return unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp") or char in "\n\r\t\v\f"


@settings(max_examples=EXAMPLES, deadline=None)
@given(text=st.text(alphabet=st.characters(codec=None), max_size=400), limit=st.integers(min_value=2, max_value=300))
@example(text="step-1\x1b[2K\rOK: signature verified\nforged", limit=200)
@example(text="evil\u202etxt.safetensors\u200b", limit=200)
@example(text="\x9b31m\x85\u2028\u2029", limit=200)
def test_what_is_shown_is_one_printable_capped_line(text, limit):
    shown = quote_untrusted(text, limit)
    assert len(shown) <= limit
    assert not any(_acts_on_a_terminal(c) for c in shown), repr(shown)


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=st.text(max_size=40), b=st.text(max_size=40))
@example(a="a\\x1bb", b="a\x1bb")
def test_different_names_never_show_alike_when_nothing_is_cut(a, b):
    # whitespace runs fold to one space by design; compare the folded forms
    fold_a, fold_b = " ".join(a.split()), " ".join(b.split())
    if fold_a != fold_b:
        assert quote_untrusted(a, 10_000) != quote_untrusted(b, 10_000)


def test_printable_text_is_kept_as_it_is():
    assert quote_untrusted("step-000000004 (réseau, 模型, 😀)") == "step-000000004 (réseau, 模型, 😀)"
    assert quote_untrusted("a\x1bb") == "a\\x1bb"
    assert quote_untrusted("C:\\x") == "C:\\x5cx"
