"""The sandbox's taint (sandbox_child.py, issue 33, red-team round 3) follows content into bytes
(``encode()``, and ``decode()`` back), into the pieces ``|list``/``|batch`` make of it (their
length, a loop over them), and into what a loop over content stores in a namespace (a counter
incremented per character); loops over the conversation stay untainted, and the renders are
transformers' own. Checked with generated secrets, bounds and contents."""

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
CONTENT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SECRET = st.text(string.ascii_lowercase, min_size=3, max_size=12).map(lambda s: "zq" + s)

BYTES = {
    "bytes equality": "{{ 'PAYLOAD' * (" + C + ".encode() == '{s}'.encode()) }}",
    "decoded copy": "{{ 'PAYLOAD' * (" + C + ".encode().decode() == '{s}') }}",
    "bytes membership": "{{ 'PAYLOAD' * ('{s}'.encode() in " + C + ".encode()) }}",
    "bytes startswith": "{{ " + C + ".encode().startswith('{s}'.encode()) and 'PAYLOAD' or '' }}",
    "lowered bytes": "{{ 'PAYLOAD' * (" + C + ".encode().lower() == '{s}'.encode()) }}",
    "bytes sliced": "{{ 'PAYLOAD' * (" + C + ".encode()[:12] == '{s}'.encode()) }}",
}
MEASURES = {
    "list length": "{{ 'PAYLOAD' * ((" + C + "|list|length) > {n}) }}",
    "joined list length": "{{ 'PAYLOAD' * ((messages|map(attribute='content')|join|list|length) > {n}) }}",
    "batch loop index": "{% for _ in " + C + "|batch(1) %}{{ 'PAYLOAD' if loop.index == {n} }}{% endfor %}",
    "batch length": "{{ 'PAYLOAD' * ((" + C + "|batch(1)|list|length) == {n}) }}",
    "loop length": "{% for ch in " + C + " %}{{ 'PAYLOAD' if loop.length == {n} }}{% endfor %}",
    "character counter": "{% set ns = namespace(n=0) %}{% for ch in " + C + " %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{{ 'PAYLOAD' * (ns.n > {n}) }}",
    "counter after a break": "{% set ns = namespace(n=0) %}{% for ch in " + C + " %}{% set ns.n = ns.n + 1 %}"
    "{% if ns.n > {n} %}{% break %}{% endif %}{% endfor %}{{ 'PAYLOAD' * (ns.n > {n}) }}",
    "bytes length": "{{ 'PAYLOAD' * ((" + C + ".encode()|length) == {n}) }}",
}
SHAPE = (  # counts of the conversation, not of content: nothing judged
    "{% set ns = namespace(i=0, last=-1) %}{% for m in messages %}{% set ns.i = ns.i + 1 %}"
    "{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.i == 3 }}{{ ns.last == 2 }}",
    "{% for m in messages %}{{ loop.index == 2 }}{{ loop.length > 3 }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for ch in " + C + " %}{% endfor %}{% set ns.n = ns.n + 1 %}{{ ns.n == 5 }}",
    "{% for m in messages %}{{ m.content|list|join }}{{ m.content.encode()|length > 0 }}{% endfor %}",
)


def _answer(template: str, contents: list[str]) -> dict[str, Any]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    answer = ct.run_battery(template, [{"messages": messages, "context": {}}], LIMITS)
    assert answer["status"] == "ok", answer
    assert answer["renders"][0]["status"] == "ok", answer["renders"][0]
    return answer


def _judged(answer: dict[str, Any], template: str) -> list[tb.BehaviourIssue]:
    return tb.taint_issues(list(answer.get("taint") or []), SPECIALS, ct.guard_lines(template))


@pytest.mark.parametrize("test", list(BYTES))
@SETTINGS
@given(secret=SECRET, content=CONTENT)
def test_content_as_bytes_compared_is_judged_with_the_constant(test: str, secret: str, content: str) -> None:
    template = BYTES[test].replace("{s}", secret)
    answer = _answer(template, [content])
    assert any(secret in issue.detail for issue in _judged(answer, template)), answer["taint"]


@pytest.mark.parametrize("measure", list(MEASURES))
@SETTINGS
@given(n=st.integers(min_value=2, max_value=5000), content=CONTENT.filter(bool))
def test_content_measured_through_its_pieces_or_a_loop_is_judged(measure: str, n: int, content: str) -> None:
    template = MEASURES[measure].replace("{n}", str(n))
    answer = _answer(template, [content])
    issues = _judged(answer, template)
    assert any(str(n) in issue.detail for issue in issues), answer["taint"]


@pytest.mark.parametrize("template", range(len(SHAPE)))
@SETTINGS
@given(contents=st.lists(CONTENT, min_size=1, max_size=5))
def test_counts_of_the_conversation_are_not_judged(template: int, contents: list[str]) -> None:
    answer = _answer(SHAPE[template], contents)
    assert not _judged(answer, SHAPE[template]), answer["taint"]


def _transformers_render(template: str, messages: list[dict[str, Any]]) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return str(_compile_jinja_template(template).render(messages=messages))


PARITY = (
    *(t.replace("{s}", "zqab") for t in BYTES.values()),
    *(t.replace("{n}", "3") for t in MEASURES.values()),
    *SHAPE,
    "{{ "
    + C
    + ".encode() }}|{{ "
    + C
    + ".encode()|list }}|{{ "
    + C
    + ".encode().decode() }}|{{ "
    + C
    + "|batch(2)|list }}",
)


@pytest.mark.parametrize("template", range(len(PARITY)))
@settings(max_examples=15, deadline=None)
@given(contents=st.lists(CONTENT, min_size=1, max_size=3))
def test_the_sandbox_renders_these_as_transformers_does(template: int, contents: list[str]) -> None:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    answer = _answer(PARITY[template], contents)
    assert answer["renders"][0]["output"] == _transformers_render(PARITY[template], messages)
