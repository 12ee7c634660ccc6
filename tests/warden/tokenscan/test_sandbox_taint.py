"""The sandbox's run-time taint (sandbox_child.py, issue 33) follows message content and the clock
through every construct that copies, measures or derives from them, so content-keyed behaviour
without an ``if`` is recorded and judged (template_battery.taint_issues); templates that only
format content uniformly (the family fixtures, and formatting constructs on generated content)
record nothing that is judged; and the sandbox renders exactly what transformers' own template
environment renders (the taint machinery changes no output).

Each property is checked with generated inputs (hypothesis: the content, the secret a trigger
compares with, the numbers) and a few known cases."""

from __future__ import annotations

import datetime
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import chat_template as ct
from warden.tokenscan import template_battery as tb

LIMITS = ct.RenderLimits(10, 1 << 20, 1 << 29)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
C = "messages[0].content"

# a copy of content as a plain str in jinja, then a test of it against the secret {s}
COPIES = {
    "join method": "''.join([" + C + "])",
    "format method": "'{}'.format(" + C + ")",
    "percent": "('%s' % " + C + ")",
    "percent tuple": "('%s' % (" + C + ",))",
    "ljust": C + ".ljust(0)",
    "translate": C + ".translate({})",
    "center": C + ".center(0)",
    "zfill": C + ".zfill(0)",
    "tilde": "(" + C + " ~ '')",
    "join filter": "([" + C + "]|join)",
    "list join": "(" + C + "|list|join)",
    "batch map join": "(" + C + "|batch(1)|map('join')|join)",
    "escape": "(" + C + "|e)",
    "string filter": "(" + C + "|string)",
    "format filter": "('%s'|format(" + C + "))",
    "trim": "(" + C + "|trim)",
    "slice": C + "[:]",
    "reverse twice": "(" + C + "|reverse|reverse|join)",
}
TESTS = {
    "equality": "{{ 'PAYLOAD' * (X == '{s}') }}",
    "membership": "{{ 'PAYLOAD' * ('{s}' in X) }}",
    "dict lookup": "{{ {'{s}': 'PAYLOAD'}.get(X, '') }}",
    "startswith": "{{ X.startswith('{s}') and 'PAYLOAD' or '' }}",
    "select equalto": "{{ 'PAYLOAD' * ([X]|select('equalto', '{s}')|list|length) }}",
    "replace": "{{ X|replace('{s}', 'PAYLOAD') }}",
}
# constructs whose only content-keyed act is on a number or a test without a constant
NUMBERS = {
    "floor division": "{{ 'PAYLOAD' * ((" + C + "|length) // {n}) }}",
    "abs slice bound": "{{ 'PAYLOAD'[((" + C + "|length) - {n})|abs * 999:] }}",
    "range of a length": "{% for _ in range((" + C + "|length) // {n}) %}PAYLOAD{% endfor %}",
    "int compared": "{{ 'PAYLOAD' * ((" + C + "|int(0)) == {n}) }}",
    "wordcount": "{{ 'PAYLOAD' * ((" + C + "|wordcount) == {n}) }}",
    "length in a dict": "{{ {{n}: 'PAYLOAD'}.get(" + C + "|length, '') }}",
    "index by a length": "{{ ['a', 'PAYLOAD'][((" + C + "|length) // {n}) % 2] }}",
    "isdigit": "{{ 'PAYLOAD' * " + C + ".ljust(0).isdigit() }}",
    "istitle": "{{ " + C + ".istitle() and 'PAYLOAD' or '' }}",
    "caller output": "{% macro w() %}{{ caller()|replace('z{n}', 'PAYLOAD') }}{% endmacro %}"
    "{% call w() %}{{ " + C + " }}{% endcall %}",
    "set block": "{% set b %}{{ " + C + " }}{% endset %}{{ {'z{n}': 'PAYLOAD'}.get(b, '') }}",
    "clock minute": "{{ 'PAYLOAD' * ((strftime_now('%H%M')|int) == {n}) }}",
    "clock arithmetic": "{{ 'PAYLOAD' * ((strftime_now('%M')|int) // {n}) }}",
}
# uniform formatting of content: nothing judged, whatever the content
UNIFORM = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content|trim }}<|im_end|>\n{% endfor %}",
    "{% for m in messages %}{{ m.content|tojson }}{{ m.content|e }}{{ m.content.ljust(0) }}{% endfor %}",
    "{% for m in messages %}{{ '%s' % m.content }}{{ '{}'.format(m.content) }}{{ [m.content]|join }}{% endfor %}",
    "{% for m in messages %}{% set b %}{{ m.content }}{% endset %}{{ b|upper }}{{ b|lower|title }}{% endfor %}",
    "{% macro w() %}[{{ caller()|trim }}]{% endmacro %}{% for m in messages %}{% call w() %}{{ m.content }}"
    "{% endcall %}{% endfor %}",
    "{% for m in messages %}{% if m.content is string and m.content|length > 0 %}{{ m.content[:] }}"
    "{% endif %}{% if '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}{% endif %}{% endfor %}",
    "{% for m in messages %}{{ m.content|center(0) }}{{ m.content|indent(2) }}{{ m.content|list|join }}"
    "{{ (m.content ~ '\\n')|trim }}{{ m.content|replace('\\n', ' ') }}{% endfor %}{{ strftime_now('%d %b %Y') }}",
)
CONTENT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SECRET = st.text(string.ascii_lowercase, min_size=3, max_size=12).map(lambda s: "zq" + s)


def _answer(template: str, content: str, now: float | None = None) -> dict[str, Any]:
    render: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "context": {}}
    if now is not None:
        render["now"] = now
    answer = ct.run_battery(template, [render], LIMITS)
    assert answer["status"] == "ok", answer
    assert answer["renders"][0]["status"] == "ok", answer["renders"][0]
    return answer


def _judged(answer: dict[str, Any], template: str = "") -> list[tb.BehaviourIssue]:
    """The taint records as the scanner judges them (markup constants and refusing guards are not)."""
    return tb.taint_issues(list(answer.get("taint") or []), SPECIALS, ct.guard_lines(template))


@pytest.mark.parametrize("copy", list(COPIES))
@pytest.mark.parametrize("test", list(TESTS))
@SETTINGS
@given(secret=SECRET, content=CONTENT.filter(bool))  # '' splits into no pieces: nothing left to compare
def test_a_test_of_a_copy_of_content_is_recorded_with_its_constant(
    copy: str, test: str, secret: str, content: str
) -> None:
    template = TESTS[test].replace("X", COPIES[copy]).replace("{s}", secret)
    answer = _answer(template, content)
    constants = [str(r[2]) for r in answer["taint"] if r[0] == "content"]
    assert any(secret in c for c in constants) or (test == "dict lookup" and "a dict or set" in constants), (
        template,
        answer["taint"],
    )
    assert _judged(answer), answer["taint"]


@pytest.mark.parametrize("construct", list(NUMBERS))
@SETTINGS
@given(n=st.integers(min_value=2, max_value=5000), content=CONTENT, minute=st.integers(0, 1439))
def test_numbers_and_tests_derived_from_content_or_the_clock_are_judged(
    construct: str, n: int, content: str, minute: int
) -> None:
    template = NUMBERS[construct].replace("{n}", str(n))
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp() + 60 * minute
    answer = _answer(template, content, now)
    source = "date" if construct.startswith("clock") else "content"
    assert [r for r in answer["taint"] if r[0] == source], (template, answer["taint"])
    assert _judged(answer), answer["taint"]


@pytest.mark.parametrize("template", range(len(UNIFORM)))
@SETTINGS
@given(content=CONTENT)
def test_uniform_formatting_of_any_content_is_not_judged(template: int, content: str) -> None:
    answer = _answer(UNIFORM[template], content)
    assert not _judged(answer, UNIFORM[template]), answer["taint"]


@pytest.mark.parametrize("family", [*sorted(fam.CURRENT_TEMPLATES), "qwen2.5", "llama3.1", "gemma", "mistral"])
@SETTINGS
@given(contents=st.lists(CONTENT.filter(str.strip), min_size=1, max_size=3))
def test_family_templates_record_nothing_judged_for_any_content(family: str, contents: list[str]) -> None:
    text = (
        fam.CURRENT_TEMPLATES.get(family)
        or {
            "qwen2.5": fam.QWEN25_TEMPLATE,
            "llama3.1": fam.LLAMA31_TEMPLATE,
            "gemma": fam.GEMMA_TEMPLATE,
            "mistral": fam.MISTRAL_TEMPLATE,
        }[family]
    )
    messages: list[dict[str, Any]] = []
    for i, content in enumerate(contents):
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": f"{content} {i}"}]
    context = {"add_generation_prompt": False, "bos_token": "<s>", "eos_token": "</s>"}
    answer = ct.run_battery(text, [{"messages": messages, "context": context}], LIMITS)
    assert answer["renders"][0]["status"] == "ok", answer["renders"][0]
    assert not _judged(answer, text), answer["taint"]


# ---------------------------------------------------------------------------- parity with transformers
PARITY = (  # C is the message content; identity (is sameas) answers as CPython's str methods do
    "{{ 'TemplateDict' in (dict|string) }} {{ 'TemplateNamespace' in (namespace|string) }}",
    "{{ (dict|string)[:60] }}|{{ namespace|string }}|{{ dict(a=1) }}|{{ dict.fromkeys(['k']) }}",
    "{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a + ns.b }}",
    "{{ (C|length) is sameas (C|count) }} {{ (C|length) is sameas (C|length) }}",
    "{{ C.splitlines(keepends=True)|length }} {{ C.split(sep=' ') }} {{ C.replace('a', 'b', 1) }}",
    "{{ none[1:] }}|{{ C[1:] }}|{{ C[::-1] }}|{{ [1, 2, 3][(C|length) % 3:] }}",
    "{{ C|e + '<b>' }}|{{ (C|e).replace('<', '>') }}|{{ C|e|length }}|{{ (C|e)[1:] }}",
    "{{ (C|length) // 3 }} {{ ((C|length) / 2)|round }} {{ -(C|length) }} {{ (C|length) ** 2 }} {{ C|wordcount }}",
    "{{ '%5.3s|' % C }}{{ '{:>4}'.format(C) }}{{ C.ljust(3, '.') }}{{ C * 2 }}{{ C|int(-1) + 1 }}",
    "{{ C|tojson }} {{ C|list|first if C else '' }} {{ C|batch(2)|map('join')|list }}",
    "{{ {C: 1}|dictsort }} {{ [C, 'x']|sort }} {{ [C]|select('equalto', 'x')|list }} {{ C.isdigit() }}",
    "{% set b %}{{ C }}{% endset %}{{ b == C }} {{ b|length }} {% macro w() %}{{ caller() }}{% endmacro %}"
    "{% call w() %}{{ C }}{% endcall %}",
    "{{ raise_exception is callable }} {{ strftime_now is defined }} {{ (raise_exception|string)[:40] }}",
)
IDENTITY = (
    "{{ C.strip() is sameas C }} {{ C[:] is sameas C }} {{ (C ~ '') is sameas C }} {{ ''.join([C]) is sameas C }}"
    " {{ ([C]|join) is sameas C }} {{ C.split('|')[0] is sameas C }} {{ C.ljust(2) is sameas C }}"
    " {% set b %}{{ C }}{% endset %}{{ b is sameas C }} {{ C.lower() is sameas C }} {{ (C + '') is sameas C }}"
    " {{ (C|float) is sameas (C|float) }} {{ (C|length) is sameas (C|length) }}"
)


def _transformers_render(template: str, messages: list[dict[str, Any]]) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return str(_compile_jinja_template(template).render(messages=messages))


@pytest.mark.parametrize("template", range(len(PARITY)))
@settings(max_examples=20, deadline=None)
@given(content=CONTENT)
def test_the_sandbox_renders_what_transformers_renders(template: int, content: str) -> None:
    text = PARITY[template].replace("C", "messages[0].content")
    messages = [{"role": "user", "content": content}]
    answer = ct.run_battery(text, [{"messages": messages, "context": {}}], LIMITS)
    result = answer["renders"][0]
    try:
        expected: str | None = _transformers_render(text, messages)
    except Exception as exc:  # the loader raises: so must the sandbox
        assert result["status"] == "error", (result, exc)
        expected = None
    if expected is not None:
        assert result["status"] == "ok", result
        assert _without_addresses(result["output"]) == _without_addresses(expected)


@settings(max_examples=30, deadline=None)
@given(content=st.text(st.characters(blacklist_categories=("Cs",)), min_size=2, max_size=300))
def test_identity_of_content_answers_as_in_the_loader_and_is_recorded(content: str) -> None:
    """``is sameas`` on content is CPython's answer for the str methods that return their very
    object when nothing changed; ``''`` and one-character strings are CPython singletons a Probe
    cannot be, which is why every identity test of content is also recorded (judged)."""
    text = IDENTITY.replace("C", "messages[0].content")
    messages = [{"role": "user", "content": content}]
    answer = ct.run_battery(text, [{"messages": messages, "context": {}}], LIMITS)
    assert answer["renders"][0]["output"] == _transformers_render(text, messages)
    assert [r for r in answer["taint"] if r[1] == "sameas"] and _judged(answer)


def _without_addresses(text: str) -> str:
    import re

    return re.sub(r" at 0x[0-9a-f]+", " at 0x", text)


def test_fingerprints_of_the_environment_are_recorded() -> None:
    answer = _answer("{{ 'x' if 'TemplateDict' in (dict|string) }}{{ 'y' if 'Template' in (namespace|string) }}", "hi")
    expected = [["environment", "in", "TemplateDict"], ["environment", "in", "Template"]]
    assert [r[:3] for r in answer["taint"]] == expected
    assert answer["renders"][0]["output"] == "xy"


@SETTINGS
@given(extra=st.integers(min_value=1, max_value=200), secret=SECRET)
def test_a_flood_of_harmless_comparisons_cannot_hide_a_trigger(extra: int, secret: str) -> None:
    flood = "{% for i in range(" + str(256 + extra) + ") %}{{ ('<t' ~ i ~ '>') in " + C + " }}{% endfor %}"
    answer = _answer(flood + "{{ 'PAYLOAD' * (" + C + " == '" + secret + "') }}", "hello")
    assert [r for r in answer["taint"] if r[1] == "overflow"], answer["taint"][-3:]
    assert _judged(answer)


SHAPE = (
    "{% for m in messages %}{{ messages.index(m) == 0 }}{{ loop.index0 == messages|length - 1 }}"
    "{{ (messages|selectattr('role', 'equalto', 'user')|list|length) > 2 }}{{ [m]|length == 1 }}{% endfor %}"
)


@SETTINGS
@given(contents=st.lists(CONTENT, min_size=1, max_size=4))
def test_the_shape_of_the_conversation_is_not_content(contents: list[str]) -> None:
    messages = [{"role": "user", "content": c} for c in contents]
    answer = ct.run_battery(SHAPE, [{"messages": messages, "context": {}}], LIMITS)
    assert answer["renders"][0]["status"] == "ok", answer
    assert answer["taint"] == []


@settings(max_examples=10, deadline=None)
@given(digits=st.integers(min_value=4400, max_value=20000))
def test_a_comparison_with_a_huge_number_behaves_as_in_the_loader(digits: int) -> None:
    """Recording a comparison never makes it fail: a constant past Python's int-to-str digit limit is
    recorded by its size (a render failing in the sandbox only would blind the scan)."""
    big = "{% set ns = namespace(b=10) %}{% set big = ns.b ** " + str(digits) + " %}"  # not folded: computed
    template = big + "{{ 'PAYLOAD' * ((" + C + "|length) < big) }}"
    answer = _answer(template, "hi")
    assert answer["renders"][0]["output"] == _transformers_render(template, [{"role": "user", "content": "hi"}])
    assert [r for r in answer["taint"] if r[1] == "length lt" and "bits" in r[2]], answer["taint"]
    assert _judged(answer)


# generated expressions over content: whatever the taint machinery does, the render is the loader's
ATOMS = ("C", "(C|length)", "'ab c'", "3", "-2", "2.5", "C.split()", "[C, 'x']", "{'k': C}", "(C|int(7))", "C[1:]",
         "C.strip()", "(C|e)", "(C|list)", "none", "true", "(C|wordcount)", "C.find('a')", "dict(a=1)")  # fmt: skip
UNARY = ("({}|length)", "({}|string)", "({}|tojson)", "({}|first)", "({}|list)", "({}|trim)", "({}|upper)", "({}|abs)",
         "({}|int)", "({}|float)", "({}|round)", "({}|join)", "({}|e)", "({}|sort|list)", "({}|unique|list)",
         "({} is string)", "(not {})", "({}|batch(2)|list)", "({}|map('upper')|list)", "({}|select|list)", "({}[0])",
         "({}[1:])", "({}[::-1])", "(-{})", "({}|replace('a', 'b'))", "({}|center(5))", "({}|truncate(9))",
         "({}|title)")  # fmt: skip
BINARY = (
    "({} + {})",
    "({} - {})",
    "({} * {})",
    "({} / {})",
    "({} // {})",
    "({} % {})",
    "({} ~ {})",
    "({} == {})",
    "({} < {})",
    "({} in {})",
    "({} and {})",
    "({} or {})",
    "({} if {} else 0)",
    "('%s-%s' % ({}, {}))",
    "('{{}}|{{}}'.format({}, {}))",
)  # fmt: skip  (identity: its own test above)
EXPRESSIONS = st.recursive(
    st.sampled_from(ATOMS),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(UNARY), inner).map(lambda t: t[0].format(t[1])),
        st.tuples(st.sampled_from(BINARY), inner, inner).map(lambda t: t[0].format(t[1], t[2])),
    ),
    max_leaves=6,
)


@settings(max_examples=80, deadline=None)
@given(expression=EXPRESSIONS, content=st.sampled_from(["hi", "a b a", "", "12", "Zq unlock", "x" * 300, "<b>"]))
def test_generated_expressions_over_content_render_as_in_the_loader(expression: str, content: str) -> None:
    text = "{{ " + expression.replace("C", "messages[0].content") + " }}"
    messages = [{"role": "user", "content": content}]
    try:
        expected: str | None = _without_addresses(_transformers_render(text, messages))
    except Exception:
        expected = None
    answer = ct.run_battery(text, [{"messages": messages, "context": {}}], LIMITS)
    render = (answer.get("renders") or [{"status": answer["status"]}])[0]
    if expected is None:
        assert render["status"] != "ok", (text, render)
    else:
        assert render["status"] == "ok", (text, render)
        assert _without_addresses(render["output"]) == expected, text
