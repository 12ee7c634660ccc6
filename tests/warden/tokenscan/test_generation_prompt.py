"""The generation prompt (what ``add_generation_prompt`` adds to a render) opens the answer and
nothing else: role markup whose role is the assistant's, no words (template_battery.judge, after
red team round 6 of issue 33). A prefilled "Sure, here is" steers every answer; a user header makes
the model write the user's next turn. Generated inputs: the role the prompt opens, the words after
it, whether the render without the prompt ends its last turn differently."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import chat_template as ct
from warden.tokenscan import template_battery as tb

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
CTX = {"bos_token": "<s>", "eos_token": "<|im_end|>", "add_generation_prompt": True}
LIMITS = ct.RenderLimits(2.0, 1 << 20, 1 << 30)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<s>")
WORDS = st.lists(st.sampled_from(["Sure", "here", "is", "the", "answer", "Certainly", "step"]), min_size=1, max_size=5)


def _template(role: str, prefill: str, eos_when_off: bool) -> str:
    off = "{% if not add_generation_prompt %}</s>{% endif %}" if eos_when_off else ""
    return (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        + off
        + "{% if add_generation_prompt %}<|im_start|>"
        + role
        + "\n"
        + prefill
        + "{% endif %}"
    )


def _kinds(template: str) -> list[tuple[str, str]]:
    renders = tb.battery_renders(CTX)
    answer = ct.run_battery(template, renders, LIMITS)
    return [(i.kind, i.detail) for i in tb.judge(renders, answer, SPECIALS, 200) if "generation prompt" in i.detail]


@SETTINGS
@given(role=st.sampled_from(["user", "system", "developer", "tool"]), eos=st.booleans())
def test_a_generation_prompt_opening_another_role_is_a_role_issue(role, eos):
    found = _kinds(_template(role, "", eos))
    assert [k for k, _ in found] == ["role"] and repr(role) in found[0][1], found


@SETTINGS
@given(words=WORDS, eos=st.booleans())
def test_words_after_the_generation_prompt_header_are_a_text_issue(words, eos):
    prefill = " ".join(words)
    found = _kinds(_template("assistant", prefill, eos))
    assert [k for k, _ in found] == ["text"] and words[0] in found[0][1], found


@SETTINGS
@given(eos=st.booleans(), think=st.booleans())
def test_an_assistant_header_alone_or_with_an_empty_think_block_is_clean(eos, think):
    assert _kinds(_template("assistant", "<think>\n\n</think>\n\n" if think else "", eos)) == []


@pytest.mark.parametrize("name", sorted(fam.CURRENT_TEMPLATES))
def test_family_generation_prompts_are_clean(name):
    assert _kinds(fam.CURRENT_TEMPLATES[name]) == []


def test_the_generation_prompt_is_what_the_render_adds_past_the_common_start():
    assert tb.generation_prompt("a<x>b<|im_start|>assistant\n", "a<x>b</s>") == "<|im_start|>assistant\n"
    assert tb.generation_prompt("same", "same") == ""
    assert tb.generation_prompt("abc", "ab") == "c"


def _masked(wrapped: frozenset[str]) -> str:
    """ChatML with ``{% generation %}`` around the messages of the ``wrapped`` roles."""
    roles = sorted(wrapped)
    return (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role in " + repr(roles) + " %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
        "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


@SETTINGS
@given(others=st.sets(st.sampled_from(["user", "system"]), min_size=1), with_assistant=st.booleans())
def test_a_generation_block_holding_another_roles_message_is_a_role_issue(others, with_assistant):
    """``return_assistant_tokens_mask`` trains on what ``{% generation %}`` marks: the assistant's
    messages only; a block around a user or system message trains the model on it."""
    wrapped = frozenset(others | ({"assistant"} if with_assistant else set()))
    renders = tb.battery_renders(CTX)
    answer = ct.run_battery(_masked(wrapped), renders, LIMITS)
    found = [i for i in tb.judge(renders, answer, SPECIALS, 200) if "generation %}" in i.detail]
    assert [i.kind for i in found] == ["role"] and any(r in found[0].detail for r in others), found


def test_a_generation_block_around_the_assistant_alone_is_clean():
    renders = tb.battery_renders(CTX)
    answer = ct.run_battery(_masked(frozenset({"assistant"})), renders, LIMITS)
    assert any(r.get("generation") for r in answer["renders"])  # the blocks were seen
    assert [i for i in tb.judge(renders, answer, SPECIALS, 200) if "generation" in i.detail] == []
