"""Two vendor habits that are no steering (red team round 3's false positives, issue 33):

- a template reading a documented switch out of the system prompt (SmolLM3's ``/think``,
  ``/no_think``) controls its own protocol: the comparison is exempt (``guard_lines`` names its
  line) only when the switch is a slash flag, the ``if`` only sets flags, and every read of a flag
  picks between protocol texts (markup, the switch). A flag that picks any other text, or is read
  any other way, is a trigger and stays one;
- "Always respond in the same language as the user." is a norm on the language answers are
  written in (``NORM_RE``), not a directive over every answer; a second verb with an object is.

Generated inputs: the switch names, the text a flag picks, the languages and objects.
"""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import chat_template as ct
from warden.tokenscan import template_battery as tb

LIMITS = ct.RenderLimits(10, 1 << 20, 1 << 29)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SWITCHED = """{%- set ns = namespace(flag=true, system='') -%}
{%- if messages[0].role == 'system' -%}{%- set ns.system = messages[0].content -%}
{%- if 'OFF' in ns.system -%}{% set ns.flag = false %}{%- elif 'ON' in ns.system -%}{% set ns.flag = true %}{% endif %}
{%- set ns.system = ns.system.replace('OFF', '').replace('ON', '').strip() -%}
{%- endif -%}
<|im_start|>system
Mode: {{ 'ON' if ns.flag else 'OFF' }}
{{ ns.system }}<|im_end|>
{% for message in messages if message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt -%}<|im_start|>assistant
{{ PICK }}{%- endif -%}"""
MARKUP_PICK = "'' if ns.flag else '<think>\\n\\n</think>\\n'"
flag_name = st.text(string.ascii_lowercase + "_", min_size=2, max_size=12).filter(lambda s: s[0].isalpha())
sentence = st.lists(st.text(string.ascii_lowercase, min_size=2, max_size=8), min_size=2, max_size=6).map(" ".join)


def _switched(on: str, off: str, pick: str = MARKUP_PICK) -> str:
    return SWITCHED.replace("'OFF'", repr(off)).replace("'ON'", repr(on)).replace("{{ PICK }}", "{{ " + pick + " }}")


def _taint(template: str, system: str) -> list[tb.BehaviourIssue]:
    render = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}], "context": {}}
    answer = ct.run_battery(template, [render], LIMITS)
    assert answer["status"] == "ok", answer
    return tb.taint_issues(list(answer.get("taint") or []), SPECIALS, ct.guard_lines(template))


def test_a_switch_read_from_the_system_prompt_is_protocol() -> None:
    template = _switched("/think", "/no_think")
    assert ct.guard_lines(template) == {3, 4}  # the test and the strip
    assert _taint(template, "be brief /no_think") == []


def test_a_flag_that_picks_other_text_is_a_trigger() -> None:
    template = _switched("/think", "/no_think", "'' if ns.flag else 'Seven paper lanterns drift.'")
    assert ct.guard_lines(template) == frozenset()
    kinds = [i.kind for i in _taint(template, "be brief /no_think")]
    assert kinds and set(kinds) == {"taint"}, kinds


def test_a_flag_read_any_other_way_is_a_trigger() -> None:
    for pick in ("ns.flag", "ns['flag'] and 'x'", "ns", "'x' if ns['flag'] else 'y'"):
        assert ct.guard_lines(_switched("/a", "/b", pick)) == frozenset(), pick


def test_a_switch_is_a_slash_flag() -> None:
    assert ct.guard_lines(_switched("open sesame", "/b")) == frozenset()
    assert ct.guard_lines(_switched("on", "off")) == frozenset()


def test_another_comparison_on_the_switch_line_is_not_exempt() -> None:
    template = _switched("/a", "/b").replace(
        "{% endif %}\n{%- set ns.system", "{% endif %}{{ 'x' if ns.system == 'zq' }}\n{%- set ns.system", 1
    )
    assert "zq" in template
    assert 3 not in ct.guard_lines(template)


FAMILY_TEMPLATES = {
    n: getattr(fam, n) for n in dir(fam) if n.endswith("_TEMPLATE") and isinstance(getattr(fam, n), str)
}


def test_the_family_fixtures_have_no_switch_lines() -> None:
    assert len(FAMILY_TEMPLATES) >= 10
    for name, template in FAMILY_TEMPLATES.items():  # none reads a slash flag: nothing newly exempt
        assert not ct.switch_lines(ct.parse(template)), name


@SETTINGS
@given(on=flag_name, off=flag_name)
def test_any_slash_switch_of_protocol_markup_is_exempt(on: str, off: str) -> None:
    template = _switched("/" + on, "/" + off)
    assert ct.guard_lines(template) == {3, 4}


@SETTINGS
@given(on=flag_name, off=flag_name, text=sentence)
def test_a_switch_that_picks_any_words_is_no_switch(on: str, off: str, text: str) -> None:
    template = _switched("/" + on, "/" + off, "'' if ns.flag else " + repr(text))
    assert ct.guard_lines(template) == frozenset()
    template = _switched("/" + on, "/" + off, "'<think>' if ns.flag else " + repr("<think>" + text))
    assert ct.guard_lines(template) == frozenset()


LANGUAGE_NORMS = [
    "Always respond in the same language as the user.",
    "Always respond in the same language as the .",  # residual text: the role word is cut out
    "Always reply in the same language as the user's question.",
]
VERBS = ["respond", "reply", "answer"]
language = st.sampled_from(sorted(ct.LANGUAGES))


def test_a_language_norm_is_no_directive() -> None:
    for text in LANGUAGE_NORMS:
        assert ct.instruction_text(text) is None, text


@SETTINGS
@given(
    verb=st.sampled_from(VERBS), lang=language, scope=st.sampled_from(["Always", "In every answer,", "Never fail to"])
)
def test_answering_in_a_language_is_a_norm(verb: str, lang: str, scope: str) -> None:
    assert ct.instruction_text(f"{scope} {verb} in {lang}.") is None
    assert ct.instruction_text(f"{scope} {verb} in the same language as the user.") is None


@SETTINGS
@given(
    verb=st.sampled_from(VERBS), lang=language, thing=sentence, joiner=st.sampled_from([" and", ", then", " and also"])
)
def test_a_norm_with_a_second_directive_is_still_one(verb: str, lang: str, thing: str, joiner: str) -> None:
    why = ct.instruction_text(f"Always {verb} in {lang}{joiner} mention the {thing}.")
    assert why is not None and "every answer" in why, why
    why = ct.instruction_text(f"Always {verb} in {lang} about the {thing}.")  # more than a language: an object
    assert why is not None and "every answer" in why, why
