"""Inputs labelled by where they are (sandbox_child._label_tree, demands.input_values, the edits of
conversations.demanded): every value of a render's messages, tools and documents that no named
label covers is an input of source ``input:at:<path>`` (strings), ``input:count:at:<path>`` (the
size of a list or dict) or ``input:key:at:<path>`` (a dict's keys), so a template that tests a
tool call's id, a schema's type, a description's length or the number of required parameters
is drawn, in round two, an input that passes the test (generated tests, CHATML base)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan.families import CHATML_PARTS_TEMPLATE
from tests.warden.tokenscan.test_input_demands import MARK, _clean, _opens, _rounds
from warden.tokenscan import demands as dm
from warden.tokenscan import sandbox_child as sc

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = st.sampled_from(["type", "name", "id", "enum", "arguments", "properties", "items", "x", "ref"])
LEAVES = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6),
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
)
TREES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=24
)


def _labels(value: Any, out: set[tuple[str, Any]]) -> None:
    """The labels the sandbox gave ``value`` (labelled in place), as ``input_values`` names them."""
    if isinstance(value, sc.Probe):
        out.add((value._wsrc[len(sc.INPUT) :], str.__str__(value)))
    elif isinstance(value, sc.ProbeInt):
        out.add((value._wsrc[len(sc.INPUT) :], int(value._plain())))
    elif isinstance(value, list):
        if isinstance(value, sc.TaintedList):
            out.add((value._wsrc[len(sc.INPUT) :], len(value)))
        for item in value:
            _labels(item, out)
    elif isinstance(value, dict):
        path = sc.INPUT_PATHS[id(value)]
        assert sc.INPUT_DICTS[id(value)] == dm.AT + path  # its missing keys are demands of key:at:<path>
        out.add(("count:" + dm.AT + path, len(value)))
        for key, item in value.items():
            out.add(("key:" + dm.AT + path, key))
            _labels(item, out)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, TREES, max_size=5), st.sampled_from(["tools/*", "documents/*", "messages/*"]))
def test_the_sandbox_labels_every_value_by_the_path_the_draw_names(tree: dict[str, Any], root: str) -> None:
    """One path rule on both sides: what the sandbox labels is what ``observed`` and the edits name."""
    sc.INPUT_DICTS.clear()
    sc.INPUT_PATHS.clear()
    labelled = copy.deepcopy(tree)
    sc._label_tree(labelled, root)
    found: set[tuple[str, Any]] = set()
    _labels(labelled, found)
    assert found == set(dm.input_values(tree, root))
    assert labelled == tree  # labels change nothing a template compares


# a value somewhere in the draw's tools, tool calls and documents: (the loops that reach it, its expression)
TOOL = "{% for t in tools or [] %}{body}{% endfor %}"
CALL = "{% for m in messages %}{% for tc in m.tool_calls or [] %}{body}{% endfor %}{% endfor %}"
ARGS = "{% for m in messages %}{% for tc in m.tool_calls or [] %}{% for k, v in (tc.function.arguments if " \
       "tc.function.arguments is mapping else {})|items %}{body}{% endfor %}{% endfor %}{% endfor %}"  # fmt: skip
PARAM = "{% for t in tools or [] %}{% for k, p in t.function.parameters.properties|items %}{body}{% endfor %}" \
        "{% endfor %}"  # fmt: skip
DOC = "{% for d in documents or [] %}{body}{% endfor %}"
STRINGS = {
    "tool type": (TOOL, "t.type"),
    "tool description": (TOOL, "t.function.description"),
    "schema type": (TOOL, "t.function.parameters.type"),
    "parameter type": (PARAM, "p.type"),
    "tool-call id": (CALL, "tc.id"),
    "tool-call type": (CALL, "tc.type"),
    "argument value": (ARGS, "v"),
    "document title": (DOC, "d.title"),
}
STRING_FORMS = {
    "==": "{x} == {c}",
    "startswith": "{x}.startswith({c})",
    "before": "{x} < {c}",  # 'A...' orders before every lower-case draw
    "after": "{x} > {c}",  # '~...' orders after every draw
    "length": "({x}|length) > {n}",
}
COUNTS = {
    "required parameters": (TOOL, "(t.function.parameters.required or [])"),
    "parameters": (TOOL, "t.function.parameters.properties"),
    "arguments": (CALL, "(tc.function.arguments if tc.function.arguments is mapping else {})"),
    "message fields": ("{% for m in messages %}{body}{% endfor %}", "m"),
    "tool fields": (TOOL, "t"),
}


def _at(where: str, condition: str, body: str) -> str:
    return where.replace("{body}", "{% if " + condition + " %}" + body + "{% endif %}") + CHATML_PARTS_TEMPLATE


def _constant(form: str, value: str) -> str:
    return repr({"before": "A" + value, "after": "~" + value}.get(form, value))


@SETTINGS
@given(st.sampled_from(sorted(STRINGS)), st.sampled_from(sorted(STRING_FORMS)), st.from_regex(r"z[a-z]{4,8}",
       fullmatch=True), st.integers(70, 900))  # fmt: skip
def test_a_value_at_any_path_tested_in_any_form_is_drawn_to_pass(where: str, form: str, value: str, n: int) -> None:
    loops, x = STRINGS[where]
    condition = STRING_FORMS[form].format(x=x, c=_constant(form, value), n=n)
    assert _opens(_at(loops, condition, MARK)), condition


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(COUNTS)), st.integers(6, 40))
def test_the_size_of_a_list_or_dict_at_any_path_past_a_bound_is_drawn(where: str, n: int) -> None:
    loops, x = COUNTS[where]
    condition = f"({x}|length) > {n}"
    assert _opens(_at(loops, condition, MARK)), condition


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(STRINGS)), st.sampled_from(sorted(STRING_FORMS)))
def test_the_same_path_tests_without_gated_text_judge_clean(where: str, form: str) -> None:
    loops, x = STRINGS[where]
    _clean(_at(loops, STRING_FORMS[form].format(x=x, c=_constant(form, "zvalue"), n=80), ""))


def test_a_parameter_name_compared_with_the_required_list_is_structure_not_a_demand() -> None:
    """``name in required`` compares two inputs: no demand, no second round (gpt-oss, Functionary)."""
    loops = "{% for t in tools or [] %}{% for k, p in t.function.parameters.properties|items %}{body}{% endfor %}" \
            "{% endfor %}"  # fmt: skip
    renders, _answer, left = _rounds(_at(loops, "k in (t.function.parameters.required or [])", "required"))
    assert left == 0 and not any(r["name"].startswith("d") for r in renders)


def test_a_bound_past_what_the_draw_may_make_is_reported_not_dropped() -> None:
    """Counts past their caps and lengths past MAX_LENGTH: no draw passes, each is left (TS910)."""
    for condition in (
        f"((tools or [])|length) > {dm.COUNT_CAPS['tools']}",
        f"((documents or [])|length) > {dm.COUNT_CAPS['documents']}",
        f"((t.function.parameters.required or [])|length) > {dm.AT_COUNT_CAP}",
        f"(t.function.description|length) > {dm.MAX_LENGTH}",
    ):
        template = _at(TOOL if "t." in condition else "{body}", condition, MARK)
        _renders, _answer, left = _rounds(template)
        assert left >= 1, condition


def test_the_sandbox_and_the_draw_share_their_tables() -> None:
    """sandbox_child.py runs alone (no warden import): its copies of the path rule's tables must equal
    the draw's, or a label and the edit that answers it would name different places or kinds."""
    assert sc.FREE_KEYED == dm.FREE_KEYED
    assert sc.MAX_LABELLED == dm.AT_COUNT_CAP
    assert set(sc.KIND_TESTS) == dm.KIND_VALUES
    assert all(sc._at_step(p, k) == dm.step(p, k) for p in ("tools/*/function/arguments", "messages/*") for k in "ab")
