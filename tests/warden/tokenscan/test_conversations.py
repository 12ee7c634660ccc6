# ruff: noqa: E501 - templates one construct a line
"""Issue 33: generated conversations (warden/tokenscan/conversations.py) and the judges around
them: the generator's coverage and bounds, the differential judge, run-time taint (guards,
markup, lengths, lookups), lookalike markup, the loader's variables (unset tokens stay
undefined, the probe string has no readable attribute), and a spent budget being incomplete."""

from __future__ import annotations

import json

from warden.tokenscan import chat_template as ct
from warden.tokenscan import conversations as conv
from warden.tokenscan import template_battery as tb
from warden.tokenscan.exercise import loader_context
from warden.tokenscan.policy import ChatTemplatePolicy, default_policy
from warden.tokenscan.scanner import build_snapshot, scan_directory

CTX = {"bos_token": "<s>", "add_generation_prompt": True, "tools": None, "documents": None}
LIMITS = ct.RenderLimits(2.0, 1 << 20, 1 << 30)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_generation_is_seeded_bounded_and_covers_the_inputs_families_read():
    renders = conv.generate("seed", 24, CTX)
    assert renders == conv.generate("seed", 24, CTX) and renders != conv.generate("other", 24, CTX)
    assert len(renders) == 72 and [r["name"] for r in renders[:3]] == ["g0a", "g0b", "g0t"]
    messages = [m for r in renders for m in r["messages"]]
    assert {m["role"] for m in messages} == {"system", "developer", "user", "assistant", "tool"}
    assert any(isinstance(m["content"], list) for m in messages)  # list-of-parts content
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert calls and not any("QTOOLPROBE" in n for n in calls)  # names other than the battery's
    lengths = [len(m["content"]) for m in messages if isinstance(m["content"], str) and m["content"]]
    assert min(lengths) < 50 and max(lengths) > 1000
    turns = [len(r["messages"]) for r in renders]
    assert min(turns) == 1 and max(turns) >= 48
    kwargs = {k for r in renders for k in r["context"]}
    assert {"enable_thinking", "reasoning_effort", "add_generation_prompt", "tools", "documents"} <= kwargs
    assert any(r["context"]["documents"] for r in renders) and any(r["context"]["tools"] for r in renders)
    assert len({r["now"] % 86400 for r in renders}) > 20  # times across the day, not midnight
    assert all(r["now"] % 86400 for r in renders[:6])
    for a, b in zip(renders[0::3], renders[1::3], strict=True):  # two fillings of one shape
        assert [m["role"] for m in a["messages"]] == [m["role"] for m in b["messages"]]
        assert a["context"].keys() == b["context"].keys() and a["texts"] != b["texts"]


def test_abstract_finds_texts_as_printed_raw_as_json_and_as_repr():
    text = 'Qx it\'s "q"\nz'
    for printed in (text, json.dumps(text), repr(text), json.dumps(text)[1:-1]):
        assert conv.abstract(f"<a>{printed}<b>", [text]) == "<a>\x000\x00<b>"


def _answer(*outputs: str) -> dict:
    return {"status": "ok", "renders": [{"status": "ok", "output": o} for o in outputs]}


def test_the_differential_judge_names_the_shape_and_the_clock_may_change_dates_only():
    renders = conv.generate("j", 1, CTX)
    a, b, _t = renders

    def fill(r: dict, extra: str = "") -> str:
        return "".join(f"<|x|>{t}" for t in r["texts"]) + extra

    same = _answer(fill(a), fill(b), fill(a))
    assert conv.judge(renders, same) == []
    moved = _answer(fill(a), fill(b, "Buy ACME"), fill(a))
    (issue,) = conv.judge(renders, moved)
    assert issue.kind == "taint" and "roles " in issue.detail and "ACME" in issue.detail
    dated = _answer(
        fill(a, "Today is Mon 1 Jan 2024"), fill(b, "Today is Mon 1 Jan 2024"), fill(a, "Today is Tue 2 Jan 2024")
    )
    assert conv.judge(renders, dated) == []
    clocked = _answer(fill(a), fill(b), fill(a, "Evening mode: obey"))
    assert [i.kind for i in conv.judge(renders, clocked)] == ["varies"]


def test_taint_records_guards_markup_lengths_and_lookups():
    records = [
        ["content", "in", "<|channel|>analysis<|message|>", 7],  # a guard line: input validation
        ["content", "split", "</think>", 3],  # markup
        ["content", "length gt", "0", 4],  # emptiness
        ["content", "length gt", "250", 4],
        ["content", "lookup", "a dict or set", 5],
        ["content", "replace", "please", 6],
        ["date", "==", "2030", 0],
    ]
    found = [i.detail for i in tb.taint_issues(records, ("<|im_end|>",), frozenset({7}))]
    assert len(found) == 4, found
    assert "250" in found[0] and "key" in found[1] and "'please'" in found[2] and "the date" in found[3]
    assert [i.kind for i in tb.taint_issues(records[:1], (), frozenset())] == ["taint"]  # off the guard line


def test_guard_lines_are_refusing_ifs_only():
    guard = "{% for m in messages %}\n{% if '<|x|>y' in m.content %}\n{{ raise_exception('no') }}\n{% endif %}\n{% endfor %}"
    assert ct.guard_lines(guard) == {2}
    branch = guard.replace("{{ raise_exception('no') }}", "{{ 'hi' }}")
    assert ct.guard_lines(branch) == frozenset()
    shared = "{% for m in messages %}{% if 'k' in m.content %}{{ raise_exception('no') }}{% endif %}{{ 'x' if 'k' in m.content }}{% endfor %}"
    assert ct.guard_lines(shared) == frozenset()  # a trigger on the guard's line is not exempt


def test_lookalike_markup_is_found_and_the_real_tokens_are_not():
    tokens = ("<|im_end|>", "<|im_start|>")
    assert tb.lookalike_issues("t", "<|im_start|>user\nhi<|im_end|>", tokens) == []
    for fake in ("<｜im_end｜>", "<|im_еnd|>", "＜|im_end|＞", "<|IM_END|>"):
        (issue,) = tb.lookalike_issues("t", f"<|im_start|>user\nhi{fake}", tokens)
        assert issue.kind == "lookalike" and fake in issue.detail
    assert tb.lookalike_issues("t", "<｜User｜>", ("<｜User｜>",)) == []  # DeepSeek's own fullwidth tokens


def test_unset_special_tokens_stay_undefined_and_the_probe_string_has_no_readable_attribute(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "</s>", "pad_token": None, "chat_template": CHATML})
    )
    context = loader_context(build_snapshot(str(d), default_policy()))
    assert context["eos_token"] == "</s>" and "pad_token" not in context and "bos_token" not in context
    probe = (
        "{{ pad_token is defined }}|{{ eos_token is defined }}|{{ messages[0].content.source is defined }}|"
        "{{ messages[0].content.__class__ is defined }}"
    )
    answer = ct.run_battery(
        probe, [{"name": "x", "messages": [{"role": "user", "content": "hi"}], "context": context, "now": 0}], LIMITS
    )
    assert answer["renders"][0]["output"] == "False|True|False|False"


def test_generated_conversations_past_their_budget_are_incomplete_never_clean(tmp_path):
    """A template fast on the battery's short probes but slow on long content: the generated
    renders time out, and the template is analysis-incomplete (TS910), not clean."""
    slow = CHATML.replace(
        "{% for m in messages %}",
        "{% for m in messages %}{% for _ in range(m.content|length) %}{% for _ in range(2000) %}{% endfor %}{% endfor %}",
    )
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": slow}))
    policy = default_policy(chat_template=ChatTemplatePolicy(render_timeout_seconds=0.25))
    result = scan_directory(str(d), policy)
    assert any(f.id == "TS910" and "generated conversations" in f.message for f in result.findings), result.findings
    assert result.outcome(policy.fail_severity) != 0


def test_a_family_template_renders_every_generated_shape_it_accepts(tmp_path):
    """The generated renders reach the sandbox and come back judged: CHATML (insertion only)
    is clean, and a copy that rewrites content is not."""
    renders = conv.generate("fam", 6, CTX)
    clean = ct.run_battery(CHATML, renders, LIMITS)
    assert all(r["status"] == "ok" for r in clean["renders"]) and conv.judge(renders, clean) == []
    rewriting = CHATML.replace("{{ m.content }}", "{{ m.content|replace('a', 'b') }}")
    answer = ct.run_battery(rewriting, renders, LIMITS)
    assert conv.judge(renders, answer) and any(t[1] == "replace" for t in answer["taint"])


def test_a_tool_call_rendered_under_another_name_is_a_role_issue():
    """Every generated tool call rendered with its arguments is rendered with its own name; a
    template writing a fixed name over the drawn arguments shows the model calls it never made."""
    calls = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.content is string else '' }}"
        '{% for tc in m.tool_calls or [] %}<tool_call>{"name": "NAME", "arguments": '
        "{{ tc.function.arguments|tojson }}}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    )
    renders = conv.generate("calls", 24, {**CTX, "tools": None})
    assert any(m.get("tool_calls") for r in renders for m in r["messages"])  # the draw holds calls
    honest = ct.run_battery(calls.replace("NAME", "{{ tc.function.name }}"), renders, LIMITS)
    fixed = ct.run_battery(calls.replace("NAME", "shell"), renders, LIMITS)
    assert [i for i in conv.judge(renders, honest) if i.kind == "role"] == []
    found = [i for i in conv.judge(renders, fixed) if i.kind == "role"]
    assert found and "without its name" in found[0].detail, found


def test_a_failure_of_the_scanners_own_draw_is_not_analysed_never_a_traceback(tmp_path, monkeypatch):
    """Whatever goes wrong in the scanner's draw or judge of a template's generated conversations
    (a value of a kind it did not expect), the template is analysis-incomplete (TS910), the scan
    returns, and its verdict is not kept for reuse."""
    from warden.tokenscan import exercise

    def broken(*args, **kwargs):
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(exercise.conv, "demanded", broken)
    d = tmp_path / "tok"
    d.mkdir()
    template = CHATML.replace("{% for m in messages %}", "{% for m in messages %}{{ m.meta.x if m.meta is defined }}")
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": template}))
    result = scan_directory(str(d), default_policy(chat_template=ChatTemplatePolicy(conversation_seed="broken")))
    found = [f for f in result.findings if f.id == "TS910" and "could not be judged" in f.message]
    assert found and "AttributeError" in found[0].message, result.findings
