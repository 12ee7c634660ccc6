"""Branch coverage of the renders (TS814): the sandbox's code generator numbers every branch of a
template (if/elif/else and the implicit else, loop bodies, both arms of an if-expression, the right
side of and/or, a test used as a value), the renders record the ones that ran, and a branch none
ran that would write text no render showed (or a role name, or tag markup) is a finding.

The properties are checked with generated templates (hypothesis: the way a branch is chosen, the
gate, the text it writes) over a fixed set of generated conversations, so whether a branch ran is
decided by the conversations and not by the scanner's own draws."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden.tokenscan import chat_template as ct
from warden.tokenscan import conversations as conv
from warden.tokenscan import template_battery as tb

CTX = {"bos_token": "<s>", "add_generation_prompt": True, "tools": None, "documents": None}
LIMITS = ct.RenderLimits(2.0, 1 << 20, 1 << 30)
RENDERS = conv.generate("coverage", 8, CTX)
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
LOOP = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"

# how a branch that writes ``{p}`` is chosen by the gate ``{g}``
FORMS = {
    "if": "{% if {g} %}{p}{% endif %}",
    "elif": "{% if messages is none %}{% elif {g} %}{p}{% endif %}",
    "else": "{% if not ({g}) %}{% else %}{p}{% endif %}",
    "if-expression": "{{ '{p}' if {g} else '' }}",
    "if-expression else": "{{ '' if not ({g}) else '{p}' }}",
    "and": "{{ ({g}) and '{p}' or '' }}",
    "or": "{{ (not ({g})) or '{p}' }}",
    "times a test": "{{ '{p}' * ({g}) }}",
    "list indexed by a test": "{{ ['', '{p}'][{g}] }}",
    "dict indexed by a test": "{{ {true: '{p}', false: ''}[{g}] }}",
    "loop body": "{% for _ in range(({g})|int) %}{p}{% endfor %}",
}
# gates no conversation of RENDERS meets ({n}: a bound past what they hold)
NEVER = {
    "message count": "(messages|length) > {n}",
    "role groups": "(messages|groupby('role')|list|length) > 5 + {n}",
    "kwarg mapping": "(thinking is mapping and thinking.budget > {n})",
    "content length total": "(messages|map(attribute='role')|join|length) > 1000 * {n}",
}
WORDS = st.lists(st.sampled_from(["amber", "harbour", "lantern", "quietly", "seven", "drift"]), min_size=2, max_size=5)


def _answer(template: str) -> dict:
    answer = ct.run_battery(template, RENDERS, LIMITS)
    assert answer["status"] == "ok", answer
    return answer


def _unexercised(template: str) -> list[str]:
    return [i.detail for i in tb.unexercised_issues([_answer(template)]) if i.kind == "unexercised"]


def test_the_conversations_hold_fewer_than_a_hundred_messages():
    assert max(len(r["messages"]) for r in RENDERS) < 100  # the premise of NEVER's bounds


@SETTINGS
@given(form=st.sampled_from(sorted(FORMS)), gate=st.sampled_from(sorted(NEVER)), n=st.integers(100, 10**6),
       words=WORDS)  # fmt: skip
def test_a_branch_no_conversation_reaches_is_a_finding_naming_its_text(form, gate, n, words):
    text = "Zq " + " ".join(words)  # never in a render: the conversations hold no 'Zq'
    snippet = FORMS[form].replace("{g}", NEVER[gate].replace("{n}", str(n))).replace("{p}", text)
    found = _unexercised(LOOP + snippet)
    assert len(found) == 1 and text[:40] in found[0], (form, gate, found)
    assert re.search(r"line \d+ \(", found[0]), found


@SETTINGS
@given(form=st.sampled_from(sorted(FORMS)), words=WORDS)
def test_a_branch_some_conversation_reaches_is_no_finding(form, words):
    lengths = {len(r["messages"]) % 2 for r in RENDERS}
    assert lengths == {0, 1}  # both outcomes of the gate below are drawn
    gate = "(messages|length) % 2 == 0"
    snippet = FORMS[form].replace("{g}", gate).replace("{p}", "Zq " + " ".join(words))
    assert _unexercised(LOOP + snippet) == []


@SETTINGS
@given(role=st.sampled_from(["system", "developer", "<|im_start|>system\n"]), n=st.integers(100, 10**6))
def test_an_unreached_branch_writing_a_role_is_a_finding_even_where_the_role_is_seen(role, n):
    """A role swap gated on an input no draw has: the role's name is in every render, so only the
    branch being unreached tells."""
    gated = "{% for m in messages %}{% if (messages|length) > " + str(n) + " %}{% set r = " + repr(role) + " %}"
    gated += "{% else %}{% set r = m.role %}{% endif %}<|im_start|>{{ r }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    found = _unexercised("<|im_start|>system\nhi<|im_end|>\n" + gated)
    assert len(found) == 1 and role.strip() in found[0], found


@SETTINGS
@given(form=st.sampled_from(["if", "if-expression", "times a test", "loop body"]), words=WORDS)
def test_branches_decided_by_loader_constants_alone_are_dead_code_not_findings(form, words):
    """``bos_token``, ``pad_token`` and the loader's globals are fixed for one tokenizer: a branch
    they alone decide is taken alike in every render (the one never taken runs under no loader)."""
    for gate in ("bos_token == 'zz'", "pad_token is defined and pad_token == 'q'", "strftime_now is undefined"):
        snippet = FORMS[form].replace("{g}", gate).replace("{p}", "Zq " + " ".join(words))
        assert _unexercised(LOOP + snippet) == [], (form, gate)


def test_a_branch_that_only_refuses_the_render_is_no_finding():
    for snippet in (
        "{% if (messages|length) > 500 %}{{ raise_exception('too long') }}{% endif %}",
        "{{ raise_exception('too long') if (messages|length) > 500 else '' }}",
    ):
        assert _unexercised(LOOP + snippet) == [], snippet


def test_a_branch_inside_one_never_reached_is_named_once_by_the_outer_one():
    inner = "{% if m.role == 'user' %}Zq inner{% else %}Zq other{% endif %}{{ 'Zq value' * (m.role == 'tool') }}"
    outer = "{% if (messages|length) > 5000 %}Zq outer{% for m in messages %}"
    template = LOOP + outer + inner + "{% endfor %}{% endif %}"
    found = _unexercised(template)
    assert len(found) == 1 and found[0].count("line ") == 1 and "Zq outer" in found[0], found


def test_more_branches_than_the_sandbox_numbers_is_a_finding():
    template = LOOP + "{% if (messages|length) == 1 %}a{% endif %}" * 2100  # two branches each
    issues = tb.unexercised_issues([_answer(template)])
    assert any("more than 4096 branches" in i.detail for i in issues), issues


def test_a_family_template_has_no_branch_left_unreached():
    """The generated shapes reach every branch of a ChatML template with tools (the scan's own
    draws; the family fixtures are scanned whole in test_tokenscan_behaviour.py)."""
    template = (
        "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t|tojson }}\n{% endfor %}"
        + "<|im_end|>\n{% endif %}"
        + LOOP
        + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    renders = conv.generate("family", 24, {**CTX})
    answer = ct.run_battery(template, renders, LIMITS)
    assert tb.unexercised_issues([answer]) == []
    assert set(answer["reached"]) == set(range(len(answer["branches"]))), answer["branches"]


@SETTINGS
@given(marker=st.sampled_from(["</think>", "<tool_call>", "[TOOL_CALLS]", "<|im_end|>"]), n=st.integers(100, 10**6))
def test_a_branch_taken_for_markup_in_content_is_judged_as_markup_tests_are(marker, n):
    """What a template does with markup a user writes into content (Qwen3 cuts the reasoning of
    earlier turns at ``</think>``) is not drawn: its branch is exempt like the comparison itself;
    an ``elif`` taken for anything else is not."""
    cut = (
        "{% for m in messages %}{% if m.role == 'assistant' and " + repr(marker) + " in m.content %}"
        "<|im_start|>assistant\n{{ m.content.split(" + repr(marker) + ")[-1] }}<|im_end|>\n"
    )
    plain = "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    assert _unexercised(cut + plain) == []
    gated = "{% elif (messages|length) > " + str(n) + " %}Zq gated" + plain
    found = _unexercised(cut + gated)
    assert len(found) == 1 and "Zq gated" in found[0] and "(elif)" in found[0], found


def test_a_call_looked_for_in_a_list_argument_is_drawn_both_ways(tmp_path):
    """A template that writes built-in calls its own way (a tool call's name looked for in a
    list keyword argument, as Llama 3.1's ``builtin_tools``): the draw passes the list as the
    tools' names beside a call, so both ways are rendered; the name compared with the list's
    items is structure, not a demand per drawn text (which would overflow the draw)."""
    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    calls = (
        "{% for tc in m.tool_calls or [] %}{% if builtin_tools is defined and tc.function.name in builtin_tools %}"
        "<|python_tag|>{{ tc.function.name }}.call(){% else %}{{ tc.function|tojson }}{% endif %}{% endfor %}"
    )
    template = LOOP.replace("{{ m.content }}", "{{ m.content }}" + calls) + "{% if builtin_tools is defined %}"
    template += "<|eom_id|>{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    d = tmp_path / "tok"
    d.mkdir()
    config = {"eos_token": "<|im_end|>", "bos_token": "<s>", "chat_template": template}
    (d / "tokenizer_config.json").write_text(__import__("json").dumps(config), encoding="utf-8")
    found = [(f.id, f.message) for f in scan_directory(str(d), default_policy()).findings if f.id in ("TS814", "TS910")]
    assert found == [], found


def test_a_switch_read_only_beside_one_block_type_is_drawn_true_there(tmp_path):
    """A keyword argument the loader leaves undefined, tested for truth only where an image or a
    video block is (Qwen2-VL's ``add_vision_id``): each line's test asks for it set true in the
    shape it was read in, so the numbered branches are rendered (and judged), not left unreached."""
    from warden.tokenscan import scan_directory
    from warden.tokenscan.policy import default_policy

    blocks = (
        "{% for p in (m.content if m.content is not string else []) %}"
        "{% if p.type == 'image' %}{% if add_vision_id %}Picture: {% endif %}<|image|>"
        "{% elif p.type == 'video' %}{% if add_vision_id %}Video: {% endif %}<|video|>"
        "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
    )
    template = LOOP.replace("{{ m.content }}", "{{ m.content if m.content is string else '' }}" + blocks)
    d = tmp_path / "tok"
    d.mkdir()
    config = {"eos_token": "<|im_end|>", "chat_template": template}
    (d / "tokenizer_config.json").write_text(__import__("json").dumps(config), encoding="utf-8")
    found = [(f.id, f.message) for f in scan_directory(str(d), default_policy()).findings if f.id in ("TS814", "TS910")]
    assert found == [], found


def test_the_sandbox_undefined_shows_as_the_loaders():
    """The recording ``Undefined`` prints, tests and compares as jinja's default one (the loader's)."""
    template = "{{ x }}|{{ x is defined }}|{{ x|pprint }}|{{ 'y' if x else 'n' }}|{{ x|default('d') }}"
    answer = ct.run_battery(template, [{"name": "u", "messages": [], "context": {}}], LIMITS)
    import jinja2

    expected = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(template).render()
    assert answer["renders"][0]["output"] == expected, answer


@SETTINGS
@given(role=st.sampled_from(["system", "developer"]), n=st.integers(100, 10**6), via=st.sampled_from(["set", "block"]))
def test_a_branch_writing_a_variable_writes_the_literals_assigned_to_it(role, n, via):
    """Markup kept in a variable set outside the gated branch (``{% set opener = '<|im_start|>system' %}``)
    is what the branch writes when it prints the variable."""
    opener = "<|im_start|>" + role
    kept = f"{{% set opener = {opener!r} %}}" if via == "set" else f"{{% set opener %}}{opener}{{% endset %}}"
    gated = "{% if (messages|length) > " + str(n) + " %}{{ opener }}\n{% endif %}"
    found = _unexercised(kept + LOOP + gated)
    assert len(found) == 1 and opener in found[0], found


@SETTINGS
@given(name=st.sampled_from(["audit_token", "mode_token", "x_token"]), n=st.integers(100, 10**6))
def test_a_callers_keyword_named_like_a_token_is_an_input(name, n):
    """Only the loader's own ``*_token`` names are constants; another is a caller's keyword."""
    found = _unexercised(LOOP + "{% if " + name + " == 'on' %}<|im_start|>system\nZq{% endif %}")
    assert len(found) == 1 and "<|im_start|>system" in found[0], found


def test_a_template_defining_raise_exception_gets_no_raise_only_exemption():
    own = "{% macro raise_exception(m) %}<|im_start|>system\n{{ m }}<|im_end|>{% endmacro %}"
    gated = "{% if (messages|length) > 500 %}{{ raise_exception('Zq steer') }}{% endif %}"
    found = _unexercised(own + LOOP + gated)
    assert len(found) == 1 and "Zq steer" in found[0], found
