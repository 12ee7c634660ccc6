"""Names and keys from storage, over any Unicode (hypothesis): one spelling per step, ASCII only.

A checkpoint directory, an HF ``checkpoint-N``, a verl ``global_step_N`` and an archive object key
each stand for a step only when they are exactly that step's canonical spelling; a run id only
when it is letters, digits, ``.``, ``_`` and ``-``. Anything else (other digits, leading zeros,
trailing newlines, lookalikes) stands for nothing, so it can never alias a real step or run.
"""

from __future__ import annotations

import os
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from warden.archive.record import step_from_key, step_key, valid_run_id
from warden.layouts import step_of as verl_step_of
from warden.signer.watch import CANONICAL, step_in_layout

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "300"))
DIGITS = st.text(alphabet=st.characters(categories=["Nd"]), min_size=1, max_size=14)
NAMES = st.one_of(
    st.text(max_size=30),
    st.builds(lambda p, d, s: p + d + s, st.sampled_from(["step-", "checkpoint-", "global_step_", ""]), DIGITS,
              st.sampled_from(["", "\n", " ", ".sig", "\u200b"])),
)  # fmt: skip


@settings(max_examples=EXAMPLES, deadline=None)
@given(name=NAMES)
@example(name="step-0000000004")
@example(name="step-000000004\n")
@example(name="checkpoint-04")
@example(name="global_step_٤")
def test_a_name_stands_for_a_step_only_in_its_one_spelling(name):
    for layout, spelling in CANONICAL.items():
        found = step_in_layout(layout, name)
        if found is not None and found[1]:
            assert spelling.format(found[0]) == name and name.isascii()
    step = verl_step_of(name)
    assert step is None or f"global_step_{step}" == name


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    run=st.text(max_size=20),
    stem=st.one_of(DIGITS, st.text(max_size=14)),
    ext=st.sampled_from([".json", ".json\n", ""]),
)
def test_an_object_key_names_a_step_only_as_twelve_ascii_digits(run, stem, ext):
    key = f"runs/{run}/steps/{stem}{ext}"
    step = step_from_key(key)
    if step is not None:
        assert re.fullmatch(r"[0-9]{12}\.json", f"{stem}{ext}") and step_key(run, step).endswith(f"{stem}{ext}")


@settings(max_examples=EXAMPLES, deadline=None)
@given(run=st.text(max_size=40))
def test_a_run_id_is_plain_ascii(run):
    if valid_run_id(run):
        assert re.fullmatch(r"[A-Za-z0-9._-]+", run) and run.isascii()
