"""The generated conversations cover what a template reads (issue 33): the inputs to probe are
derived from the template's AST (variables it reads before setting them, roles and content-block
types it compares, keys it looks up, integer literals as conversation lengths), so a branch gated
on any of them renders in some generated conversation. Generated gates (random names, roles,
types, keys, thresholds) on a ChatML template, each rendered in the sandbox; the family templates'
probes render and judge clean; the draw stays bounded; reasoning is aliased as transformers 5 does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan import chat_template as ct
from warden.tokenscan import conversations as conv

CTX = {"bos_token": "<s>", "add_generation_prompt": True, "tools": None, "documents": None}
LIMITS = ct.RenderLimits(4.0, 1 << 20, 1 << 30)
MARK = "ZEBRAMARK"
CHATML = fam.CHATML_PARTS_TEMPLATE
LOOP = "{% for m in messages %}"
NAMES = st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True).filter(
    lambda n: (
        n not in conv.LOADER_NAMES
        and not n.endswith("_token")
        and n not in ("not", "and", "or", "in", "is", "if", "else", "for", "set")
    )
)
KEYS = NAMES.filter(lambda k: k not in conv.STRUCTURAL_KEYS)
# a gate: (where it goes: top of the template or inside the message loop, the gate with {name})
TOP_GATES = (
    "{{% if {name} is defined %}}",
    "{{% if {name} %}}",
    "{{% if {name} is defined and not {name} %}}",
    "{{% if {name} is string %}}",
    "{{% if ({name}|join('')) %}}",
    "{{% if tools and '{name}' in tools[0].function.parameters.properties %}}",
    "{{% if documents and documents[0].{name} is defined %}}",
)
LOOP_GATES = (
    "{{% if m.role == '{name}' %}}",
    "{{% if m.content is not string and (m.content|selectattr('type', 'equalto', '{name}')|list) %}}",
    "{{% if m.{name} is defined %}}",
    "{{% if m['{name}'] is defined %}}",
)
SIZE_GATES = (
    "{{% if m.content is string and (m.content|length) == {n} %}}",
    "{{% if m.content is string and (m.content|length) > {n} %}}",
    "{{% if m.content is string and ((m.content|length) // {n}) %}}",
)
COUNT_GATES = (
    "{{% if (messages|selectattr('role', 'equalto', 'assistant')|list|length) >= {n} %}}",
    "{{% if messages|length > {n} %}}",
)


def _gated(gate: str) -> str:
    where = LOOP if "m." in gate or "m[" in gate else ""
    body = gate + MARK + "{% endif %}"
    return CHATML.replace(LOOP, LOOP + body, 1) if where else body + CHATML


def _renders_mark(template: str, count: int = 12) -> tuple[bool, int]:
    renders = conv.generate("inputs", count, CTX, template)
    answer = ct.run_battery(template, renders, LIMITS)
    assert answer["status"] == "ok", answer.get("message")
    outputs = [r["output"] for r in answer["renders"] if r["status"] == "ok"]
    return any(MARK in o for o in outputs), len(renders)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TOP_GATES + LOOP_GATES), NAMES)
def test_a_branch_gated_on_any_named_input_renders(gate: str, name: str) -> None:
    template = _gated(gate.format(name=name))
    seen, _n = _renders_mark(template)
    assert seen, f"no generated conversation opens {gate.format(name=name)!r}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COUNT_GATES), st.integers(25, conv.MAX_TURNS - 2))
def test_a_branch_gated_on_a_count_past_the_drawn_lengths_renders(gate: str, n: int) -> None:
    seen, _n = _renders_mark(_gated(gate.format(n=n)))
    assert seen, gate.format(n=n)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SIZE_GATES), st.integers(conv.MIN_SIZE, conv.MAX_SIZE))
def test_a_branch_gated_on_a_content_length_the_draw_never_makes_renders(gate: str, n: int) -> None:
    seen, _n = _renders_mark(_gated(gate.format(n=n)))
    assert seen, gate.format(n=n)


def test_without_the_template_no_gated_branch_opens() -> None:
    """The same gates with the draw alone (no template given) stay closed: the derivation is what opens them."""
    for gate in ("{% if date_marker_kw is defined %}", "{% if documents and documents[0].origin is defined %}"):
        template = _gated(gate)
        renders = conv.generate("inputs", 12, CTX)
        answer = ct.run_battery(template, renders, LIMITS)
        assert not any(MARK in r.get("output", "") for r in answer["renders"])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.sampled_from(TOP_GATES + LOOP_GATES + COUNT_GATES), min_size=0, max_size=30),
    st.lists(KEYS, min_size=30, max_size=30),
    st.integers(1, 40),
)
def test_the_draw_is_bounded_whatever_the_template_reads(gates: list[str], names: list[str], count: int) -> None:
    template = "".join(
        _gated(g.format(name=k, n=3 + 4 * i)) for i, (g, k) in enumerate(zip(gates, names, strict=False))
    )
    inputs = conv.template_inputs(template or CHATML)
    assert all(len(getattr(inputs, f)) <= n for f, n in conv.LIMITS.items() if f != "values")
    assert all(len(v) <= conv.LIMITS["values"] for _k, v in inputs.kwargs)
    renders = conv.generate("bound", count, CTX, template or CHATML)
    assert len(renders) <= 3 * 2 * count  # the drawn shapes, at most as many probe shapes, three renders each
    assert max(len(r["messages"]) for r in renders) <= 5 * conv.MAX_TURNS + 2


def test_nothing_of_the_template_is_evaluated_while_deriving() -> None:
    """Huge constant arithmetic in the template is parsed, never folded (the scanner's own process)."""
    inputs = conv.template_inputs("{{ (10 ** 10 ** 10) if big_switch is defined }}" + CHATML)
    assert [k for k, _v in inputs.kwargs] == ["big_switch"]


@pytest.mark.parametrize("name", [*fam.CURRENT_TEMPLATES, "llama3.1", "qwen2.5", "mistral", "gemma"])
def test_family_templates_render_their_probes_and_judge_clean(name: str) -> None:
    template = {
        **fam.CURRENT_TEMPLATES,
        "llama3.1": fam.LLAMA31_TEMPLATE,
        "qwen2.5": fam.QWEN25_TEMPLATE,
        "mistral": fam.MISTRAL_TEMPLATE,
        "gemma": fam.GEMMA_TEMPLATE,
    }[name]
    context = {**CTX, "eos_token": "</s>"}
    renders = conv.generate("warden-33", 24, context, template)
    answer = ct.run_battery(template, renders, LIMITS)
    assert answer["status"] == "ok", answer.get("message")
    assert conv.judge(renders, answer) == []
    first = 3 * len(conv.EXTREMES)  # the probe shapes follow the extremes (see conversations._draw)
    probes = conv.template_inputs(template).probes()
    shapes_n = min(2 * len(probes), 24)  # conversations._probe_shapes
    status = [a["status"] for a in answer["renders"][first : first + 3 * shapes_n]][::3]  # each one's first filling
    for p, probe in enumerate(probes):
        if "part_type" in probe:
            continue  # a template for string content may refuse content blocks
        shapes = {(2 * p) % len(status), (2 * p + 1) % len(status)}  # without and with a system message
        assert any(status[i] == "ok" for i in shapes), (
            probe,
            [answer["renders"][first + 3 * i]["message"] for i in shapes],
        )


REASONING = st.dictionaries(
    st.sampled_from(conv.REASONING_FIELDS), st.one_of(st.none(), st.text(max_size=5)), max_size=3
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), REASONING), max_size=5))
def test_reasoning_is_aliased_as_transformers_does(messages: list[tuple[str, dict[str, Any]]]) -> None:
    from transformers.utils.chat_template_utils import _alias_reasoning_fields

    chat = [{"role": role, "content": "x", **fields} for role, fields in messages]
    assert conv.alias_reasoning(chat) == _alias_reasoning_fields(chat)


PIECES = st.sampled_from(
    ["{% if ", "{% for x in ", "{% endif %}", "{% endfor %}", "{{ ", " }}", "%}", "messages", "m.role", " == ",
     "'ipython'", " is defined", "x.type", "[0]", "|length", " > 41", "(", ")", "not ", "k", "'path' in ",
     "x.get('src')", "text"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=25))
def test_deriving_from_any_text_never_raises_and_stays_within_its_limits(pieces: list[str]) -> None:
    inputs = conv.template_inputs("".join(pieces))
    assert isinstance(inputs, conv.TemplateInputs)
    assert all(len(getattr(inputs, f)) <= n for f, n in conv.LIMITS.items() if f != "values")
    assert all(conv.MIN_SIZE <= n <= conv.MAX_SIZE for n in inputs.sizes)
    assert all(2 <= n <= conv.MAX_TURNS for n in inputs.turns)
