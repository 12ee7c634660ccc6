"""The sandbox records every comparison with a tainted operand, whatever the other side is
(sandbox_child.py, issue 33, red-team round 3): a constant laundered into a tainted value
(``content[:0] ~ 'secret'``) is judged as the constant itself, while content compared with
another message's content is the conversation's structure and is not judged; two clock
readings compared are a timing test, and judged. Checked with generated secrets and contents, and known cases."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden.tokenscan import chat_template as ct
from warden.tokenscan import template_battery as tb

LIMITS = ct.RenderLimits(10, 1 << 20, 1 << 29)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
C = "messages[0].content"
L = "(" + C + "[:0] ~ '{s}')"  # the secret, tainted by an empty slice of content
CONTENT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SECRET = st.text(string.ascii_lowercase, min_size=3, max_size=12).map(lambda s: "zq" + s)

LAUNDERED = {
    "equality": "{{ 'PAYLOAD' * (" + C + " == " + L + ") }}",
    "inequality": "{{ 'PAYLOAD' * (" + C + " != " + L + ") }}",
    "membership": "{{ 'PAYLOAD' * (" + L + " in " + C + ") }}",
    "startswith": "{{ " + C + ".startswith(" + L + ") and 'PAYLOAD' or '' }}",
    "endswith": "{{ " + C + ".endswith(" + L + ") and 'PAYLOAD' or '' }}",
    "find": "{{ 'PAYLOAD' * (" + C + ".find(" + L + ") >= 0) }}",
    "namespace": "{% set ns = namespace(k='') %}{% set ns.k = " + L + " %}{{ 'PAYLOAD' * (" + C + " == ns.k) }}",
    "select equalto": "{{ 'PAYLOAD' * ([" + C + "]|select('equalto', " + L + ")|list|length) }}",
    "content in a constant": "{{ 'PAYLOAD' * (" + C + " in 'xx {s} xx') }}",
    "content not in a laundered constant": "{{ 'PAYLOAD' * (" + C + " not in " + L + ") }}",
}
# content compared with content: structure, nothing judged
STRUCTURE = (
    "{% for m in messages %}{% if m.content == messages[0].content %}[same]{% endif %}{{ m.content }}{% endfor %}",
    "{% set b %}{{ " + C + " }}{% endset %}{{ b == " + C + " }}{{ (" + C + "|trim) != (" + C + "|trim) }}",
    "{% for m in messages %}{{ m.content in messages|map(attribute='content')|list }}{% endfor %}",
)


def _answer(template: str, contents: list[str], now: float | None = None) -> dict[str, Any]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    render: dict[str, Any] = {"messages": messages, "context": {}}
    if now is not None:
        render["now"] = now
    answer = ct.run_battery(template, [render], LIMITS)
    assert answer["status"] == "ok", answer
    assert answer["renders"][0]["status"] == "ok", answer["renders"][0]
    return answer


def _judged(answer: dict[str, Any], template: str) -> list[tb.BehaviourIssue]:
    return tb.taint_issues(list(answer.get("taint") or []), SPECIALS, ct.guard_lines(template))


@pytest.mark.parametrize("test", list(LAUNDERED))
@SETTINGS
@given(secret=SECRET, content=CONTENT)
def test_a_comparison_with_a_laundered_constant_is_judged_as_the_constant(test: str, secret: str, content: str) -> None:
    template = LAUNDERED[test].replace("{s}", secret)
    answer = _answer(template, [content])
    issues = _judged(answer, template)
    assert any(secret in issue.detail for issue in issues), answer["taint"]


@pytest.mark.parametrize("template", range(len(STRUCTURE)))
@SETTINGS
@given(contents=st.lists(CONTENT, min_size=1, max_size=4))
def test_content_compared_with_content_is_structure_not_judged(template: int, contents: list[str]) -> None:
    answer = _answer(STRUCTURE[template], contents)
    assert not _judged(answer, STRUCTURE[template]), answer["taint"]


@SETTINGS
@given(code=st.integers(min_value=0, max_value=2359).map(lambda n: f"{n:04d}"), minute=st.integers(0, 1439))
def test_the_clock_compared_with_a_laundered_constant_is_judged(code: str, minute: int) -> None:
    template = "{{ 'PAYLOAD' * (strftime_now('%H%M') == (strftime_now('')[:0] ~ '" + code + "')) }}"
    answer = _answer(template, ["hi"], now=1767225600.0 + 60 * minute)
    issues = _judged(answer, template)
    assert any(code in issue.detail and "the date" in issue.detail for issue in issues), answer["taint"]


@SETTINGS
@given(n=st.integers(min_value=2, max_value=5000))
def test_two_tainted_numbers_compared_are_recorded_by_the_plain_value(n: int) -> None:
    template = "{{ 'PAYLOAD' * ((strftime_now('%M')|int) == (strftime_now('%M')|int) * 0 + " + str(n) + ") }}"
    answer = _answer(template, ["hi"])
    records = [r for r in answer["taint"] if r[0] == "date" and r[2] == str(n)]
    assert records, answer["taint"]
    assert _judged(answer, template)


@SETTINGS
@given(fmt=st.sampled_from(["%S", "%H%M", "%Y", "%d %b"]), minute=st.integers(0, 1439))
def test_two_clock_readings_compared_are_a_timing_test_and_judged(fmt: str, minute: int) -> None:
    template = "{{ 'PAYLOAD' * (strftime_now('" + fmt + "') != strftime_now('" + fmt + "')) }}"
    answer = _answer(template, ["hi"], now=1767225600.0 + 60 * minute)
    assert any("the date" in issue.detail for issue in _judged(answer, template)), answer["taint"]
