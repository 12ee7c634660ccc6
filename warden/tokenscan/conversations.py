"""Generated conversations for chat templates (issue 33): seeded, bounded, property-based.

The fixed battery of :mod:`.template_battery` renders a few shapes a template author can read
and avoid. :func:`generate` draws conversation *shapes* from a seeded generator: roles
(``system``, ``developer``, ``user``, ``assistant``, ``tool``), 1 to dozens of turns, string or
list-of-parts content, assistant tool calls with arbitrary names and tool responses, the
keyword arguments families read (``enable_thinking``, ``reasoning_effort``, ``thinking``,
``add_generation_prompt``, ``tools``, ``documents``, ``builtin_tools``) and a clock anywhere in
the day. Given the template, what it reads is probed too (:func:`template_inputs`, from its
AST, never evaluated): its own keyword arguments, roles and content-block types it compares,
keys it looks up (message and document fields, tool parameters), conversation and content
lengths at its integer literals; each input in two shapes, without and with a system message.
Then the draw follows what the template was seen to test (:func:`demanded`, round two): the
sandbox records, for every input value, the tests the template applied to it at run time
(*demands*: ``sandbox_child.py``), and each test no round-one input passed gets an input that
passes it (:mod:`.demands`: a role, type, tool name or keyword argument equal to, starting or
ending with the operand, padded for a slice; a field or tool parameter of the asked name or of a
name passing the key predicate; a conversation, tool list or document list just past the bound).
Invariant: **every input value the template's control flow is observed to test is drawn in a form
that satisfies the test at least once** (within the bounds of :mod:`.demands`; what is past them is
reported, never dropped). Messages carry reasoning as transformers 5 aliases it
(:func:`alias_reasoning`). Each shape is
rendered three times: with two fillings of different content (lengths from a few to thousands
of characters, Unicode, quotes, newlines, template-like text) and with the first filling at
another time of day.

:func:`judge` is pure and states the invariant: a render is the template's fixed markup for
the shape with the contents inserted in order. Each render is *abstracted* (every content,
tool name, argument and document text replaced by a placeholder, also where the template
escaped it with ``tojson`` or Python's repr); the two fillings must abstract to the same text
(else the template reacts to content beyond inserting it: a ``replace`` filter, an
``and``/``or`` on content, a length-keyed ``range``, a dict lookup), and the other clock may
change date words only. Each issue names the input that triggered it. The judge runs in the
scanner's process, so every comparison is bounded by construction (see the bounded comparison
section below): a render past :data:`JUDGE_CHARS` is itself an issue and is read to the bound.

What a render adds before the first message when the conversation has no system message (a
default system prompt) is returned by :func:`default_system_prompt` for the approval report:
vendors ship one, so it is surfaced for a person to review, and judged by the text rules.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes

from warden.tokenscan import chat_template as ct
from warden.tokenscan import demands as dm

ROLES_AFTER_FIRST = ("user", "assistant")
KWARGS = ("enable_thinking", "reasoning_effort", "thinking", "add_generation_prompt", "builtin_tools")
# characters content is drawn from: letters of several scripts, digits, punctuation a template
# might escape (quotes, backslash, braces), newlines and tabs inside (never at the ends: vendors
# trim content), emoji. No markup characters (<, >, |, [, ]): vendors validate content for
# their own markup and refuse it, which would only hide the render.
POOL = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "      .,;:!?'\"-_/\\(){}%#&*+=@$~^`\n\t"
    "éüßøñçàλπΩдЖяשלוםمرحبا中文字日本語한국어🙂🚀∑≈"
)
START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
DAY_SECONDS = 86400
FIRST_DAY = 1704067200  # 2024-01-01
DAYS = 3650


@dataclass(frozen=True)
class GeneratedIssue:
    """``kind``: taint (content beyond insertion), varies (another input beyond the documented
    kwargs: the clock, tool names, document text), text, role (a tool call under another name);
    ``detail`` names the input."""

    kind: str
    detail: str


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(START) for _ in range(n))


CHUNK = 16
_CHUNKS = tuple("".join(random.Random(i).choices(POOL, k=CHUNK)) for i in range(512))  # fixed pieces of the pool


def _text(rng: random.Random, low: int, high: int, tag: str) -> str:
    """A unique, locatable text: a tag word, then ``low``..``high`` characters of the pool (in
    pieces of :data:`CHUNK`: a long text costs a few draws), ending with a letter."""
    n = rng.randint(low, high)
    body = "".join(rng.choices(_CHUNKS, k=n // CHUNK + 1))[:n]
    return f"{tag}{body}{rng.choice(START)}"


EXTREMES = (
    {"turns": 24, "first": 0.0},
    {"turns": 1, "first": 0.9, "single": True},
    {"turns": 2, "first": 0.45, "parts": False},
    {"turns": 2, "first": 0.9, "parts": True},
    {"turns": 3, "first": 0.9, "parts": False, "plain": True, "tools": 3, "docs": 1},
    {"turns": 3, "first": 0.0, "parts": False, "agent": True, "tools": 1},
)
# the first shapes of every draw: the longest conversation (with a system prompt), a single
# user message, a developer message, list-of-parts content, tools and a document passed to plain
# alternating turns (templates that refuse tool roles still see them: the fields they read are
# seen by the sandbox, see demanded), an agent's loop (a second system message mid-conversation,
# ending on tool results before the next answer); the rest are drawn


def _roles(rng: random.Random, turns: int | None = None, first: float | None = None, plain: bool = False) -> list[str]:
    """A role sequence: an optional system or developer message, then user/assistant turns with
    tool exchanges (an assistant tool call, one or more tool responses, the answer)."""
    out: list[str] = []
    first = rng.random() if first is None else first
    if first < 0.4:
        out.append("system")
    elif first < 0.55:
        out.append("developer")
    turns = turns or rng.choice((1, 1, 2, 3, 5, 8, 13, 24))
    for i in range(turns):
        out.append("user")
        if not plain and rng.random() < 0.2:
            out += ["assistant_call"] + ["tool"] * rng.choice((1, 1, 2)) + ["assistant"]
        elif i < turns - 1 or rng.random() < 0.3:
            out.append("assistant")
    return out


def _shape(rng: random.Random, index: int, forced: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything a render depends on except the texts: roles, content kinds, kwargs, the clock."""
    forced = forced or {}
    roles = (
        ["user"]
        if forced.get("single")
        else _roles(rng, forced.get("turns"), forced.get("first"), forced.get("plain", False))
    )
    if forced.get("agent"):  # a system message after the first exchange; tool results last
        roles = [*roles[:3], "system", *roles[3:-1], "assistant_call", "tool", "tool"]
    if forced.get("messages"):  # a demanded conversation length: exactly that many messages
        n = min(int(forced["messages"]), MAX_MESSAGES)
        roles = _roles(rng, min(MAX_TURNS, n // 2 + 1), forced.get("first"), True)[:n]
    if forced.get("calls") and "assistant_call" not in roles:  # a demanded number of tool calls: an exchange
        at = roles.index("user") + 1 if "user" in roles else len(roles)  # answering the first question
        roles = [*roles[:at], "assistant_call", "tool", "assistant", *roles[at:]]
    if forced.get("role"):  # a role the template names: after the first answer (or the question)
        at = roles.index("assistant") + 1 if "assistant" in roles else len(roles)
        roles = [*roles[:at], forced["role"], *roles[at:]]
    parts = (
        forced["parts"] if "parts" in forced else rng.random() < 0.3
    )  # a third of the shapes give some messages as lists of parts (a
    # template that refuses those still shows everything else in the other shapes)
    every = "part_type" in forced or "parts_n" in forced or forced.get("key_in") == "part"  # all in parts
    kinds = ["parts" if every or (parts and rng.random() < 0.5) else "str" for _ in roles]
    # every value of every keyword argument within a dozen shapes (absent, then each value), in
    # cycles of different lengths so the combinations vary
    kwargs: dict[str, Any] = {"add_generation_prompt": roles[-1] != "assistant" and index % 5 != 4}
    for name, values, period in (
        ("enable_thinking", (None, True, False), 1),
        ("reasoning_effort", (None, "low", "medium", "high"), 3),
        ("thinking", (None, True, False), 4),
    ):
        value = values[(index // period) % len(values)]
        if value is not None:
            kwargs[name] = value
    if "kwargs" in forced:  # a probe: the template's own keyword argument alone
        kwargs = {"add_generation_prompt": kwargs["add_generation_prompt"], **forced["kwargs"]}
    has_call = "assistant_call" in roles
    tools = rng.choice((0, 1, 3)) if has_call or rng.random() < 0.3 else 0
    tools = forced.get("tools", tools)
    docs = forced.get("docs", rng.choice((1, 2)) if rng.random() < 0.15 else 0)
    day = FIRST_DAY + rng.randrange(DAYS) * DAY_SECONDS
    now, other = day + rng.randrange(DAY_SECONDS), day + rng.randrange(DAY_SECONDS)
    return {"roles": roles, "kinds": kinds, "kwargs": kwargs, "tools": tools, "docs": docs, "now": now, "other": other,
            "part_type": forced.get("part_type"), "key": forced.get("key"), "size": forced.get("size"),
            "key_in": forced.get("key_in"), "tool_name": forced.get("tool_name"), "calls": forced.get("calls"),
            "parts_n": forced.get("parts_n"), "edits": forced.get("edits"),
            "key_form": forced.get("key_form")}  # fmt: skip


def _probe_shapes(probes: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """Forced shapes that probe each of ``probes`` (:meth:`TemplateInputs.probes`, or demanded
    inputs: :func:`demanded`) twice, without and with a system message (a keyword argument
    crossed with the system prompt's presence), at most ``budget`` shapes (past it, inputs share
    shapes: counts take the larger, the rest the first)."""
    n = min(2 * len(probes), budget)
    shapes: list[dict[str, Any]] = [
        {"first": 0.9 if i % 2 == 0 else 0.0, "turns": 2, "plain": True, "parts": False} for i in range(n)
    ]
    for p, probe in enumerate(probes):
        for at in ((2 * p) % n, (2 * p + 1) % n) if n else ():
            shape = shapes[at]
            for key, value in probe.items():
                if key == "kwargs":
                    shape["kwargs"] = {**shape.get("kwargs", {}), **value}
                elif key == "edits":
                    shape["edits"] = [*shape.get("edits", []), *value]
                elif key in ("turns", "tools", "docs"):
                    shape[key] = max(shape.get(key, 0), value)
                else:
                    shape.setdefault(key, value)
            if "key" in probe or "tool_name" in probe:
                shape |= {"tools": max(shape.get("tools", 0), 1), "docs": max(shape.get("docs", 0), 1)}
            elif "kwargs" in probe and at % 2:  # a switch is read with tools and a call too (Llama 3.1:
                shape["tools"] = max(shape.get("tools", 0), 1)  # tools_in_user_message, builtin_tools)
                shape["calls"] = max(shape.get("calls") or 0, 1)
    return shapes


def _fill(shape: dict[str, Any], rng: random.Random, long: bool, index: int) -> tuple[dict[str, Any], list[str]]:
    """One filling of ``shape``: the messages, the tools and documents, and the texts in them
    (the ones :func:`judge` must find, in the order they were made)."""
    texts: list[str] = []
    low, high = (rng.choice((60, 200, 1000)), 3000) if long else (4, 40)
    budget = [FILLING_CHARS]  # a long filling's contents stop growing past it (bounds render and judge)

    exact = [shape["size"], shape["size"] + 1] if long and shape.get("size") else []  # a probed content length

    def text(kind: str) -> str:
        lo, hi = (low, high) if kind == "content" and budget[0] > 0 else (2, 12)
        tag = f"Q{index}x{len(texts)}y"
        if kind == "content" and exact:
            lo = hi = max(0, exact.pop(0) - len(tag) - 1)  # the whole text that long: tag, body, last letter
        value = _text(rng, lo, hi, tag)
        budget[0] -= len(value)
        texts.append(value)
        return value

    def name() -> str:  # short in one filling, long in the other: a rule keyed on a name's length splits them
        size = rng.randint(12, 24) if long else rng.randint(2, 6)
        value = f"{_word(rng, 1).lower()}{_word(rng, size)}_{len(texts):02d}"
        texts.append(value)
        return value

    key = shape.get("key")

    def field() -> Any:  # a demanded field's value, of the kind the probe asks for (a string, true, a list)
        return _form_value(str(shape.get("key_form")), text("field"))

    def param() -> str:  # a parameter name of the filling's own (its own generator: the draw stays as it was)
        own = random.Random(f"{index}/{len(texts)}/{long}/{texts[-1] if texts else ''}")
        value = f"p{index}x{len(texts)}y{_word(own, own.randint(2, 8)).lower()}"
        texts.append(value)
        return value

    tool_names = [name() for _ in range(shape["tools"])] or ([name()] if "assistant_call" in shape["roles"] else [])
    if shape.get("tool_name") and tool_names:  # a demanded tool name: the first tool's (and its calls')
        tool_names[0] = shape["tool_name"]
    params = [param(), *([key] if key else [])]
    schema = {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": params[:1]}
    key_in = shape.get("key_in")
    tools = [
        {"type": "function", "function": {"name": n, "description": text("description"), "parameters": schema,
                                          **({key: field()} if key and key_in == "function" else {})},
         **({key: field()} if key and key_in == "tool" else {})}
        for n in tool_names[: shape["tools"]]
    ]  # fmt: skip
    messages: list[dict[str, Any]] = []
    call_id = ""
    calls = 0
    for role, kind in zip(shape["roles"], shape["kinds"], strict=True):
        if role == "assistant_call":
            call_id = f"call{len(texts):02d}"
            fn = {"name": tool_names[calls % len(tool_names)], "arguments": {p: text("argument") for p in params}}
            calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": call_id, "type": "function", "function": fn}]
                    + [{"id": f"{call_id}x{k}", "type": "function", "function": fn}
                       for k in range(1, shape.get("calls") or 1)],  # a demanded number of calls
                }
            )  # fmt: skip
            continue
        content = text("content")
        blocks = [{"type": shape["part_type"]}] if shape.get("part_type") else []
        more = max(0, (shape.get("parts_n") or 0) - len(blocks) - 1)  # a demanded number of content blocks
        parts = [*blocks, {"type": "text", "text": content}, *({"type": "text", "text": text("content")}
                                                               for _ in range(more))]  # fmt: skip
        if key and key_in == "part":  # a demanded field of a content block: on each block
            parts = [{**b, key: field()} for b in parts]
        message: dict[str, Any] = {"role": role, "content": parts if kind == "parts" else content}
        if role == "tool" and tool_names:
            message |= {"tool_call_id": call_id, "name": tool_names[(calls - 1) % len(tool_names)]}
        if key:
            message[key] = field()
        messages.append(message)
    documents = [
        {"title": text("title"), "text": text("document"), **({key: field()} if key else {})}
        for _ in range(shape["docs"])
    ]
    kwargs = {k: _kwarg_value(v, text, tools) for k, v in shape["kwargs"].items()}
    for edit in shape.get("edits") or ():
        _edit({"messages": messages, "tools": tools, "documents": documents}, edit, texts)
    return {"messages": alias_reasoning(messages), "tools": tools or None, "documents": documents or None,
            "kwargs": kwargs}, texts  # fmt: skip


def _located(value: Any, steps: list[str], path: str = "") -> Iterator[Any]:
    """Every value at the path ``steps`` (as :func:`.demands.input_values` names them) under
    ``value``: ``*`` any list item, or any key of a free-keyed dict."""
    if not steps:
        yield value
        return
    head, rest = steps[0], steps[1:]
    if isinstance(value, list) and head == "*":
        for item in value[: dm.AT_COUNT_CAP]:
            yield from _located(item, rest, path + "/*")
    elif isinstance(value, dict):
        for key, item in list(value.items())[: dm.AT_COUNT_CAP]:
            if isinstance(key, str) and dm.step(path, key).rsplit("/", 1)[-1] == head:
                yield from _located(item, rest, dm.step(path, key))


def _edit(roots: dict[str, Any], edit: dict[str, Any], texts: list[str]) -> None:
    """A demanded input made at its path in a filling (``roots``: its messages, tools and
    documents, changed in place): ``value`` replaces each string there, ``count`` grows each
    list there by copies of its last item (each dict by copies of its last value under new
    keys), ``add_key`` adds that key to each dict there. What the render may now show joins
    ``texts``."""
    steps = str(edit.get("at", "")).split("/")
    *up, last = steps
    for parent in _located(roots, up):
        holders: list[tuple[Any, Any]] = (
            [(parent, i) for i in range(len(parent))] if isinstance(parent, list) and last == "*" else []
        )
        if isinstance(parent, dict):
            holders = [(parent, k) for k in list(parent) if dm.step("/".join(up), k).rsplit("/", 1)[-1] == last]
        for holder, key in holders:
            _edit_one(holder, key, edit, texts)


def _of_kind(kind: str, value: Any, texts: list[str]) -> Any:
    """``value`` turned into a value of ``kind`` (a jinja test's name): text as the value's JSON
    (OpenAI-style arguments), a mapping holding it, a number, a list of it, true, false, none."""
    if kind == "string":
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        texts.append(text)
        return text
    made = {"mapping": {"value": value}, "number": 7, "integer": 7, "float": 7.5, "sequence": [value],
            "iterable": [value], "boolean": True, "true": True, "false": False, "none": None}  # fmt: skip
    return made.get(kind, value)


def _form_value(form: str, text: str) -> Any:
    """A demanded field's value of the kind ``form`` (:data:`.demands.KEY_FORMS`); ``text`` by default."""
    return {"true": True, "false": False, "null": None, "number": 0, "list": [text], "mapping": {}}.get(form, text)


def _edit_one(holder: Any, key: Any, edit: dict[str, Any], texts: list[str]) -> None:
    value = holder[key]
    if "kind" in edit:  # the value there as the kind a test asked about (a mapping as its JSON text...)
        holder[key] = _of_kind(str(edit["kind"]), value, texts)
    elif "value" in edit and isinstance(edit["value"], int) and type(value) in (int, float):
        holder[key] = edit["value"]  # a number at a path, past the bound it was tested against
    elif "value" in edit and isinstance(value, str):
        new = str(edit["value"])
        texts.append(new)  # the old text may still show elsewhere (a parameter name is a key too)
        holder[key] = new
    elif "count" in edit and isinstance(value, list) and value:
        n = int(edit["count"])
        holder[key] = [*value, *(json.loads(json.dumps(value[-1])) for _ in range(n - len(value)))][:n]
    elif "count" in edit and isinstance(value, dict) and value:
        n, last = int(edit["count"]), list(value.values())[-1]
        while len(value) < n:
            name = f"k{len(value)}x{len(texts)}"
            value[name] = json.loads(json.dumps(last))
            texts.append(name)
    elif "add_key" in edit and isinstance(value, dict) and edit["add_key"] not in value:
        name, text = str(edit["add_key"]), f"v{len(texts)}y{edit['add_key']}"
        value[name] = _form_value(str(edit.get("form")), text)
        texts += [name, text]


def _kwarg_value(value: Any, text: Any, tools: list[dict[str, Any]]) -> Any:
    """A keyword argument's value in one filling (:data:`TEXT` and the like made here)."""
    if value == TEXT:
        return text("kwarg")
    if value == TEXTS:
        return [text("kwarg"), text("kwarg")]
    if value == TOOLS:
        return tools or None
    if value == TOOL_NAMES:  # a list a tool call's name is looked for in (Llama 3.1's builtin_tools)
        return [t["function"]["name"] for t in tools] or [text("kwarg")]
    return value


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # as transformers 5 names a message's reasoning


def alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers 5 hands them to a template: reasoning given under any of
    :data:`REASONING_FIELDS` is also under ``thinking`` and ``reasoning_content``."""
    out = []
    for message in messages:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        out.append(message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning})
    return out


FILLING_CHARS = 12000


# -- what a template reads: derived from its AST (parsed, never evaluated) ---------------------
# The generator probes what the template itself refers to, so behaviour gated on an input the
# draw would never produce (a family's keyword argument, a role, a content-block type, a message
# field, a tool parameter, a conversation length) is rendered: variables read before the template
# sets them, constants compared with a role or a type, keys looked up on any value, integer
# literals (conversation lengths just past each). Bounded: at most LIMITS of each.
LOADER_NAMES = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now", "range", "dict",
     "namespace", "lipsum", "cycler", "joiner", "loop", "caller", "varargs", "kwargs", "self", "true", "false",
     "none", "True", "False", "None", "additional_special_tokens"}
)  # fmt: skip
LOADER_ROLES = ("system", "developer", "user", "assistant", "tool")  # what the draw gives anyway
LOADER_PART_TYPES = ("image", "video", "audio")  # content blocks transformers' processors load (beside text)
SCHEMA_TYPES = frozenset({"text", "function", "object", "string", "array", "number", "integer", "boolean", "null"})
STRUCTURAL_KEYS = frozenset(
    {"role", "content", "tool_calls", "tool_call_id", "name", "type", "function", "arguments", "id", "text", "title",
     "parameters", "properties", "required", "description", "items", "get", "index", "index0", "first", "last",
     "length", "revindex", "revindex0", "cycle", "depth", "previtem", "nextitem", "changed"}
)  # fmt: skip
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
LIMITS = {"kwargs": 16, "values": 4, "roles": 6, "part_types": 6, "keys": 12, "turns": 4, "sizes": 4}
MAX_TURNS = 100  # user turns one generated conversation may have
MAX_MESSAGES = 200  # messages a demanded conversation length may have (a render of them takes milliseconds)
MIN_SIZE, MAX_SIZE = 41, 16384  # content lengths probed (the draw covers shorter ones)
TEXT, TEXTS, TOOLS, TOOL_NAMES = "\x00text", "\x00texts", "\x00tools", "\x00tool names"  # made per filling
_STR_FILTERS = frozenset({"trim", "upper", "lower", "replace", "title", "capitalize", "truncate", "indent", "center",
                          "striptags", "wordcount", "string", "e", "escape", "format"})  # fmt: skip
_LIST_FILTERS = frozenset({"join", "length", "count", "first", "last", "reject", "select", "map", "list", "sort",
                           "unique", "batch", "selectattr", "rejectattr", "items", "dictsort", "sum", "min",
                           "max"})  # fmt: skip
_TEST_KINDS = {"true": "bool", "false": "bool", "boolean": "bool", "string": "str", "number": "int",
               "integer": "int", "float": "int", "iterable": "list", "sequence": "list", "mapping": "list"}  # fmt: skip


@dataclass(frozen=True)
class TemplateInputs:
    """What one template reads beyond what the draw gives: ``kwargs`` (name, values; a value
    may be :data:`TEXT`, :data:`TEXTS` or :data:`TOOLS`, made per filling), ``roles``,
    ``part_types``, ``keys`` (fields of messages and documents, tool parameter names),
    ``turns`` (conversation lengths) and ``sizes`` (content lengths)."""

    kwargs: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    roles: tuple[str, ...] = ()
    part_types: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    turns: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()

    def probes(self) -> list[dict[str, Any]]:
        """One forced shape description per input to probe (see :func:`_probe_shape`)."""
        out: list[dict[str, Any]] = [{"kwargs": {n: v}} for n, values in self.kwargs for v in values]
        out += [{"role": r} for r in self.roles] + [{"part_type": t} for t in self.part_types]
        out += [{"key": k} for k in self.keys] + [{"turns": n} for n in self.turns]
        return out + [{"size": n} for n in self.sizes]


def _walk(tree: nodes.Node) -> Iterator[tuple[nodes.Node, nodes.Node | None]]:
    """Every node with its parent, in source order (iterative: no recursion on a deep tree)."""
    stack: list[tuple[nodes.Node, nodes.Node | None]] = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        yield node, parent
        stack += [(child, node) for child in reversed(list(node.iter_child_nodes()))]


def _key_of(node: nodes.Node) -> str | None:
    """``x.role`` / ``x['role']`` -> ``'role'``."""
    if isinstance(node, nodes.Getattr):
        return str(node.attr)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return node.arg.value
    return None


def _consts(node: nodes.Node) -> list[Any]:
    if isinstance(node, nodes.Const):
        return [node.value]
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return [i.value for i in node.items if isinstance(i, nodes.Const)]
    return []


def _compared(tree: nodes.Node) -> dict[str, set[Any]]:
    """The constants each key (``role``, ``type``...) is compared with: ``x.role == 'ipython'``,
    ``x.type in ['image', 'video']``, ``x.role is equalto 'a'``, ``selectattr('role', 'equalto', 'a')``."""
    out: dict[str, set[Any]] = {}
    for node, _parent in _walk(tree):
        if isinstance(node, nodes.Compare):
            sides = [node.expr, *(o.expr for o in node.ops)]
            for a, b in itertools.pairwise(sides):
                for x, y in ((a, b), (b, a)):
                    key = _key_of(x)
                    if key:
                        out.setdefault(key, set()).update(_consts(y))
        elif isinstance(node, nodes.Test) and node.name in ("equalto", "eq", "sameas") and node.args:
            key = _key_of(node.node)
            if key:
                out.setdefault(key, set()).update(_consts(node.args[0]))
        elif isinstance(node, nodes.Filter) and node.name in ("selectattr", "rejectattr") and len(node.args) >= 3:
            named, value = _consts(node.args[0]), _consts(node.args[2])
            if named and isinstance(named[0], str):
                out.setdefault(named[0], set()).update(value)
    return out


def _keys(tree: nodes.Node) -> list[str]:
    """Names looked up on values (``m.source``, ``m['source']``, ``'path' in x``, ``x.get('k')``),
    methods and namespace attributes left out."""
    spaces = {n.target.name for n, _ in _walk(tree) if isinstance(n, nodes.Assign) and isinstance(n.target, nodes.Name)
              and isinstance(n.node, nodes.Call) and isinstance(n.node.node, nodes.Name)
              and n.node.node.name == "namespace"}  # fmt: skip
    spaces.add("loop")
    out: list[str] = []
    for node, parent in _walk(tree):
        if isinstance(node, nodes.Getattr):
            called = isinstance(parent, nodes.Call) and parent.node is node
            if isinstance(parent, nodes.Call) and called and node.attr == "get" and parent.args:
                out += [c for c in _consts(parent.args[0]) if isinstance(c, str)]
            elif not called and not (isinstance(node.node, nodes.Name) and node.node.name in spaces):
                out.append(str(node.attr))
        elif isinstance(node, nodes.Getitem):
            out += [c for c in _consts(node.arg) if isinstance(c, str)]
        elif isinstance(node, nodes.Compare) and node.ops and node.ops[0].op in ("in", "notin"):
            out += [c for c in _consts(node.expr) if isinstance(c, str)]
    return [k for k in dict.fromkeys(out) if _IDENT_RE.fullmatch(k) and k not in STRUCTURAL_KEYS]


def _kwargs(tree: nodes.Node) -> list[tuple[str, tuple[Any, ...]]]:
    """The variables the template reads before it sets them (or tests whether they are defined),
    each with the values its uses call for: absent is always probed by the draw; booleans when
    it is a condition, a text when it is printed or joined to text, a list of texts when it is
    iterated or measured, the tools when it is copied into ``tools``, the constants it is compared with."""
    stored: set[str] = {str(m.name) for m, _ in _walk(tree) if isinstance(m, nodes.Macro)}  # macros are no input
    wanted: dict[str, set[Any]] = {}
    aliases: dict[str, str] = {}
    for node, parent in _walk(tree):
        if isinstance(node, nodes.Assign) and isinstance(node.target, nodes.Name) and isinstance(node.node, nodes.Name):
            aliases[node.node.name] = node.target.name
        if not isinstance(node, nodes.Name) or node.name in LOADER_NAMES or node.name.endswith("_token"):
            continue
        if node.ctx in ("store", "param"):
            stored.add(node.name)
            continue
        tested = isinstance(parent, nodes.Test) and parent.name in ("defined", "undefined")
        if node.name in stored and not tested and node.name not in wanted:
            continue
        wanted.setdefault(node.name, set()).update(_uses(node, parent))
    for name, target in aliases.items():
        if name in wanted:
            wanted[name] |= {TOOLS} if target == "tools" else wanted.get(target, set())
    out = []
    for name, uses in list(wanted.items())[: LIMITS["kwargs"]]:
        values = sorted(uses - {"bool"}, key=repr) + ([True, False] if "bool" in uses else [])
        out.append((name, tuple(values[: LIMITS["values"]] or [True])))
    return out


def _uses(node: nodes.Name, parent: nodes.Node | None) -> set[Any]:
    """The values one use of a variable calls for (see :func:`_kwargs`)."""
    if isinstance(parent, (nodes.Add, nodes.Concat, nodes.Output)):
        return {TEXT}
    if isinstance(parent, nodes.Filter) and parent.node is node:  # another filter (default...): a flag and a text,
        known = {TEXTS} if parent.name in _LIST_FILTERS else {TEXT} if parent.name in _STR_FILTERS else None
        return known or {TEXT, "bool"}  # so the sandbox sees what the template tests the text against after it
    if isinstance(parent, nodes.Getattr) and parent.node is node:  # a method of it (x.lower()): a text
        return {TEXT}
    if isinstance(parent, nodes.For) and parent.iter is node:
        return {TEXTS}
    if isinstance(parent, nodes.Operand) and parent.op in ("in", "notin"):  # x in it: the tools' names too
        return {TEXTS, TOOL_NAMES}
    if isinstance(parent, nodes.Compare):
        found = {c for c in (*_consts(parent.expr), *(c for o in parent.ops for c in _consts(o.expr)))}
        return {c for c in found if isinstance(c, (str, int)) and not isinstance(c, bool)} | {"bool"}
    if isinstance(parent, nodes.Test):
        kind = _TEST_KINDS.get(parent.name)
        return {{"bool": "bool", "str": TEXT, "int": 1, "list": TEXTS}[kind]} if kind else set()
    if isinstance(parent, (nodes.Not, nodes.If, nodes.CondExpr, nodes.And, nodes.Or)):
        return {"bool"}
    return set()


def _ints(tree: nodes.Node) -> set[int]:
    return {n.value for n, _ in _walk(tree) if isinstance(n, nodes.Const) and type(n.value) is int}


def _turns(tree: nodes.Node) -> tuple[int, ...]:
    """Conversation lengths just past each integer literal of the template (a count it may test)."""
    return tuple(sorted({n + 1 for n in _ints(tree) if 3 <= n < MAX_TURNS}, reverse=True)[: LIMITS["turns"]])


def _sizes(tree: nodes.Node) -> tuple[int, ...]:
    """Content lengths to probe: each integer literal of the template that could be a length
    (a content of exactly that many characters and one more is drawn)."""
    return tuple(sorted({n for n in _ints(tree) if MIN_SIZE <= n <= MAX_SIZE}, reverse=True)[: LIMITS["sizes"]])


@functools.lru_cache(maxsize=256)
def template_inputs(text: str) -> TemplateInputs:
    """What ``text`` reads (see :class:`TemplateInputs`); empty for a template that does not
    parse or is too complex to walk (the static check reports those)."""
    if ct.complexity_problem(text):
        return TemplateInputs()
    try:
        tree = ct.parse(text)
    except Exception:  # a syntax error: reported by the static check, nothing to derive
        return TemplateInputs()
    compared = _compared(tree)
    roles = sorted(r for r in compared.get("role", ()) if isinstance(r, str) and _IDENT_RE.fullmatch(r))
    types = sorted(t for t in compared.get("type", ()) if isinstance(t, str) and _IDENT_RE.fullmatch(t))
    return TemplateInputs(
        kwargs=tuple(_kwargs(tree)),
        roles=tuple(r for r in roles if r not in LOADER_ROLES)[: LIMITS["roles"]],
        part_types=tuple(dict.fromkeys(t for t in (*LOADER_PART_TYPES, *types) if t not in SCHEMA_TYPES))[
            : LIMITS["part_types"]
        ],
        keys=tuple(_keys(tree))[: LIMITS["keys"]],
        turns=_turns(tree),
        sizes=_sizes(tree),
    )


def generate(seed: str, count: int, context: dict[str, Any], template: str | None = None) -> list[dict[str, Any]]:
    """``count`` shapes, three renders each (``g{i}a``, ``g{i}b``: two fillings; ``g{i}t``: the
    shorter filling at another time), as battery render requests (see :mod:`.template_battery`), each with
    ``texts``: what the render must show, and ``shape``: a description of the input. Given the
    ``template``, up to ``count`` more shapes first probe what it reads (:func:`template_inputs`).
    The draw depends on ``seed`` (and the template) alone; ``context`` (the loader's variables) is
    laid under each render's keyword arguments."""
    inputs = template_inputs(template) if template else TemplateInputs()
    return [{**r, "context": {**context, **r["context"]}} for r in _drawn(seed, count, inputs)]


@functools.lru_cache(maxsize=16)  # a draw holds up to a few MB of texts: the templates a scan sees at once
def _drawn(seed: str, count: int, inputs: TemplateInputs) -> tuple[dict[str, Any], ...]:
    return tuple(_draw(seed, count, inputs))


def _draw(seed: str, count: int, inputs: TemplateInputs = TemplateInputs()) -> list[dict[str, Any]]:
    rng = random.Random(hashlib.sha256(seed.encode()).hexdigest())
    probes = _probe_shapes(inputs.probes(), count) if count else []
    forced = [*EXTREMES[: min(count, len(EXTREMES))], *probes]
    return _rendered(rng, [forced[i] if i < len(forced) else None for i in range(count + len(probes))], "g")


def _rendered(rng: random.Random, forced: list[dict[str, Any] | None], prefix: str) -> list[dict[str, Any]]:
    """Three render requests per shape (``{prefix}{i}a``, ``b``: two fillings, ``t``: another
    time), each naming its keyword arguments (``inputs``: the sandbox labels them, and every
    other input, for the demands it records)."""
    out: list[dict[str, Any]] = []
    for i, force in enumerate(forced):
        shape = _shape(rng, i, force)
        first, texts_a = _fill(shape, rng, False, i)
        second, texts_b = _fill(shape, rng, True, i)
        short, texts_short = first, texts_a  # the other time of day: the short filling is enough
        if rng.random() < 0.5:  # which filling is long varies too
            first, second, texts_a, texts_b = second, first, texts_b, texts_a
        label = describe(shape)
        for name, filling, texts, now in (
            ("a", first, texts_a, shape["now"]),
            ("b", second, texts_b, shape["now"]),
            ("t", short, texts_short, shape["other"]),
        ):
            ctx = {**filling["kwargs"], "tools": filling["tools"], "documents": filling["documents"]}
            out.append({"name": f"{prefix}{i}{name}", "messages": filling["messages"], "context": ctx, "now": now,
                        "texts": texts, "shape": label, "inputs": sorted(filling["kwargs"]),
                        **({"forced": force} if force else {})})  # fmt: skip
    return out


def demanded(
    seed: str,
    count: int,
    context: dict[str, Any],
    demands: Any,
    first: Sequence[dict[str, Any]],
    earlier: Sequence[dict[str, Any]] = (),
    prefix: str = "d",
) -> tuple[list[dict[str, Any]], int]:
    """Round two of the draw: render requests (``d{i}a``, ``b``, ``t``, as :func:`generate`'s)
    for the inputs the sandbox saw the template test in round one (``demands``: its answer's
    ``demands`` for the renders ``first``) and no round-one input passed (:func:`.demands.probes`):
    each demanded input in a shape of its own, twice (without and with a system message) while
    ``count`` shapes allow, else once; and how many demanded inputs did not fit in ``count``
    shapes (with a sandbox ``overflow`` demand: one more), which the caller reports as not
    analysed. Deterministic in ``seed`` and the demands. A later round: ``first`` the renders of
    the round before (``earlier`` those before it, whose inputs count as drawn), named ``prefix``;
    a demand keeps the edits of the render it was seen in (a field round two added, then tested)."""
    seen = dm.observed([*earlier, *first])

    def carried(demand: list[Any]) -> dict[str, Any]:
        at = demand[4] if len(demand) > 4 and type(demand[4]) is int else -1
        return dict(first[at].get("forced") or {}) if 0 <= at < len(first) else {}

    found = dm.probes(demands, seen, carried) if count > 0 else []
    left = max(0, len(found) - count) + dm.overflowed(demands) + dm.past_bounds(demands, seen)
    found = found[:count]
    if not found:
        return [], left
    copies = 2 if 2 * len(found) <= count else 1
    shapes: list[dict[str, Any] | None] = [s for f in found for s in _probe_shapes([f], 2)[:copies]]
    rng = random.Random(hashlib.sha256(json.dumps([seed, found], sort_keys=True).encode()).hexdigest())
    return [{**r, "context": {**context, **r["context"]}} for r in _rendered(rng, shapes, prefix)], left


VALUE_NAMES = {TEXT: "<text>", TEXTS: "<list of texts>", TOOLS: "<the tools>", TOOL_NAMES: "<the tools' names>"}


def describe(shape: dict[str, Any]) -> str:
    """The input of a shape in words: roles (``[parts]``: content as a list of parts), keyword
    arguments, tools, documents, and what a probe added (a part type, a field)."""
    part = f"[{shape['part_type']}+text parts]" if shape.get("part_type") else "[parts]"
    roles = [("assistant(tool call)" if r == "assistant_call" else r) + (part if k == "parts" else "")
             for r, k in zip(shape["roles"], shape["kinds"], strict=True)]  # fmt: skip
    kw = ", ".join(f"{k}={VALUE_NAMES.get(v, v)!s}" if isinstance(v, str) and v in VALUE_NAMES else f"{k}={v!r}"
                   for k, v in sorted(shape["kwargs"].items()))  # fmt: skip
    extra = f", {shape['tools']} tools" if shape["tools"] else ""
    extra += f", {shape['docs']} documents" if shape["docs"] else ""
    extra += f", field and tool parameter {shape['key']!r}" if shape.get("key") else ""
    extra += f" (on {shape['key_in']}s)" if shape.get("key") and shape.get("key_in") else ""
    extra += f" holding {shape['key_form']}" if shape.get("key") and shape.get("key_form") else ""
    extra += f", tool name {shape['tool_name']!r}" if shape.get("tool_name") else ""
    extra += f", {shape['calls']} calls in a tool call" if shape.get("calls") else ""
    extra += f", {shape['parts_n']} content blocks a message" if shape.get("parts_n") else ""
    extra += f", contents of {shape['size']} and {shape['size'] + 1} characters" if shape.get("size") else ""
    for edit in shape.get("edits") or ():
        made = {k: (v if not isinstance(v, str) or len(v) <= 40 else f"{len(v)} characters") for k, v in edit.items()}
        extra += f", {made!r}"
    return f"roles {' '.join(roles)} ({kw}{extra})"


@functools.lru_cache(maxsize=16384)  # the draw is the same for every template of a process
def _forms(text: str) -> tuple[str, ...]:
    """``text`` as a template may print it, quoted forms first (the quotes go with the text: a
    repr picks its quote by content): JSON (``tojson``), Python's repr (a list of parts printed
    whole), quoted, as is, JSON- or repr-escaped without quotes."""
    j, ja, r = json.dumps(text, ensure_ascii=False), json.dumps(text), repr(text)
    forms = [j, ja, r, f"'{text}'", f'"{text}"', text, j[1:-1], ja[1:-1], r[1:-1]]
    return tuple(dict.fromkeys(forms))


JUDGE_CHARS = 1 << 18  # of a render the judge reads (generated renders hold far less: see FILLING_CHARS)
MARKUP_CHARS = 1 << 15  # of a render's abstraction (its markup) the judges after it read
_KEY_RE = re.compile(r"[A-Za-z0-9_]*")


def abstract(output: str, texts: list[str]) -> str:
    """``output`` with each text (in every one of its :func:`_forms`) replaced by ``\x00i\x00``:
    of the first :data:`JUDGE_CHARS` characters, at most :data:`MARKUP_CHARS` returned (bounded
    cost; :func:`judge` reports a render past either bound)."""
    return _abstract(output[:JUDGE_CHARS], tuple(texts))[:MARKUP_CHARS]


@functools.lru_cache(maxsize=256)  # the judge, the text checks and the report abstract the same renders
def _abstract(output: str, texts: tuple[str, ...]) -> str:
    out = output
    for i, text in sorted(enumerate(texts), key=lambda it: -len(it[1])):
        key = _KEY_RE.match(text).group(0)  # type: ignore[union-attr]
        if key and key not in out:  # every form holds the text's leading word unescaped: one scan skips them all
            continue
        for form in _forms(text):
            if form in out:
                out = out.replace(form, f"\x00{i}\x00")
    return out


def _oversized(output: str, texts: list[str]) -> str | None:
    """Why ``output`` is past what the judge reads (its length, or its markup's), or None."""
    if len(output) > JUDGE_CHARS:
        return f"{len(output)} characters, over the {JUDGE_CHARS} the judge reads"
    markup = len(_abstract(output, tuple(texts)))
    if markup > MARKUP_CHARS:
        return f"{markup} characters of its own text, over the {MARKUP_CHARS} the judge reads"
    return None


def _flat(text: str, limit: int = 80) -> str:
    flat = " ".join(text.replace("\x00", "§").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# -- bounded comparison of two renders (the judge runs in the scanner process) ----------------
# Every function here costs at most linear time in its inputs (times a log factor), plus a fixed
# budget of LCS cells: a hostile render (400k identical words, a word built to backtrack a
# pattern) cannot hold the scanner past its deadline. What the budget cannot align is reported
# as changed, never as equal.
WORD_RE = re.compile(r"\w+|\W")  # one pass, no nested quantifier
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DATE_NAMES = frozenset((*MONTHS, "mon", "tue", "wed", "thu", "fri", "sat", "sun", "am", "pm"))
DATE_MARKS = frozenset(" \t\n\r\f\v0123456789,.:/-")
DIFF_CELLS = 250_000  # LCS table cells one word diff may fill (about 0.1 s of Python)


def is_date_word(token: str) -> bool:
    """Whether ``token`` (one :data:`WORD_RE` match, or a run of letters) is date material: digits,
    whitespace and ``,.:/-``, or ASCII letters starting with a month, day or am/pm name
    (``Monday``, ``Jan``, ``PM``). Plain string tests: linear in the token, no backtracking."""
    if all(ch in DATE_MARKS for ch in token):
        return True
    low = token.lower()
    return token.isascii() and token.isalpha() and (low[:3] in DATE_NAMES or low[:2] in DATE_NAMES)


def is_date_text(text: str) -> bool:
    """Whether every word of ``text`` is date material (the empty text is)."""
    return all(is_date_word(t) for t in WORD_RE.findall(text))


def without_dates(tokens: list[str]) -> list[str]:
    """``tokens`` without their date material: two renders that differ in the date only are equal after it."""
    return [t for t in tokens if not is_date_word(t)]


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of the common prefix of two strings or lists (a binary search on slices, each
    compared in C: O(n log n) however alike the two are)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def common_suffix(a: Sequence[Any], b: Sequence[Any], limit: int) -> int:
    """The length of the common suffix of ``a`` and ``b``, at most ``limit``."""
    low, high = 0, min(len(a), len(b), limit)
    while low < high:
        mid = (low + high + 1) // 2
        if a[len(a) - mid : len(a) - low] == b[len(b) - mid : len(b) - low]:
            low = mid
        else:
            high = mid - 1
    return low


Opcode = tuple[str, int, int, int, int]


def word_opcodes(a: list[str], b: list[str], cells: int = DIFF_CELLS) -> list[Opcode]:
    """Opcodes (as :meth:`difflib.SequenceMatcher.get_opcodes`) turning ``a`` into ``b``, bounded:
    common ends trimmed, then words that occur once on each side anchor the alignment (their
    longest increasing run, O(n log n)), and the gaps between anchors are aligned exactly by
    an LCS table while ``cells`` last; a gap past the budget is one ``replace``."""
    head = common_prefix(a, b)
    tail = common_suffix(a, b, min(len(a), len(b)) - head)
    x, y = a[head : len(a) - tail], b[head : len(b) - tail]
    exact = len(x) * len(y) <= cells  # small enough: one exact table, no anchors needed
    pairs = [] if exact else [(i + head, j + head) for i, j in _anchors(x, y)]
    matched: list[tuple[int, int, int]] = [(0, 0, head)] if head else []
    budget = [cells]
    prev = (head, head)
    for i, j in [*pairs, (len(a) - tail, len(b) - tail)]:
        matched += _gap(a, b, prev[0], i, prev[1], j, budget)
        if (i, j) != (len(a) - tail, len(b) - tail):
            matched.append((i, j, 1))
        prev = (i + 1, j + 1)
    if tail:
        matched.append((len(a) - tail, len(b) - tail, tail))
    return _opcodes(matched, len(a), len(b))


def _anchors(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Index pairs of the words unique to both ``a`` and ``b``, the longest run increasing on both sides."""
    once_a = {w: i for i, w in enumerate(a)}
    count_a = Counter(a)
    count_b = Counter(b)
    candidates = [(once_a[w], j) for j, w in enumerate(b) if count_b[w] == 1 and count_a.get(w) == 1]
    candidates.sort()
    tops: list[int] = []  # patience sorting on the b index: tops[k] = the smallest end of a run of length k + 1
    top_at: list[int] = []
    back: list[int] = [-1] * len(candidates)
    for n, (_i, j) in enumerate(candidates):
        k = bisect.bisect_left(tops, j)
        if k == len(tops):
            tops.append(j)
            top_at.append(n)
        else:
            tops[k], top_at[k] = j, n
        back[n] = top_at[k - 1] if k else -1
    out = []
    n = top_at[-1] if top_at else -1
    while n >= 0:
        out.append(candidates[n])
        n = back[n]
    return out[::-1]


def _gap(
    a: list[str], b: list[str], i1: int, i2: int, j1: int, j2: int, budget: list[int]
) -> list[tuple[int, int, int]]:
    """Matching blocks ``(i, j, size)`` of ``a[i1:i2]`` and ``b[j1:j2]``: ends trimmed, the rest by
    an LCS table when it fits the remaining ``budget`` (else nothing matches there)."""
    x, y = a[i1:i2], b[j1:j2]
    head = common_prefix(x, y)
    tail = common_suffix(x, y, min(len(x), len(y)) - head)
    out = [(i1, j1, head)] if head else []
    mx, my = x[head : len(x) - tail], y[head : len(y) - tail]
    if mx and my and len(mx) * len(my) <= budget[0]:
        budget[0] -= len(mx) * len(my)
        out += [(i1 + head + i, j1 + head + j, 1) for i, j in _lcs(mx, my)]
    if tail:
        out.append((i2 - tail, j2 - tail, tail))
    return out


def _lcs(x: list[str], y: list[str]) -> list[tuple[int, int]]:
    """The index pairs of a longest common subsequence of ``x`` and ``y`` (an ``len(x) * len(y)`` table)."""
    rows = [[0] * (len(y) + 1)]
    for word in x:
        prev, row = rows[-1], [0]
        for j, other in enumerate(y):
            row.append(prev[j] + 1 if word == other else max(prev[j + 1], row[j]))
        rows.append(row)
    out = []
    i, j = len(x), len(y)
    while i and j:
        if x[i - 1] == y[j - 1]:
            out.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif rows[i - 1][j] >= rows[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def _opcodes(matched: list[tuple[int, int, int]], n: int, m: int) -> list[Opcode]:
    """difflib-style opcodes from increasing matching blocks (adjacent ones merged)."""
    out: list[Opcode] = []
    i = j = 0
    for mi, mj, size in [*matched, (n, m, 0)]:
        tag = "replace" if i < mi and j < mj else "delete" if i < mi else "insert" if j < mj else ""
        if tag:
            out.append((tag, i, mi, j, mj))
        if size:
            if out and out[-1][0] == "equal" and out[-1][2] == mi and out[-1][4] == mj:
                out[-1] = ("equal", out[-1][1], mi + size, out[-1][3], mj + size)
            else:
                out.append(("equal", mi, mi + size, mj, mj + size))
        i, j = mi + size, mj + size
    return out


def _first_difference(a: str, b: str) -> str:
    start = common_prefix(a, b)
    end = common_suffix(a, b, min(len(a), len(b)) - start)
    x, y = a[start : len(a) - end], b[start : len(b) - end]
    before = a[max(0, start - 20) : start]
    return f"{_flat(before + x[:60])!r} -> {_flat(before + y[:60])!r}"


def word_middles(a: str, b: str) -> tuple[int, list[str], list[str]]:
    """Where ``a`` and ``b`` start to differ (a word boundary) and the words of both from there
    to where they end alike: only the part that differs is split into words."""
    start, end = _middle(a, b)
    return start, WORD_RE.findall(a[start : len(a) - end]), WORD_RE.findall(b[start : len(b) - end])


def _middle(a: str, b: str) -> tuple[int, int]:
    """The lengths of the common prefix and suffix of ``a`` and ``b``, cut back to word boundaries."""
    start = common_prefix(a, b)
    while start and (a[start - 1].isalnum() or a[start - 1] == "_"):
        start -= 1
    end = common_suffix(a, b, min(len(a), len(b)) - start)
    while end and (a[len(a) - end].isalnum() or a[len(a) - end] == "_"):
        end -= 1
    return start, end


def date_difference(a: str, b: str) -> str | None:
    """The first difference of two renders at two times that is not date material
    (:func:`is_date_word`), or None: their words with the date material left out must be the
    same. Linear in the renders, whatever they hold."""
    if a == b:
        return None
    start, end = _middle(a, b)
    if len(a) + len(b) - 2 * (start + end) > 2 * MARKUP_CHARS:  # a date is a few words: this is no date
        return f"{len(a) - start - end} characters differ from {_flat(a[start : start + 40])!r} on"
    _start, wa, wb = word_middles(a, b)
    wa, wb = without_dates(wa), without_dates(wb)
    if wa == wb:
        return None
    at = common_prefix(wa, wb)
    return f"{_flat(' '.join(wa[at : at + 12]))!r} -> {_flat(' '.join(wb[at : at + 12]))!r}"


def _call_issues(request: dict[str, Any], output: str) -> list[GeneratedIssue]:
    """A tool call rendered with its arguments is rendered with its own name: a template that
    writes the drawn arguments under another name (a fixed ``shell``) makes the model see calls
    it never made."""
    for message in request.get("messages") or ():
        for call in message.get("tool_calls") or () if isinstance(message, dict) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            name, args = (fn.get("name"), fn.get("arguments")) if isinstance(fn, dict) else (None, None)
            shown = [v for v in (args.values() if isinstance(args, dict) else ()) if isinstance(v, str) and v in output]
            if isinstance(name, str) and name and shown and name not in output:
                why = f"a tool call's arguments are rendered without its name {name!r} (shape {request['shape']})"
                return [GeneratedIssue("role", why)]
    return []


def judge(renders: list[dict[str, Any]], answer: dict[str, Any]) -> list[GeneratedIssue]:
    """Issues of the generated renders (``renders`` as :func:`generate` made them, ``answer`` the
    sandbox's battery answer for them). A shape the template refuses (raises) is skipped."""
    results = {r["name"]: (r, a) for r, a in zip(renders, answer.get("renders") or [], strict=False)}
    out: list[GeneratedIssue] = []
    for name, (request, result) in results.items():
        if not name.endswith("a") or result.get("status") != "ok":
            continue
        base = name[:-1]
        big = _oversized(str(result["output"]), request["texts"])
        if big:  # the template prints far more than any conversation holds: a finding, and not compared further
            out.append(GeneratedIssue("text", f"the render of shape {request['shape']} is {big}"))
            continue
        out += _call_issues(request, str(result["output"]))
        other = results.get(base + "b")
        if other is not None and other[1].get("status") == "ok":
            a = abstract(str(result["output"]), request["texts"])
            b = abstract(str(other[1]["output"]), other[0]["texts"])
            if a != b:
                why = f"the markup changes with message content (shape {request['shape']}): "
                out.append(GeneratedIssue("taint", why + _first_difference(a, b)))
        clock = results.get(base + "t")
        same = (request, result) if clock is None or clock[0]["texts"] == request["texts"] else other
        if clock is not None and same is not None and clock[1].get("status") == "ok" and same[1].get("status") == "ok":
            moved = date_difference(str(same[1]["output"]), str(clock[1]["output"]))
            if moved:
                out.append(GeneratedIssue("varies", f"the render changes with the time of day beyond the date "
                                                    f"(shape {request['shape']}): {moved}"))  # fmt: skip
    seen: set[str] = set()
    return [i for i in out if not (i.detail in seen or seen.add(i.detail))]  # type: ignore[func-returns-value]


def rendered_examples(renders: list[dict[str, Any]], answer: dict[str, Any], limit: int = 3) -> list[dict[str, str]]:
    """A few generated renders (shape and output, abstracted), for the approval report."""
    out = []
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        if request["name"].endswith("a") and result.get("status") == "ok":
            out.append({"shape": request["shape"], "render": abstract(str(result["output"]), request["texts"])[:2000]})
        if len(out) >= limit:
            break
    return out


LETTERS_RE = re.compile(r"[^\W\d_]+")


def vocabulary(outputs: list[str]) -> frozenset[str]:
    """The words (casefolded) of the fixed battery's renders: the markup and fixed text a
    template shows for the shapes a person can read in the review report."""
    return frozenset(w.casefold() for out in outputs for w in LETTERS_RE.findall(out))


def novel_text(added: str, vocab: frozenset[str], limit: int) -> str | None:
    """The words of ``added`` (a generated render without its texts, markup and role words: see
    :func:`~.template_battery.residual_text`) that no battery render shows, when they hold at
    least ``limit`` letters in distinct words (dates aside): text that appears only for a generated shape (a
    role, a content kind, a keyword argument, a length, a time of day), else None."""
    words = list(
        dict.fromkeys(w for w in LETTERS_RE.findall(added) if w.casefold() not in vocab and not is_date_word(w))
    )
    if sum(len(w) for w in words) >= limit:  # distinct words: a list of parts printed whole repeats "type", "text"
        return " ".join(words)[:160]
    return None
