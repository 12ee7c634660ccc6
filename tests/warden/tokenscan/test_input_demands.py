"""Feedback-directed input generation (sandbox_child.py demands, demands.py, conversations.demanded):
every input value a template's control flow is seen to test in round one is drawn in round two in
a form that passes the test. Templates are generated (hypothesis) from an input source (role,
message key, content-block type, keyword argument, tool name, tool parameter, message count, tool
count) crossed with a test form (==, in, startswith, endswith, a slice compared, a filter chain
then a compare, a key computed with ``~``, a bound computed by arithmetic, ``items()`` with a
predicate on the key); each gates a marker, and some generated conversation must render it. The
same structure without the marker judges clean; labelling the inputs changes no output (as
transformers renders it); the rounds stay bounded whatever the template tests."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import chat_template as ct
from warden.tokenscan import conversations as conv
from warden.tokenscan import demands as dm
from warden.tokenscan import template_battery as tb

CTX = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True, "tools": None, "documents": None}
LIMITS = ct.RenderLimits(4.0, 1 << 20, 1 << 30)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MARK = "ZEBRAMARK"
CHATML = fam.CHATML_PARTS_TEMPLATE
LOOP = "{% for m in messages %}"
PARTS = "{% for p in (m.content if m.content is not string else []) %}"
# values the draw never makes (a 'z' first: no loader role, type or key starts so)
VALUES = st.from_regex(r"z[a-z]{4,8}", fullmatch=True)
KWARGS = st.from_regex(r"zk[a-z]{3,8}", fullmatch=True)

# an input source: (where its test goes: top, loop or parts; the expression of its value)
STRING_SOURCES = {
    "role": ("loop", "m.role"),
    "part type": ("parts", "p.type"),
    "kwarg": ("top", "({kw}|default(''))"),
    "kwarg via string": ("top", "({kw}|string)"),
    "tool name": ("top", "(tools[0].function.name if tools else '')"),
}
# a string test of X with the constant C (``{c}``: the constant's spelling, maybe computed)
STRING_FORMS = {
    "==": "{x} == {c}",
    "!=": "not ({x} != {c})",
    "in a list": "{x} in [{c}, 'zz-other']",
    "in (substring)": "{c} in {x}",
    "startswith": "{x}.startswith({c})",
    "endswith": "{x}.endswith({c})",
    "find": "{x}.find({c}) == 0",
    "slice": "{x}[:{n}] == {c}",
    "slice past a start": "{x}[2:{n2}] == {c}",
    "filter chain": "({x}|trim|lower) == {c}",
    "upper filter": "({x}|upper) == ({c}|upper)",
    "dict lookup": "{{{c}: true}}.get({x}, false)",
    "affix joined": "('<' ~ {x} ~ '>') == ('<' ~ {c} ~ '>')",
    "split piece": "{x}.split('/')[0] == {c}",
    "length": "({x}|length) == {n} + 7",
}
KEY_SOURCES = {
    "message key": ("loop", "m"),
    "part key": ("parts", "p"),
    "tool parameter": ("top", "(tools[0].function.parameters.properties if tools else {{}})"),
    "document key": ("top", "(documents[0] if documents else {{}})"),
}
KEY_FORMS = {
    "computed key": "{d}[{c}] is defined",
    "get": "{d}.get({c}) is not none",
    "in": "{c} in {d}",
}
ITEM_FORMS = {  # a loop over the dict's items with a predicate on the key
    "key length": "{{% for k, v in {d}.items() if k|length == {n} %}}",
    "key prefix": "{{% for k, v in {d}.items() if k.startswith({c}) %}}",
    "key equal": "{{% for k in {d} if k == {c} %}}",
    "key suffix via keys()": "{{% for k in {d}.keys() if k[-{n}:] == {c} %}}",
}
COUNT_FORMS = {
    "messages >": ("top", "(messages|length) > {a} * {b}"),
    "messages >=": ("top", "(messages|length) >= {a} * {b}"),
    "messages ==": ("top", "(messages|length) == {a} * {b}"),
    "messages slice": ("top", "(messages[1:]|length) >= {a} * {b}"),
    "messages minus one": ("top", "(messages|length) - 1 > {a} * {b}"),
    "loop index": ("loop", "loop.index > {a} * {b}"),
    "counter": ("counter", "ns.n > {a} * {b}"),
    "tools >": ("tools", "((tools or [])|length) > {a} + {b}"),
    "tools ==": ("tools", "((tools or [])|length) == {a} + {b}"),
    "content blocks": ("loop", "m.content is not string and (m.content|length) > {a}"),
    "tool calls": ("loop", "m.tool_calls and (m.tool_calls|length) >= {b}"),
}


def _spelled(value: str, split: int) -> str:
    """``value`` as a template constant, whole or computed by ``~`` of two pieces."""
    if 0 < split < len(value):
        return f"({value[:split]!r} ~ {value[split:]!r})"
    return repr(value)


def _gate(where: str, condition: str, body: str) -> str:
    """CHATML with ``{% if condition %}body{% endif %}`` at ``where``."""
    gate = "{% if " + condition + " %}" + body + "{% endif %}"
    if where == "loop":
        return CHATML.replace(LOOP, LOOP + gate, 1)
    if where == "parts":
        return CHATML.replace(LOOP, LOOP + PARTS + gate + "{% endfor %}", 1)
    if where == "counter":
        count = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
        return count + gate + CHATML
    return gate + CHATML


def _rounds(template: str, count: int = 12) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Both rounds rendered: the requests, one merged answer, and the inputs left undrawn."""
    first = conv.generate("demands", count, CTX, template)
    answer = ct.run_battery(template, first, LIMITS)
    assert answer["status"] == "ok", answer.get("message")
    second, left = conv.demanded("demands", count, CTX, answer.get("demands"), first)
    answer2 = ct.run_battery(template, second, LIMITS) if second else {"renders": [], "taint": []}
    merged = {**answer, "renders": [*answer["renders"], *answer2["renders"]],
              "taint": [*answer["taint"], *answer2.get("taint", [])]}  # fmt: skip
    return [*first, *second], merged, left


def _opens(template: str) -> bool:
    _renders, answer, _left = _rounds(template)
    return any(MARK in str(r.get("output", "")) for r in answer["renders"])


def _clean(template: str) -> None:
    """The same structure without the marker: no judge finds anything, nothing is left undrawn."""
    renders, answer, left = _rounds(template)
    assert conv.judge(renders, answer) == []
    assert tb.taint_issues(list(answer.get("taint") or []), ("<|im_start|>", "<|im_end|>")) == []
    assert left == 0


@SETTINGS
@given(st.sampled_from(sorted(STRING_SOURCES)), st.sampled_from(sorted(STRING_FORMS)), VALUES, KWARGS,
       st.integers(0, 4))  # fmt: skip
def test_a_string_input_tested_in_any_form_is_drawn_to_pass(
    source: str, form: str, value: str, kwarg: str, split: int
) -> None:
    where, x = STRING_SOURCES[source]
    x = x.format(kw=kwarg)
    n = len(value)
    condition = STRING_FORMS[form].format(x=x, c=_spelled(value, split), n=n, n2=n + 2)
    assert _opens(_gate(where, condition, MARK)), condition


@SETTINGS
@given(st.sampled_from(sorted(KEY_SOURCES)), st.sampled_from(sorted(KEY_FORMS) + sorted(ITEM_FORMS)), VALUES,
       st.integers(0, 4), st.integers(13, 16))  # fmt: skip
def test_a_key_asked_for_or_tested_in_any_form_is_drawn(source: str, form: str, value: str, split: int, n: int) -> None:
    where, d = KEY_SOURCES[source]
    d = d.format()
    key = value + "q" * (n - len(value)) if form == "key length" else value
    c = _spelled(key if form != "key suffix via keys()" else key[-4:], split)
    if form in ITEM_FORMS:
        loop = ITEM_FORMS[form].format(d=d, c=c, n=n if form == "key length" else 4)
        template = _gate(where, "true", loop + MARK + "{% endfor %}")
    else:
        template = _gate(where, KEY_FORMS[form].format(d=d, c=c), MARK)
    assert _opens(template), template[:300]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(COUNT_FORMS)), st.integers(5, 14), st.integers(5, 13))
def test_a_count_past_a_computed_bound_is_drawn(form: str, a: int, b: int) -> None:
    where, condition = COUNT_FORMS[form]
    condition = condition.format(a=a, b=b)
    template = _gate("top" if where == "tools" else where, condition, MARK)
    assert _opens(template), condition


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(STRING_FORMS)), st.sampled_from(sorted(STRING_SOURCES)), VALUES, KWARGS)
def test_the_same_tests_without_gated_text_judge_clean(form: str, source: str, value: str, kwarg: str) -> None:
    where, x = STRING_SOURCES[source]
    condition = STRING_FORMS[form].format(x=x.format(kw=kwarg), c=repr(value), n=len(value), n2=len(value) + 2)
    _clean(_gate(where, condition, ""))


@pytest.mark.parametrize("form", sorted(COUNT_FORMS))
def test_counts_without_gated_text_judge_clean(form: str) -> None:
    where, condition = COUNT_FORMS[form]
    _clean(_gate("top" if where == "tools" else where, condition.format(a=11, b=11 if "tools" not in form else 3), ""))


@pytest.mark.parametrize("name", [*fam.CURRENT_TEMPLATES, "llama3.1", "qwen2.5", "mistral", "gemma"])
def test_family_templates_ask_for_nothing_round_one_did_not_draw(name: str) -> None:
    """The real families test only inputs the draw gives, but for the kind of a value (Qwen3's
    ``arguments is string``: OpenAI-style JSON-string arguments), an item of a list argument
    (Llama 3.1's ``builtin_tools`` without ``code_interpreter``) and a conversation just longer than
    one drawn (a turn counter compared with a count kept in a namespace): a second round for those
    only, nothing left, and its renders judge clean."""
    template = {**fam.CURRENT_TEMPLATES, "llama3.1": fam.LLAMA31_TEMPLATE, "qwen2.5": fam.QWEN25_TEMPLATE,
                "mistral": fam.MISTRAL_TEMPLATE, "gemma": fam.GEMMA_TEMPLATE}[name]  # fmt: skip
    first = conv.generate("warden-33", 24, CTX, template)
    answer = ct.run_battery(template, first, LIMITS)
    assert answer["demands"], "the labelled inputs record the family's own tests"
    second, left = conv.demanded("warden-33", 24, CTX, answer["demands"], first)
    assert left == 0
    for r in second:
        forced = r["forced"]
        if "edits" in forced:
            assert all(e.get("kind") for e in forced["edits"]), r["shape"]
        else:
            lists = all(isinstance(v, list) for v in (forced.get("kwargs") or {}).values())
            assert ("messages" in forced) != ("kwargs" in forced and lists), r["shape"]
    answer2 = ct.run_battery(template, second, LIMITS) if second else {"renders": []}
    assert conv.judge([*first, *second], {**answer, "renders": [*answer["renders"], *answer2["renders"]]}) == []


# -- labelling changes nothing a template can see -----------------------------------------------
SHOWN = (
    "{{ messages|string }}", "{{ messages[0]|string }}", "{{ messages[0].items()|list|string }}",
    "{{ messages[0].keys()|string }}", "{% for k, v in messages[0].items() %}{{ k }}={{ v|string }};{% endfor %}",
    "{{ messages|reverse|string }}", "{{ messages[1:]|string }}", "{{ (messages|length) ~ (tools|length) }}",
    "{{ messages[0].role|tojson }}", "{{ tools|tojson }}", "{{ messages[0]|dictsort|string }}",
    "{{ messages[0]|list|string }}", "{{ zkflag|string }} {{ zkflag is string }} {{ zknum + 1 }} {{ zknum is number }}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role|upper }}{{ m.role[1:] }};{% endfor %}",
    "{{ messages[0].role is sameas messages[0].role }} {{ messages[0].get('zz') }} {{ 'role' in messages[0] }}",
    "{{ tools[0].function.parameters.properties|list }} {{ documents[0]|dictsort }}",
)  # fmt: skip


def _loader(template: str, render: dict[str, Any]) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return str(_compile_jinja_template(template).render(messages=render["messages"], **render["context"]))


@pytest.mark.parametrize("shown", SHOWN)
def test_labelled_inputs_render_as_transformers_renders_them(shown: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"q": {"type": "string"}}}}}
    messages = [{"role": "user", "content": "hi", "zz_field": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]  # fmt: skip
    context = {"tools": [tool], "documents": [{"title": "t", "text": "d"}], "zkflag": "on", "zknum": 3}
    render = {"messages": messages, "context": context, "inputs": ["zkflag", "zknum"], "now": 1767225600}
    answer = ct.run_battery(shown, [render], LIMITS)
    assert answer["renders"][0]["status"] == "ok", answer["renders"][0]
    strip = lambda s: re.sub(r"0x[0-9a-f]+", "0x", s)  # noqa: E731
    assert strip(answer["renders"][0]["output"]) == strip(_loader(shown, render))


# -- bounds --------------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(30, 300), st.integers(1, 24))
def test_a_flood_of_input_tests_is_bounded_and_reported(roles: int, count: int) -> None:
    """A template testing the role against hundreds of values: round two draws at most ``count``
    shapes of them, and the rest is counted (reported as not analysed), never silently dropped."""
    template = "".join("{% if m.role == 'zr" + str(i) + "' %}x{% endif %}" for i in range(roles))
    template = CHATML.replace(LOOP, LOOP + template, 1)
    first = conv.generate("flood", count, CTX, template)
    answer = ct.run_battery(template, first, LIMITS)
    second, left = conv.demanded("flood", count, CTX, answer["demands"], first)
    assert len(second) <= 3 * count
    assert len(answer["demands"]) <= dm.MAX_TAKEN + 1  # the sandbox's bound, and its overflow record
    tested = {d[2] for d in answer["demands"] if d[0] == "input:role" and d[2].startswith("zr")}
    drawn = {m["role"] for r in [*first, *second] for m in r["messages"]} & tested
    assert len(drawn) + left >= len(tested) + dm.overflowed(answer["demands"])  # each drawn or counted
    assert len(tested) == min(roles, dm.MAX_TAKEN) or dm.overflowed(answer["demands"])


@given(st.text(max_size=300), st.sampled_from(["==", "startswith", "length gt", "length eq", "key", "overflow"]),
       st.sampled_from(["input:role", "input:count:messages", "input:count:tools", "input:kwarg:x", "input:key:part",
                        "content"]))  # fmt: skip
def test_a_demand_becomes_a_bounded_input_or_none(constant: str, operation: str, source: str) -> None:
    made = dm.probe([source, operation, constant, []])
    if made is None:
        return
    for value in [*made.values(), *(made.get("kwargs") or {}).values()]:
        if isinstance(value, str):
            assert 0 < len(value) <= 2 * dm.MAX_VALUE
        elif isinstance(value, int):
            assert value <= max(dm.KWARG_NUMBER, *dm.COUNT_CAPS.values())
    assert made.get("messages", 1) <= dm.COUNT_CAPS["messages"] and made.get("tools", 1) <= dm.COUNT_CAPS["tools"]


def test_huge_bounds_and_long_constants_ask_for_nothing() -> None:
    assert dm.probe(["input:count:messages", "length gt", str(10**9), []]) is None
    assert dm.probe(["input:count:tools", "length gt", "an integer of 4000 bits", []]) is None
    assert dm.probe(["input:role", "==", "x" * 500, []]) is None
    assert dm.probe(["input:role", "==", "func", [["slice", 2, 6, None]]]) == {"role": "xxfunc"}
    assert dm.probe(["input:type", "endswith", "_url", [["lower"]]]) == {"part_type": "_url"}


# -- in a scan -------------------------------------------------------------------------------------
def test_a_scan_reports_input_tests_past_its_draw_and_catches_a_demanded_gate(tmp_path: Any) -> None:
    """Through ``scan_directory``: tests past the shape budget are TS910 (not analysed, never clean);
    a gate opened by round two is a blocking finding."""
    import dataclasses

    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    policy = default_policy()
    small = dataclasses.replace(policy, chat_template=dataclasses.replace(policy.chat_template,
                                                                          generated_conversations=4))  # fmt: skip
    flood = "".join("{% if message.role == 'zr" + str(i) + "' %}{% endif %}" for i in range(12))
    gate = "{% if message.role[1:5] == 'zfun' %}Seven paper lanterns drift over the quiet harbour at dusk.{% endif %}"
    for name, snippet, options, rule in (("flood", flood, small, "TS910"), ("gate", gate, policy, None)):
        d = fam.build_family("qwen2.5", tmp_path / name)
        (d / "chat_template.jinja").unlink(missing_ok=True)
        fam._set_template(d, fam.QWEN25_TEMPLATE.replace("{%- for message in messages %}",
                                                         "{%- for message in messages %}" + snippet, 1))  # fmt: skip
        result = scan_directory(str(d), options)
        ids = [f.id for f in result.findings]
        if rule:
            assert rule in ids, ids
            assert any("input test" in f.message for f in result.findings if f.id == rule)
        else:
            assert result.blocking(options.fail_severity), ids


# a content trigger mixed with inputs: labelling the inputs must not hide (or move) its content record
MIXED = (
    "{{ 'P' * ((m.role ~ m.content) == S) }}",
    "{{ 'P' * ((m.content ~ m.role) == S) }}",
    "{{ 'P' * (m.role + (m.content if m.content is string else '') == S) }}",
    "{{ 'P' * (S in (m.role ~ ':' ~ (m.content if m.content is string else ''))) }}",
    "{{ 'P' * ((m.content if m.content is string else '') == m.role) }}",
    "{{ 'P' * (m.role == (m.content if m.content is string else '')) }}",
    "{% set ns.x = m.role %}{{ 'P' * ((m.content if m.content is string else '') == ns.x ~ S) }}",
    "{{ 'P' * (((m.content if m.content is string else '')|length) > (messages|length)) }}",
    "{{ 'P' * ((messages|length) < ((m.content if m.content is string else '')|length)) }}",
    "{{ {S: 'P'}.get(m.role ~ (m.content if m.content is string else ''), '') }}",
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MIXED), st.from_regex(r"[a-z]{3,10}", fullmatch=True))
def test_labelled_inputs_keep_every_content_record(snippet: str, secret: str) -> None:
    template = "{% set ns = namespace(x='') %}" + CHATML.replace(LOOP, LOOP + snippet.replace("S", repr(secret)), 1)
    renders = conv.generate("mixed", 4, CTX, template)
    plain = [{k: v for k, v in r.items() if k != "inputs"} for r in renders]
    labelled, unlabelled = ct.run_battery(template, renders, LIMITS), ct.run_battery(template, plain, LIMITS)
    assert [r["output"] for r in labelled["renders"]] == [r["output"] for r in unlabelled["renders"]]
    records = lambda a: {tuple(t[:3]) for t in a["taint"] if t[0] == "content"}  # noqa: E731
    assert records(unlabelled) and records(labelled) == records(unlabelled)
    assert "demands" in labelled and not any(d[0] == "content" for d in labelled["demands"])


_KEYS = st.sampled_from(["role", "content", "tool_calls", "function", "name", "parameters", "properties", "type", "x"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(messages=st.lists(st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "x"]), _json), max_size=3),
       tools=st.lists(_json, max_size=3), documents=st.lists(_json, max_size=2), kwarg=_json)  # fmt: skip
def test_what_a_demand_round_drew_is_read_whatever_kind_each_value_has(messages, tools, documents, kwarg):
    """A demand round draws a value of any kind at any path (a string where a tool's function
    was): reading the draws back never raises, and counts what is there."""
    render = {"messages": messages, "context": {"tools": tools, "documents": documents, "k": kwarg}, "inputs": ["k"]}
    seen = dm.observed([render])
    assert len(messages) in seen["input:count:messages"] and len(tools) in seen["input:count:tools"]
