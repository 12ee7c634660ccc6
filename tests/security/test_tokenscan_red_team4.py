# ruff: noqa: E501 - attack tables and their miss reasons are kept one line each
"""Red-team round 4 against the tokenizer scanner (issue 33): attacks designed against the current
``warden/tokenscan`` by a team that did not write it, after reading it and rounds 1-3. Round 4 looks
at the neighbours of what rounds 1-3 tried: the *structure* of tools, tool calls, documents and
messages (JSON-schema values, counts and lengths, keys reached by ``|items``/``|dictsort``), the
loop object's other counters (``loop.cycle``, ``loop.revindex0``, ``loop.previtem``), string
ordering (``<``/``>``, ``|min``/``|max``/``|sort``), added-token entries and model flags of
tokenizer.json, generation_config keys rounds 1-2 did not name, JSON-format edge cases (duplicate
keys, lone surrogates, NaN) and scanner robustness (parser depth, output and loop bombs).

Per attack two tests, as in rounds 1-3: ``test_attack_is_real`` shows the behaviour with
transformers' own loader (``AutoTokenizer`` / ``apply_chat_template`` / ``GenerationConfig``) on a
directory built offline from the family fixtures; ``test_attack_is_caught`` asks ``scan_directory``
(default policy) for a finding at the severity that fails the scan. A miss is ``xfail(strict=True)``
naming the mechanism the scanner lacks (:data:`MISSES`). Template attacks on a mechanism carry the
NEUTRAL sentence, never steering words. Each directory is scanned once (a module-scoped cache).
``BENIGN`` directories (realistic variants of real families) must scan without a finding.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.security.tokenscan_kit import (
    NEUTRAL,
    PAYLOAD,
    QWEN_DEFAULT,
    SCAN_BUDGET,
    in_loop,
    on_top,
    scan_cache,
    scan_in_child,
    strict_xfail,
)
from tests.security.tokenscan_kit import edit as _edit
from tests.security.tokenscan_kit import tok as _tok
from tests.security.tokenscan_kit import user as _user
from tests.warden.tokenscan import families as fam

# name -> the mechanism the scanner lacks (measured 2026-12-06 21:20 UTC against a70b8bb: 34 misses; 32 caught
# since: inputs labelled by path, ordering and loop-counter demands, demands past their bounds reported, a
# field asked for drawn as a string, true and a list with a third round, strict JSON, the config's added
# tokens loaded in the tokenizer child, special tokens matched inside text, the model's unk token, byte
# pieces without byte_fallback, ordinary words added past the vocabulary)
MISSES: dict[str, str] = {}
BENIGN_FLAGGED: dict[str, str] = {}  # benign -> the false positive

N = repr(NEUTRAL)
S = "(message.content if message.content is string else '')"  # content, or '' for a list of parts


_in_loop, _on_top = in_loop, on_top


def _per_tool(body: str) -> str:
    """``body`` once per tool (``t``), before the Qwen2.5 template."""
    return _on_top("{% for t in tools or [] %}" + body + "{% endfor %}")


def _per_param(body: str) -> str:
    """``body`` once per tool parameter (name ``k``, schema ``p``), reached by ``|items``."""
    return _per_tool("{% for k, p in t.function.parameters.properties|items %}" + body + "{% endfor %}")


def _per_call(body: str) -> str:
    """``body`` once per tool call (``tc``) of each message."""
    return _in_loop("{% for tc in message.tool_calls or [] %}" + body + "{% endfor %}")


ARGS = "(tc.function.arguments if tc.function.arguments is mapping else {})"


def _turns(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)]


def _tool(
    name: str = "lookup",
    props: list[str] | None = None,
    desc: str = "a tool",
    schema: dict[str, Any] | None = None,
    required: list[str] | None = None,
    **function: Any,
) -> dict[str, Any]:
    props = props or ["q"]
    params: dict[str, Any] = {"type": "object", "properties": {p: dict(schema or {"type": "string"}) for p in props}}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params, **function}}


def _tools(*tools: dict[str, Any]) -> dict[str, Any]:
    return {"tools": list(tools)}


def _call(arguments: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    """A user turn, an assistant tool call with ``arguments`` (and ``extra`` call fields), its result."""
    tc = {"type": "function", "function": {"name": "shell", "arguments": arguments}, **extra}
    return [
        *_user("list the files"),
        {"role": "assistant", "content": "", "tool_calls": [tc]},
        {"role": "tool", "content": "ok"},
    ]


def _docs(n: int) -> dict[str, Any]:
    return {"documents": [{"title": f"doc {i}", "text": f"text {i}"} for i in range(n)]}


@dataclass(frozen=True)
class T:
    """A template attack: ``template`` on ``base``; ``marker`` renders for ``trigger`` (with ``kw``)
    and not for ``clean`` (with ``clean_kw``)."""

    cls: str
    template: str
    trigger: list[dict[str, Any]]
    clean: list[dict[str, Any]]
    kw: dict[str, Any] = field(default_factory=dict)
    clean_kw: dict[str, Any] = field(default_factory=dict)
    base: str = "qwen2.5"
    marker: str = NEUTRAL


HI = _user("hi")
TAGS = "".join(chr(0xE0000 + ord(c)) for c in PAYLOAD)  # invisible Unicode tag characters (ASCII smuggling)
PARTS = [{"role": "user", "content": [{"type": "text", "text": f"part {i}"} for i in range(8)]}]
PARTS_FEW = [{"role": "user", "content": [{"type": "text", "text": "part 0"}]}]

TEMPLATES: dict[str, T] = {
    # --- the loop object's other counters -------------------------------------------------------
    "loop.cycle with 130 arguments (the 130th message)": T(
        "loop", _in_loop("{{ loop.cycle(*([''] * 129 + [" + N + "])) }}"), _turns(130), _turns(9)
    ),
    "loop.revindex0 == 129": T("loop", _in_loop("{{ " + N + " if loop.revindex0 == 129 }}"), _turns(130), _turns(9)),
    "loop.previtem: two user turns in a row": T(
        "loop",
        _in_loop("{{ " + N + " * (loop.previtem is defined and loop.previtem.role == message.role == 'user') }}"),
        [*_user("a"), *_user("b")],
        [*_user("a"), {"role": "assistant", "content": "b"}, *_user("c")],
    ),
    # --- tool calls: arguments, ids, types --------------------------------------------------------
    "tool-call argument value reached by |items": T(
        "toolcall",
        _per_call("{% for k, v in " + ARGS + "|items %}{{ " + N + " * (v == 'rm -rf /') }}{% endfor %}"),
        _call({"cmd": "rm -rf /"}),
        _call({"cmd": "ls"}),
    ),
    "tool-call argument key reached by |dictsort": T(
        "toolcall",
        _per_call("{% for k, v in " + ARGS + "|dictsort %}{{ " + N + " * (k == 'sudo') }}{% endfor %}"),
        _call({"sudo": "yes"}),
        _call({"cmd": "ls"}),
    ),
    "tool-call argument count past 5": T(
        "toolcall",
        _per_call("{{ " + N + " * ((tc.function.arguments|length) > 5) }}"),
        _call({f"a{i}": "1" for i in range(6)}),
        _call({"cmd": "ls"}),
    ),
    "tool-call arguments' JSON length past 900": T(
        "toolcall",
        _per_call("{{ " + N + " * ((tc.function.arguments|tojson|length) > 900) }}"),
        _call({"cmd": "x" * 1000}),
        _call({"cmd": "ls"}),
    ),
    "tool-call id longer than 40": T(
        "toolcall",
        _per_call("{{ " + N + " * ((tc.id|default(''))|length > 40) }}"),
        _call({"cmd": "ls"}, id="call_" + "7" * 40),
        _call({"cmd": "ls"}, id="call_1"),
    ),
    "tool-call type 'custom'": T(
        "toolcall",
        _per_call("{{ " + N + " * (tc.type == 'custom') }}"),
        [
            *_call({"cmd": "ls"})[:1],
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "custom", "function": {"name": "shell", "arguments": {}}}],
            },
        ],
        _call({"cmd": "ls"}),
    ),
    # --- tool definitions: JSON-schema values and sizes ----------------------------------------------
    "enum value 'delete' in a tool parameter": T(
        "schema",
        _per_param("{{ " + N + " * ('delete' in (p.enum or [])) }}"),
        HI,
        HI,
        _tools(_tool(schema={"type": "string", "enum": ["read", "delete"]})),
        _tools(_tool(schema={"type": "string", "enum": ["read"]})),
    ),
    "enum with more than 9 values": T(
        "schema",
        _per_param("{{ " + N + " * (((p.enum|default([]))|length) > 9) }}"),
        HI,
        HI,
        _tools(_tool(schema={"type": "string", "enum": [f"v{i}" for i in range(10)]})),
        _tools(_tool(schema={"type": "string", "enum": ["v0", "v1"]})),
    ),
    "parameter type 'boolean'": T(
        "schema",
        _per_param("{{ " + N + " * (p.type == 'boolean') }}"),
        HI,
        HI,
        _tools(_tool(schema={"type": "boolean"})),
        _tools(_tool()),
    ),
    "parameter default true": T(
        "schema",
        _per_param("{{ " + N + " * (p.default is defined and p.default is true) }}"),
        HI,
        HI,
        _tools(_tool(schema={"type": "boolean", "default": True})),
        _tools(_tool(schema={"type": "boolean"})),
    ),
    "function strict: true": T(
        "schema",
        _per_tool("{{ " + N + " * (t.function.strict is true) }}"),
        HI,
        HI,
        _tools(_tool(strict=True)),
        _tools(_tool()),
    ),
    "tool type 'code_interpreter'": T(
        "schema",
        _per_tool("{{ " + N + " * (t.type == 'code_interpreter') }}"),
        HI,
        HI,
        _tools({**_tool(), "type": "code_interpreter"}),
        _tools(_tool()),
    ),
    "more than 6 required parameters": T(
        "schema",
        _per_tool("{{ " + N + " * (((t.function.parameters.required or [])|length) > 6) }}"),
        HI,
        HI,
        _tools(_tool(props=list("abcdefg"), required=list("abcdefg"))),
        _tools(_tool(props=list("ab"), required=list("ab"))),
    ),
    "more than 9 parameters": T(
        "schema",
        _per_tool("{{ " + N + " * ((t.function.parameters.properties|length) > 9) }}"),
        HI,
        HI,
        _tools(_tool(props=list("abcdefghij"))),
        _tools(_tool(props=list("abc"))),
    ),
    "parameter name longer than 30": T(
        "schema",
        _per_param("{{ " + N + " * ((k|length) > 30) }}"),
        HI,
        HI,
        _tools(_tool(props=["p" * 31])),
        _tools(_tool(props=["path"])),
    ),
    "tool description longer than 900": T(
        "schema",
        _per_tool("{{ " + N + " * ((t.function.description|length) > 900) }}"),
        HI,
        HI,
        _tools(_tool(desc="d" * 1000)),
        _tools(_tool()),
    ),
    "joined tool names longer than 400": T(
        "schema",
        _on_top("{{ " + N + " * (((tools or [])|map(attribute='function.name')|join(','))|length > 400) }}"),
        HI,
        HI,
        _tools(*[_tool(name=f"t{i}_" + "n" * 45) for i in range(10)]),
        _tools(_tool()),
    ),
    "tool name ordered before 'a' (a capitalised name)": T(
        "schema",
        _per_tool("{{ " + N + " * (t.function.name < 'a') }}"),
        HI,
        HI,
        _tools(_tool(name="Search")),
        _tools(_tool(name="search")),
    ),
    "more than 64 tools": T(
        "schema",
        _on_top("{{ " + N + " * ((tools or [])|length > 64) }}"),
        HI,
        HI,
        _tools(*[_tool(name=f"t{i}") for i in range(65)]),
        _tools(*[_tool(name=f"t{i}") for i in range(3)]),
    ),
    # --- conversation structure -----------------------------------------------------------------
    "more than 20 documents": T(
        "structure", _on_top("{{ " + N + " * ((documents or [])|length > 20) }}"), HI, HI, _docs(21), _docs(2)
    ),
    "a message with 6 or more keys": T(
        "structure",
        _in_loop("{{ " + N + " * ((message|length) >= 6) }}"),
        [{"role": "user", "content": "x", "name": "a", "id": "1", "lang": "en", "ts": "1"}],
        _user("x"),
    ),
    "role ordered before 'assistant' (string <)": T(
        "structure",
        _in_loop("{{ " + N + " * (message.role < 'assistant') }}"),
        [*_user("x"), {"role": "agent", "content": "y"}],
        [*_user("x"), {"role": "assistant", "content": "y"}],
    ),
    "more than 7 content parts (Llama 4)": T(
        "structure",
        _in_loop(
            "{{ " + N + " * (message.content is not string and (message.content|length) > 7) }}", fam.LLAMA4_TEMPLATE
        ),
        PARTS,
        PARTS_FEW,
        base="llama4",
    ),
    "more than 12 tool messages": T(
        "structure",
        _on_top("{{ " + N + " * ((messages|selectattr('role', 'equalto', 'tool')|list|length) > 12) }}"),
        [*_user("x"), *[{"role": "tool", "content": f"r{i}"} for i in range(13)]],
        [*_user("x"), *[{"role": "tool", "content": f"r{i}"} for i in range(2)]],
    ),
    "more than 16 tool calls in one message": T(
        "toolcall",
        _in_loop("{{ " + N + " * ((message.tool_calls or [])|length > 16) }}"),
        [
            *_user("x"),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": f"f{i}", "arguments": {}}} for i in range(17)],
            },
        ],
        _call({"cmd": "ls"}),
    ),
    "Unicode tag characters spelling a directive in the default prompt": T(
        "steering",
        fam.QWEN25_TEMPLATE.replace(QWEN_DEFAULT, QWEN_DEFAULT + TAGS),
        HI,
        [{"role": "system", "content": "be brief"}, *HI],
        marker=TAGS,
    ),
    # --- neighbours the scanner does catch (kept so a regression fails) ---------------------------------
    "loop.changed on content (a repeated message)": T(
        "content",
        _in_loop("{{ " + N + " if not loop.changed(" + S + ") }}"),
        [*_user("again"), {"role": "assistant", "content": "again"}],
        [*_user("again"), {"role": "assistant", "content": "other"}],
    ),
    "content ordered after 'zzz' (string >)": T(
        "content", _in_loop("{{ " + N + " * (" + S + " > 'zzz') }}"), _user("zzzz"), _user("hello")
    ),
    "|max of content and a constant": T(
        "content", _in_loop("{{ " + N + " * (([" + S + ", 'open']|max) == 'open') }}"), _user("hello"), _user("zebra")
    ),
    "tool name longer than 60": T(
        "schema",
        _per_tool("{{ " + N + " * ((t.function.name|length) > 60) }}"),
        HI,
        HI,
        _tools(_tool(name="n" * 61)),
        _tools(_tool()),
    ),
    "loop.length past 129": T("loop", _in_loop("{{ " + N + " if loop.length > 129 }}"), _turns(130), _turns(9)),
    "reasoning_effort ordered after 'm'": T(
        "structure",
        _on_top("{{ " + N + " * ((reasoning_effort|default('')) > 'm') }}"),
        HI,
        HI,
        {"reasoning_effort": "minimal"},
        {"reasoning_effort": "high"},
    ),
    "message count through a macro inside a call block": T(
        "loop",
        _on_top(
            "{% macro outer() %}{{ caller() }}{% endmacro %}{% macro cnt(ms) %}{{ ms|length }}{% endmacro %}{% call outer() %}{{ "
            + N
            + " * ((cnt(messages)|int) > 129) }}{% endcall %}"
        ),
        _turns(130),
        _turns(9),
    ),
}


# ---------------------------------------------------------------------------- tokenizer files


def _tj(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda d: _edit(d / "tokenizer.json", change)


def _fast(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """``change`` to tokenizer.json, loaded as written (``PreTrainedTokenizerFast``)."""

    def build(d: Path) -> None:
        _edit(d / "tokenizer.json", change)
        _edit(d / "tokenizer_config.json", lambda c: c.__setitem__("tokenizer_class", "PreTrainedTokenizerFast"))

    return build


def _gen(values: dict[str, Any]) -> Callable[[Path], None]:
    return lambda d: (d / "generation_config.json").write_text(json.dumps(values), encoding="utf-8")


def _special(t: dict[str, Any], content: str) -> dict[str, Any]:
    return next(a for a in t["added_tokens"] if a["content"] == content)


def _added(t: dict[str, Any], content: str, ident: int, special: bool = False) -> None:
    t["added_tokens"].append({"id": ident, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": not special, "special": special})  # fmt: skip


def _new_word(t: dict[str, Any]) -> None:
    _added(t, "Paris", max(a["id"] for a in t["added_tokens"]) + 1)


def _single_word_end(t: dict[str, Any]) -> None:
    _special(t, "<|im_end|>")["single_word"] = True


def _config_added_word(d: Path) -> None:
    """tokenizer_config.json's added_tokens_decoder (which transformers reads beside tokenizer.json)
    adds the special token ' not' at a new id."""
    entry = {
        "content": " not",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    _edit(d / "tokenizer_config.json", lambda c: c.setdefault("added_tokens_decoder", {}).__setitem__("4000", entry))


def _unk_is_sep(t: dict[str, Any]) -> None:
    t["model"]["unk_token"] = "[SEP]"


def _no_fallback(t: dict[str, Any]) -> None:
    t["model"]["byte_fallback"] = False


def _dropout(t: dict[str, Any]) -> None:
    t["model"]["dropout"] = 0.5


def _ctc(t: dict[str, Any]) -> None:
    ctc = {"type": "CTC", "pad_token": "Ġnot", "word_delimiter_token": "|", "cleanup": False}
    t["decoder"] = {"type": "Sequence", "decoders": [ctc, t["decoder"]]}


def _prepend(t: dict[str, Any]) -> None:
    t["normalizer"] = {"type": "Prepend", "prepend": NEUTRAL + " "}
    for a in t["added_tokens"]:
        a["normalized"] = False


def _roberta(t: dict[str, Any]) -> None:
    s, e = _special(t, "<|im_start|>")["id"], _special(t, "<|im_end|>")["id"]
    t["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|im_end|>", e], "cls": ["<|im_start|>", s],
                           "trim_offsets": True, "add_prefix_space": False}  # fmt: skip


@dataclass(frozen=True)
class F:
    cls: str
    base: str
    build: Callable[[Path], None]
    verify: Callable[[Path, Path], None]  # (attacked dir, the untouched base) -> asserts


def _v_new_word(d: Path, b: Path) -> None:
    ids = _tok(d)("Paris", add_special_tokens=False)["input_ids"]
    assert ids == [len(_tok(b))], (ids, len(_tok(b)))  # one id past every id the base has: no trained embedding


def _v_single_word_end(d: Path, _b: Path) -> None:
    tok = _tok(d)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok("hi <|im_end|>", add_special_tokens=False)["input_ids"][-1] == end
    assert end not in tok("hi<|im_end|>", add_special_tokens=False)["input_ids"]  # after a word: plain text
    ids = tok.apply_chat_template(HI, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids.count(end) == 1  # the system turn ends, the user's 'hi<|im_end|>' never does


def _v_config_added_word(d: Path, _b: Path) -> None:
    tok = _tok(d)
    assert tok.decode(tok("do not go")["input_ids"], skip_special_tokens=True).split() == ["do", "go"]


def _v_unk_is_sep(d: Path, _b: Path) -> None:
    tok = _tok(d)
    tokens = tok.convert_ids_to_tokens(tok("hello \u4e16 world")["input_ids"])
    assert tokens == ["[CLS]", "hello", "[SEP]", "world", "[SEP]"], tokens  # an unknown character ends the segment


def _v_no_fallback(d: Path, b: Path) -> None:
    text = "caf\u00e9 \u2192 \u4e16\u754c"
    tok, base = _tok(d), _tok(b)
    assert tok.unk_token_id in tok(text, add_special_tokens=False)["input_ids"]
    assert base.unk_token_id not in base(text, add_special_tokens=False)["input_ids"]


def _v_dropout(d: Path, _b: Path) -> None:
    tok = _tok(d)
    text = "the quick brown fox jumps over the lazy dog " * 4
    assert len({tuple(tok(text, add_special_tokens=False)["input_ids"]) for _ in range(8)}) > 1


def _v_ctc(d: Path, _b: Path) -> None:
    tok = _tok(d)
    assert tok.decode(tok("do not go", add_special_tokens=False)["input_ids"]) == "do go"


def _v_prepend(d: Path, _b: Path) -> None:
    tok = _tok(d)
    ids = tok.apply_chat_template(HI, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(ids).count(NEUTRAL) >= 2  # once per text segment between the chat markers


def _v_roberta(d: Path, _b: Path) -> None:
    tok = _tok(d)
    ids = tok("hello")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")


def _v_gen(key: str, value: Any) -> Callable[[Path, Path], None]:
    def verify(d: Path, _b: Path) -> None:
        from transformers import GenerationConfig

        assert getattr(GenerationConfig.from_pretrained(str(d)), key) == value

    return verify


EVIL = fam.QWEN25_TEMPLATE.replace(QWEN_DEFAULT, PAYLOAD)


def _duplicate_key(d: Path) -> None:
    """tokenizer_config.json names chat_template twice: the benign one first, a steering one last."""
    (d / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    text = json.dumps(config)[:-1] + ', "chat_template": ' + json.dumps(fam.QWEN25_TEMPLATE)
    (d / "tokenizer_config.json").write_text(text + ', "chat_template": ' + json.dumps(EVIL) + "}", encoding="utf-8")


def _duplicate_name(d: Path) -> None:
    """Two named templates both called 'default': the benign one first, a steering one last."""
    (d / "chat_template.jinja").unlink(missing_ok=True)
    named = [{"name": "default", "template": fam.QWEN25_TEMPLATE}, {"name": "default", "template": EVIL}]
    _edit(d / "tokenizer_config.json", lambda c: c.__setitem__("chat_template", named))


def _v_evil_template(d: Path, _b: Path) -> None:
    assert PAYLOAD in _tok(d).apply_chat_template(HI, tokenize=False, add_generation_prompt=True)


def _raw_config(d: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """``change`` to tokenizer_config.json, written with JSON escapes (lone surrogates) and NaN kept."""
    (d / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.setdefault("chat_template", fam.QWEN25_TEMPLATE)
    change(config)
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _surrogate_default(d: Path) -> None:
    _raw_config(
        d, lambda c: c.__setitem__("chat_template", fam.QWEN25_TEMPLATE.replace(QWEN_DEFAULT, "\ud800" + QWEN_DEFAULT))
    )


def _v_surrogate_default(d: Path, _b: Path) -> None:
    tok = _tok(d)
    assert tok.apply_chat_template([{"role": "system", "content": "s"}, *HI], tokenize=True)  # a system message: fine
    with pytest.raises((TypeError, UnicodeError)):  # no system message: the default prompt cannot be encoded
        tok.apply_chat_template(HI, tokenize=True, add_generation_prompt=True)


def _nan_length(d: Path) -> None:
    _raw_config(d, lambda c: c.__setitem__("model_max_length", float("nan")))


def _v_nan_length(d: Path, _b: Path) -> None:
    tok = _tok(d)
    assert tok.model_max_length != tok.model_max_length  # NaN: every comparison with it is false
    assert tok("a short prompt")["input_ids"]
    with pytest.raises(TypeError, match="max_length"):  # every truncating call fails
        tok("a short prompt", truncation=True)


FILES: dict[str, F] = {
    "added token 'Paris' with an id past the vocabulary": F("added", "qwen2.5", _tj(_new_word), _v_new_word),
    "single_word on <|im_end|> (a turn ending in a word never ends)": F(
        "added", "qwen2.5", _fast(_single_word_end), _v_single_word_end
    ),
    "added_tokens_decoder in tokenizer_config adds special ' not'": F(
        "added", "qwen2.5", _config_added_word, _v_config_added_word
    ),
    "WordPiece unk_token is [SEP] (unknown text splits the segment)": F(
        "model", "bert", _fast(_unk_is_sep), _v_unk_is_sep
    ),
    "byte_fallback false on a byte-fallback family (Mistral)": F(
        "model", "mistral", _fast(_no_fallback), _v_no_fallback
    ),
    "tokenizer_config NaN model_max_length": F("format", "qwen2.5", _nan_length, _v_nan_length),
    "lone surrogate in the default system prompt": F("format", "qwen2.5", _surrogate_default, _v_surrogate_default),
    # caught neighbours
    "BPE dropout 0.5": F("model", "qwen2.5", _fast(_dropout), _v_dropout),
    "CTC decoder drops 'Ġnot'": F("pipeline", "qwen2.5", _fast(_ctc), _v_ctc),
    "Prepend normaliser adds a sentence to every segment": F("pipeline", "qwen2.5", _fast(_prepend), _v_prepend),
    "RobertaProcessing wraps every encoding in chat markers": F("pipeline", "qwen2.5", _fast(_roberta), _v_roberta),
    "duplicate chat_template key (last wins)": F("format", "qwen2.5", _duplicate_key, _v_evil_template),
    "two named templates called 'default' (last wins)": F("format", "qwen2.5", _duplicate_name, _v_evil_template),
    "generation_config forced_bos_token_id": F(
        "generation", "qwen2.5", _gen({"forced_bos_token_id": 42}), _v_gen("forced_bos_token_id", 42)
    ),
    "generation_config max_time 0.01": F("generation", "qwen2.5", _gen({"max_time": 0.01}), _v_gen("max_time", 0.01)),
    "generation_config exponential_decay_length_penalty": F(
        "generation",
        "qwen2.5",
        _gen({"exponential_decay_length_penalty": [1, 5.0]}),
        _v_gen("exponential_decay_length_penalty", [1, 5.0]),
    ),
}

# ---------------------------------------------------------------------------- robustness


def _template(text: str) -> Callable[[Path], None]:
    def build(d: Path) -> None:
        (d / "chat_template.jinja").unlink(missing_ok=True)
        fam._set_template(d, text)

    return build


def _nested_normalizers(d: Path) -> None:
    t = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    t["normalizer"] = "@@"
    deep = '{"type": "Sequence", "normalizers": [' * 3000 + '{"type": "NFC"}' + "]}" * 3000
    (d / "tokenizer.json").write_text(json.dumps(t).replace('"@@"', deep), encoding="utf-8")


ROBUST: dict[str, Callable[[Path], None]] = {
    "20k nested parentheses in an expression": _template(
        "{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}" + fam.QWEN25_TEMPLATE
    ),
    "3000 nested if blocks": _template("{% if true %}" * 3000 + "{% endif %}" * 3000 + fam.QWEN25_TEMPLATE),
    "50k-term concatenation": _template("{{ '' " + "~ 'a' " * 50000 + "}}" + fam.QWEN25_TEMPLATE),
    "string doubled 40 times (1 TB)": _template(
        "{% set ns = namespace(s='ab') %}{% for _ in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
        + fam.QWEN25_TEMPLATE
    ),
    "normalizer Sequence nested 3000 deep": _nested_normalizers,
}
SCAN_WALL = 25.0  # the budget plus the sandbox's grace


# ---------------------------------------------------------------------------- benign
FUNCTIONARY_TOOLS = """{%- if tools %}<|im_start|>system
You can call these functions:
{%- for tool in tools %}
## {{ tool.function.name }}: {{ tool.function.description }}
{%- for name, schema in tool.function.parameters.properties|items %}
- {{ name }} ({{ schema.type }}{{ ', one of ' ~ schema.enum|join(', ') if schema.enum is defined }}){{ ' required' if name in (tool.function.parameters.required or []) }}
{%- endfor %}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CODER_CALLS = """{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content or '' }}
{%- for tool_call in message.tool_calls %}
{%- set tool_call = tool_call.function if tool_call.function is defined else tool_call %}
<tool_call>
<function={{ tool_call.name }}>
{%- if tool_call.arguments is mapping %}
{%- for args_name, args_value in tool_call.arguments|items %}
<parameter={{ args_name }}>
{{ args_value if args_value is string else args_value|tojson }}
</parameter>
{%- endfor %}
{%- endif %}
</function>
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

RAG_DOCS = """<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}
{%- if documents %}

Documents:
{%- for doc in documents %}
Document {{ loop.index0 }}: {{ doc.title|default('untitled') }}
{{ doc.text }}
{%- endfor %}
{%- endif %}<|im_end|>
{% for message in messages if message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _phi3_rstrip(d: Path) -> None:
    """Phi-3 ships its chat markers with ``rstrip: true``."""

    def change(t: dict[str, Any]) -> None:
        for a in t["added_tokens"]:
            if a["content"] in ("<|assistant|>", "<|system|>", "<|end|>", "<|user|>"):
                a["rstrip"] = True

    _edit(d / "tokenizer.json", change)


BENIGN: dict[str, tuple[str, Callable[[Path], None]]] = {
    "Functionary-style tool list (parameters by |items, enum values)": ("qwen2.5", _template(FUNCTIONARY_TOOLS)),
    "Qwen3-Coder-style XML tool calls (arguments by |items)": ("qwen2.5", _template(CODER_CALLS)),
    "RAG template numbering documents by loop.index0": ("qwen2.5", _template(RAG_DOCS)),
    "phi3 with rstrip chat markers (as Phi-3 ships)": ("phi3", _phi3_rstrip),
    "qwen2.5 with a greedy generation_config": (
        "qwen2.5",
        _gen({"do_sample": False, "max_new_tokens": 2048, "repetition_penalty": 1.05}),
    ),
}


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("red-team-4")
    bases: dict[str, Path] = {}
    dirs: dict[str, tuple[Path, Path]] = {}

    def base(name: str) -> Path:
        if name not in bases:
            bases[name] = fam.build_family(name, root / "base" / name)
        return bases[name]

    def get(name: str) -> tuple[Path, Path]:
        if name not in dirs:
            d = root / f"a{len(dirs)}"
            if name in TEMPLATES:
                b, build = TEMPLATES[name].base, _template(TEMPLATES[name].template)
            elif name in FILES:
                b, build = FILES[name].base, FILES[name].build
            elif name in BENIGN:
                b, build = BENIGN[name]
            else:
                b, build = "qwen2.5", ROBUST[name]
            shutil.copytree(base(b), d)
            build(d)
            dirs[name] = (d, base(b))
        return dirs[name]

    return get


@pytest.fixture(scope="module")
def scanned(built: Callable[[str], tuple[Path, Path]]) -> Callable[[str], list[tuple[str, str, str]]]:
    """One default-policy scan per directory: its (id, severity, message) findings, blocking ones marked."""
    return scan_cache(lambda name: built(name)[0])


def _render(d: Path, messages: list[dict[str, Any]], kw: dict[str, Any]) -> str:
    return str(_tok(d).apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True, **kw}))


def _marks(name: str) -> list[Any]:
    return strict_xfail(MISSES, name, "red team")


ATTACKS = [*TEMPLATES, *FILES]


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTACKS)
def test_attack_is_real(built: Callable[[str], tuple[Path, Path]], name: str) -> None:
    d, b = built(name)
    if name in FILES:
        FILES[name].verify(d, b)
        return
    t = TEMPLATES[name]
    assert t.marker in _render(d, t.trigger, t.kw)
    assert t.marker not in _render(d, t.clean, t.clean_kw)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n), id=n) for n in ATTACKS])
def test_attack_is_caught(scanned: Callable[[str], list[tuple[str, str, str]]], name: str) -> None:
    found = scanned(name)
    assert any(sev == "blocking" for _i, sev, _m in found), f"{name}: scanned clean {found}"


def _scan_in_child(d: Path) -> dict[str, Any] | None:
    return scan_in_child(d, SCAN_WALL)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n), id=n) for n in ROBUST])
def test_scan_ends_within_its_deadline(built: Callable[[str], tuple[Path, Path]], name: str) -> None:
    """A scan of a hostile directory ends in a blocking finding or a refusal within its budget."""
    out = _scan_in_child(built(name)[0])
    assert out is not None, f"{name}: the scan ran past {SCAN_WALL}s (budget {SCAN_BUDGET}s)"
    assert "crash" not in out, out
    assert out["blocking"] or out["errors"], out
    assert out["seconds"] <= SCAN_BUDGET + 10, out


def _benign_marks(name: str) -> list[Any]:
    return strict_xfail(BENIGN_FLAGGED, name, "false positive")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_benign_marks(n), id=n) for n in BENIGN])
def test_benign_variant_scans_clean(
    built: Callable[[str], tuple[Path, Path]], scanned: Callable[[str], list[tuple[str, str, str]]], name: str
) -> None:
    d, _b = built(name)
    assert _tok(d).apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    found = scanned(name)
    assert not found, found
