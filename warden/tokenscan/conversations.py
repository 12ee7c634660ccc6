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

import bisect
import functools
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Sequence
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
    start = common_prefix(a, b)
    while start and (a[start - 1].isalnum() or a[start - 1] == "_"):
        start -= 1
    end = common_suffix(a, b, min(len(a), len(b)) - start)
    while end and (a[len(a) - end].isalnum() or a[len(a) - end] == "_"):
        end -= 1
    return start, WORD_RE.findall(a[start : len(a) - end]), WORD_RE.findall(b[start : len(b) - end])


def date_difference(a: str, b: str) -> str | None:
    """The first difference of two renders at two times that is not date material
    (:func:`is_date_word`), or None: their words with the date material left out must be the
    same. Linear in the renders, whatever they hold."""
    if a == b:
        return None
    _start, wa, wb = word_middles(a, b)
    wa, wb = without_dates(wa), without_dates(wb)
    if wa == wb:
        return None
    at = common_prefix(wa, wb)
    return f"{_flat(' '.join(wa[at : at + 12]))!r} -> {_flat(' '.join(wb[at : at + 12]))!r}"


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
        if big:  # the template prints far more than any conversation holds: judged as added text
            out.append(GeneratedIssue("text", f"the render of shape {request['shape']} is {big}"))
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
