"""Generated conversations for chat templates (issue 33): seeded, bounded, property-based.

The fixed battery of :mod:`.template_battery` renders a few shapes a template author can read
and avoid. :func:`generate` draws conversation *shapes* from a seeded generator: roles
(``system``, ``developer``, ``user``, ``assistant``, ``tool``), 1 to dozens of turns, string or
list-of-parts content, assistant tool calls with arbitrary names and tool responses, the
keyword arguments families read (``enable_thinking``, ``reasoning_effort``, ``thinking``,
``add_generation_prompt``, ``tools``, ``documents``, ``builtin_tools``) and a clock anywhere in
the day. Each shape is rendered three times: with two fillings of different content (lengths
from a few to thousands of characters, Unicode, quotes, newlines, template-like text) and with
the first filling at another time of day.

:func:`judge` is pure and states the invariant: a render is the template's fixed markup for
the shape with the contents inserted in order. Each render is *abstracted* (every content,
tool name, argument and document text replaced by a placeholder, also where the template
escaped it with ``tojson`` or Python's repr); the two fillings must abstract to the same text
(else the template reacts to content beyond inserting it: a ``replace`` filter, an
``and``/``or`` on content, a length-keyed ``range``, a dict lookup), and the other clock may
change date words only. Each issue names the input that triggered it.

What a render adds before the first message when the conversation has no system message (a
default system prompt) is returned by :func:`default_system_prompt` for the approval report:
vendors ship one, so it is surfaced for a person to review, and judged by the text rules.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any

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
    kwargs: the clock, tool names, document text), text; ``detail`` names the input."""

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
    {"turns": 3, "first": 0.9, "parts": False, "plain": True, "tools": 3},
)
# the first shapes of every draw: the longest conversation (with a system prompt), a single
# user message, a developer message, list-of-parts content, tools passed to plain alternating
# turns (templates that refuse tool roles still see the tools); the rest are drawn


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
    parts = (
        forced["parts"] if "parts" in forced else rng.random() < 0.3
    )  # a third of the shapes give some messages as lists of parts (a
    # template that refuses those still shows everything else in the other shapes)
    kinds = ["parts" if parts and rng.random() < 0.5 else "str" for _ in roles]
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
    has_call = "assistant_call" in roles
    tools = rng.choice((0, 1, 3)) if has_call or rng.random() < 0.3 else 0
    tools = forced.get("tools", tools)
    docs = rng.choice((1, 2)) if rng.random() < 0.15 else 0
    day = FIRST_DAY + rng.randrange(DAYS) * DAY_SECONDS
    now, other = day + rng.randrange(DAY_SECONDS), day + rng.randrange(DAY_SECONDS)
    return {"roles": roles, "kinds": kinds, "kwargs": kwargs, "tools": tools, "docs": docs, "now": now, "other": other}


def _fill(shape: dict[str, Any], rng: random.Random, long: bool, index: int) -> tuple[dict[str, Any], list[str]]:
    """One filling of ``shape``: the messages, the tools and documents, and the texts in them
    (the ones :func:`judge` must find, in the order they were made)."""
    texts: list[str] = []
    low, high = (rng.choice((60, 200, 1000)), 3000) if long else (4, 40)
    budget = [FILLING_CHARS]  # a long filling's contents stop growing past it (bounds render and judge)

    def text(kind: str) -> str:
        lo, hi = (low, high) if kind == "content" and budget[0] > 0 else (2, 12)
        value = _text(rng, lo, hi, f"Q{index}x{len(texts)}y")
        budget[0] -= len(value)
        texts.append(value)
        return value

    def name() -> str:  # short in one filling, long in the other: a rule keyed on a name's length splits them
        size = rng.randint(12, 24) if long else rng.randint(2, 6)
        value = f"{_word(rng, 1).lower()}{_word(rng, size)}_{len(texts):02d}"
        texts.append(value)
        return value

    tool_names = [name() for _ in range(shape["tools"])] or ([name()] if "assistant_call" in shape["roles"] else [])
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": text("description"),
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            },
        }
        for n in tool_names[: shape["tools"]]
    ]
    messages: list[dict[str, Any]] = []
    call_id = ""
    calls = 0
    for role, kind in zip(shape["roles"], shape["kinds"], strict=True):
        if role == "assistant_call":
            call_id = f"call{len(texts):02d}"
            fn = {"name": tool_names[calls % len(tool_names)], "arguments": {"q": text("argument")}}
            calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": call_id, "type": "function", "function": fn}],
                }
            )
            continue
        content = text("content")
        message: dict[str, Any] = {
            "role": role,
            "content": [{"type": "text", "text": content}] if kind == "parts" else content,
        }
        if role == "tool":
            message |= {"tool_call_id": call_id, "name": tool_names[(calls - 1) % len(tool_names)]}
        messages.append(message)
    documents = [{"title": text("title"), "text": text("document")} for _ in range(shape["docs"])]
    return {"messages": messages, "tools": tools or None, "documents": documents or None}, texts


FILLING_CHARS = 12000


def generate(seed: str, count: int, context: dict[str, Any]) -> list[dict[str, Any]]:
    """``count`` shapes, three renders each (``g{i}a``, ``g{i}b``: two fillings; ``g{i}t``: the
    shorter filling at another time), as battery render requests (see :mod:`.template_battery`), each with
    ``texts``: what the render must show, and ``shape``: a description of the input. The draw
    depends on ``seed`` alone (made once per process); ``context`` (the loader's variables) is
    laid under each render's keyword arguments."""
    return [{**r, "context": {**context, **r["context"]}} for r in _drawn(seed, count)]


@functools.lru_cache(maxsize=8)
def _drawn(seed: str, count: int) -> tuple[dict[str, Any], ...]:
    return tuple(_draw(seed, count))


def _draw(seed: str, count: int) -> list[dict[str, Any]]:
    rng = random.Random(hashlib.sha256(seed.encode()).hexdigest())
    out: list[dict[str, Any]] = []
    for i in range(count):
        shape = _shape(rng, i, EXTREMES[i] if i < len(EXTREMES) else None)
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
            ctx = {**shape["kwargs"], "tools": filling["tools"], "documents": filling["documents"]}
            out.append({"name": f"g{i}{name}", "messages": filling["messages"], "context": ctx, "now": now,
                        "texts": texts, "shape": label})  # fmt: skip
    return out


def describe(shape: dict[str, Any]) -> str:
    roles = [("assistant(tool call)" if r == "assistant_call" else r) + ("[parts]" if k == "parts" else "")
             for r, k in zip(shape["roles"], shape["kinds"], strict=True)]  # fmt: skip
    kw = ", ".join(f"{k}={v!r}" for k, v in sorted(shape["kwargs"].items()))
    extra = f", {shape['tools']} tools" if shape["tools"] else ""
    extra += f", {shape['docs']} documents" if shape["docs"] else ""
    return f"roles {' '.join(roles)} ({kw}{extra})"


@functools.lru_cache(maxsize=16384)  # the draw is the same for every template of a process
def _forms(text: str) -> tuple[str, ...]:
    """``text`` as a template may print it, quoted forms first (the quotes go with the text: a
    repr picks its quote by content): JSON (``tojson``), Python's repr (a list of parts printed
    whole), quoted, as is, JSON- or repr-escaped without quotes."""
    j, ja, r = json.dumps(text, ensure_ascii=False), json.dumps(text), repr(text)
    forms = [j, ja, r, f"'{text}'", f'"{text}"', text, j[1:-1], ja[1:-1], r[1:-1]]
    return tuple(dict.fromkeys(forms))


def abstract(output: str, texts: list[str]) -> str:
    """``output`` with each text (in every one of its :func:`_forms`) replaced by ``\x00i\x00``."""
    out = output
    for i, text in sorted(enumerate(texts), key=lambda it: -len(it[1])):
        for form in _forms(text):
            if form in out:
                out = out.replace(form, f"\x00{i}\x00")
    return out


def _flat(text: str, limit: int = 80) -> str:
    flat = " ".join(text.replace("\x00", "§").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _trimmed(a: str, b: str) -> tuple[str, str, int]:
    """``a`` and ``b`` without their common prefix and suffix, and the prefix's length (so a
    diff of two long renders costs the length of where they differ)."""
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    m = 0
    while m < limit - n and a[len(a) - 1 - m] == b[len(b) - 1 - m]:
        m += 1
    return a[n : len(a) - m], b[n : len(b) - m], n


def _first_difference(a: str, b: str) -> str:
    x, y, start = _trimmed(a, b)
    before = a[max(0, start - 20) : start]
    return f"{_flat(before + x[:60])!r} -> {_flat(before + y[:60])!r}"


WORD_RE = re.compile(r"\w+|\W")
DATE_WORD_RE = re.compile(
    r"^[\s\d,.:/\-]*(?:(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun|am|pm)[a-z]*"
    r"[\s\d,.:/\-]*)*$",
    re.I,
)


def _clock_difference(a: str, b: str) -> str | None:
    """The first difference of two renders at two times that is not a date word, or None."""
    if a == b:
        return None
    x, y, _start = _trimmed(a, b)
    if len(x) + len(y) > 20000:
        return f"{_flat(x[:60])!r} -> {_flat(y[:60])!r}"
    wa, wb = WORD_RE.findall(x), WORD_RE.findall(y)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes():
        was, now = "".join(wa[i1:i2]), "".join(wb[j1:j2])
        if tag != "equal" and not (DATE_WORD_RE.match(was) and DATE_WORD_RE.match(now)):
            return f"{_flat(was)!r} -> {_flat(now)!r}"
    return None


def judge(renders: list[dict[str, Any]], answer: dict[str, Any]) -> list[GeneratedIssue]:
    """Issues of the generated renders (``renders`` as :func:`generate` made them, ``answer`` the
    sandbox's battery answer for them). A shape the template refuses (raises) is skipped."""
    results = {r["name"]: (r, a) for r, a in zip(renders, answer.get("renders") or [], strict=False)}
    out: list[GeneratedIssue] = []
    for name, (request, result) in results.items():
        if not name.endswith("a") or result.get("status") != "ok":
            continue
        base = name[:-1]
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
            moved = _clock_difference(str(same[1]["output"]), str(clock[1]["output"]))
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
        dict.fromkeys(w for w in LETTERS_RE.findall(added) if w.casefold() not in vocab and not DATE_WORD_RE.match(w))
    )
    if sum(len(w) for w in words) >= limit:  # distinct words: a list of parts printed whole repeats "type", "text"
        return " ".join(words)[:160]
    return None
