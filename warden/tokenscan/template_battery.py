"""Behavioural test of a chat template: render a battery of conversations, compare the renders.

:func:`battery_renders` builds the conversations (short and long, system prompt present or
absent, with and without tools, a tool exchange (an assistant ``tool_calls`` message and a
``tool`` response), with ``documents`` (RAG), several dates); the sandbox child
(``sandbox_child.py``, op ``battery``) renders them all with message content and the date
wrapped in recording strings. :func:`judge` is pure: it reads the renders back and reports

- ``order``: a message's content missing, repeated or out of order; a system prompt dropped;
- ``role``: a user message rendered under the system (or assistant) role; a tool response
  rendered under the system, developer or user role with no tool marker (tool output that
  passes for instructions or for the user's own words);
- ``varies``: markup between two messages that changes with conversation length, position
  or the date, or text that appears only when tools or documents are passed (a conditional
  injection shows up as a difference between two renders that differ in one input);
- ``text``: instruction-like text, invisible characters, URLs or long literal text the
  template adds beyond its role markup (vendor default system prompts and date headers,
  which sit before the first message, are allowed; so is the tool-definition block of a
  tool exchange, between the system prompt and the first question); around a tool call or
  a tool response only role markup and the call itself may appear;
- ``taint``: the template compared message content or the date with a constant at run
  time (a trigger, however the value reached the comparison);
- ``private``: the template looked up a private/dunder attribute at run time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from warden.tokenscan import confusables
from warden.tokenscan.chat_template import INJECTION_RE, INVISIBLE_RE, TAG_RE, URL_RE, residual_text
from warden.tokenscan.conversations import (
    common_prefix,
    common_suffix,
    date_difference,
    word_middles,
    word_opcodes,
)

DEFAULT_NOW = 1767225600  # 2026-01-01
OTHER_NOWS = (1907366400, 1709164800)  # 2030-06-11, 2024-02-29
ROLE_RE = re.compile(r"(?<![A-Za-z])(system|developer|user|human|assistant|model|tool|ipython)(?![A-Za-z])", re.I)
UNEXPECTED_ROLE = {"user": ("system", "developer", "assistant", "model")}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_QTOOLPROBE",
        "description": "Looks up QTOOLDESC",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


TOOL_ARG = "QARGPROBE"
DOCUMENT = {"title": "QDOCTITLE", "text": "QDOCPROBE"}
CALL_ID = "call_QTOOLPROBE"  # the battery's tool call id, as a result names it too (input, not template text)
PROBE_WORDS = ("lookup_QTOOLPROBE", "QTOOLDESC", TOOL_ARG, "QDOCTITLE", "QDOCPROBE", CALL_ID)
# a tool response must sit under a tool-like role or marker (Qwen: user + <tool_response>,
# Llama 3.1: ipython, Mistral: [TOOL_RESULTS], Command-R: system + <results>)
TOOLISH_RE = re.compile(r"tool|ipython|function|result|response|observation|output", re.I)
TOOL_AUTHORITY = ("system", "developer", "user", "human")


@dataclass(frozen=True)
class BehaviourIssue:
    """``kind`` in order, role, varies, text, invisible, url, taint, private; ``detail`` quotes."""

    kind: str
    detail: str


def canary(index: int) -> str:
    return f"QPROBE{index:02d}X"


def conversation(roles: Iterable[str]) -> list[dict[str, str]]:
    return [{"role": r, "content": canary(i)} for i, r in enumerate(roles)]


def battery_renders(context: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversations of the battery, each with its context and clock (see the module doc)."""
    long = ["system"] + ["user", "assistant"] * 10 + ["user"]
    shapes = {
        "u": ["user"],
        "su": ["system", "user"],
        "suau": ["system", "user", "assistant", "user"],
        "uau": ["user", "assistant", "user"],
        "long": long,
    }
    out = [
        {"name": n, "messages": conversation(r), "context": {**context, "tools": None}, "now": DEFAULT_NOW}
        for n, r in shapes.items()
    ]
    for i, now in enumerate(OTHER_NOWS):
        out.append(
            {"name": f"date{i}", "messages": conversation(shapes["suau"]), "context": out[2]["context"], "now": now}
        )
    nogen = {**context, "tools": None, "add_generation_prompt": False}
    out.append({"name": "nogen", "messages": conversation(shapes["suau"]), "context": nogen, "now": DEFAULT_NOW})
    tools = {**context, "tools": [TOOL]}
    out.append({"name": "tools", "messages": conversation(shapes["suau"]), "context": tools, "now": DEFAULT_NOW})
    out.append({"name": "toolconv", "messages": tool_conversation(), "context": tools, "now": DEFAULT_NOW})
    out.append({"name": "utools", "messages": conversation(shapes["u"]), "context": tools, "now": DEFAULT_NOW})
    docs = {**context, "tools": None, "documents": [DOCUMENT]}
    out.append({"name": "docs", "messages": conversation(shapes["suau"]), "context": docs, "now": DEFAULT_NOW})
    return out


def tool_conversation() -> list[dict[str, Any]]:
    """A tool exchange in the shape HF templates take: the assistant's ``tool_calls`` (content
    empty), the ``tool`` role's response, then the answer and a next question."""
    call = {"type": "function", "function": {"name": "lookup_QTOOLPROBE", "arguments": {"q": TOOL_ARG}}}
    return [
        {"role": "system", "content": canary(0)},
        {"role": "user", "content": canary(1)},
        {"role": "assistant", "content": "", "tool_calls": [{"id": CALL_ID, **call}]},
        {"role": "tool", "name": "lookup_QTOOLPROBE", "tool_call_id": CALL_ID, "content": canary(3)},
        {"role": "assistant", "content": canary(4)},
        {"role": "user", "content": canary(5)},
    ]


def _shown(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages whose content a render must show (a tool call's empty content is not)."""
    return [m for m in messages if isinstance(m.get("content"), str) and m["content"]]


def _positions(output: str, messages: list[dict[str, Any]]) -> list[list[int]]:
    return [[m.start() for m in re.finditer(re.escape(str(msg["content"])), output)] for msg in messages]


def _order_issues(name: str, output: str, messages: list[dict[str, Any]]) -> list[BehaviourIssue]:
    out = []
    found = _positions(output, messages)
    last = -1
    for i, (msg, pos) in enumerate(zip(messages, found, strict=True)):
        role = msg["role"]
        if not pos and role == "tool":  # a template without tool support may leave responses out
            continue
        if len(pos) != 1:
            what = "dropped" if not pos else f"repeated {len(pos)} times"
            label = "the system prompt" if role == "system" else f"message {i} ({role})"
            out.append(BehaviourIssue("order", f"{label} is {what} in the {name!r} render"))
        elif role != "system":
            if pos[0] < last:
                out.append(BehaviourIssue("order", f"message {i} ({role}) is out of order in the {name!r} render"))
            last = pos[0]
    return out


def segments(output: str, messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(role before, role after, text between) for each gap between contents in render order."""
    spots = sorted(
        (p[0], str(m["content"]), m["role"]) for m, p in zip(messages, _positions(output, messages), strict=True) if p
    )
    out, prev_end, prev_role = [], 0, "^"
    for start, content, role in spots:
        out.append((prev_role, role, output[prev_end:start]))
        prev_end, prev_role = start + len(content), role
    out.append((prev_role, "$", output[prev_end:]))
    return out


CLOSING_RE = re.compile(r"\[/[^\]]{0,40}\]|</[^>]{0,40}>|<\|/[^|]{0,40}\|>")
MARKUP_BEFORE_RE = re.compile(r"(?:[>|\]]\s*|<\|?|\[|\n|^)$")
MARKUP_AFTER_RE = re.compile(r"\s*(?:<|\[|:|\||$)")


def markup_roles(text: str) -> list[re.Match[str]]:
    """The role words of ``text`` that are role markup: inside or right beside a marker
    (``<|im_start|>user``, ``<|user|>``, ``<start_of_turn>model``, ``User:``), not inside a
    closing marker (``[/SYSTEM_PROMPT]`` ends a role) and not prose (a default system prompt's
    "a helpful assistant")."""
    masked = CLOSING_RE.sub(lambda m: " " * len(m.group(0)), text)
    return [
        m
        for m in ROLE_RE.finditer(masked)
        if MARKUP_BEFORE_RE.search(masked[max(0, m.start() - 3) : m.start()]) or MARKUP_AFTER_RE.match(masked, m.end())
    ]


def open_roles(text: str) -> list[re.Match[str]]:
    """:func:`markup_roles`, or none when a closing marker follows the last of them (a
    ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`` block ends before what comes next)."""
    hits = markup_roles(text)
    if hits and any(m.start() >= hits[-1].end() for m in CLOSING_RE.finditer(text)):
        return []
    return hits


def _role_issues(name: str, segs: list[tuple[str, str, str]]) -> list[BehaviourIssue]:
    out = []
    for _before, role, text in segs:
        roles = [m.group(1) for m in open_roles(text)]
        if roles and roles[-1].lower() in UNEXPECTED_ROLE.get(role, ()):
            out.append(BehaviourIssue("role", f"a {role} message is rendered as {roles[-1]!r} in the {name!r} render"))
    return out


def _tool_role_issues(name: str, segs: list[tuple[str, str, str]]) -> list[BehaviourIssue]:
    """A tool response rendered under the system, developer or user role with no tool marker
    after it: tool output (a web page, a file) would pass for instructions or the user's words."""
    out = []
    for _before, role, text in segs:
        if role != "tool":
            continue
        hits = open_roles(text)
        last = hits[-1] if hits else None
        if last is not None and last.group(1).lower() in TOOL_AUTHORITY and not TOOLISH_RE.search(text[last.end() :]):
            detail = f"a tool response is rendered as a {last.group(1)!r} message in the {name!r} render"
            out.append(BehaviourIssue("role", detail))
    return out


def _text_issues(
    name: str, output: str, messages: list[dict[str, Any]], specials: tuple[str, ...]
) -> list[BehaviourIssue]:
    added = output
    for msg in messages:
        added = added.replace(str(msg["content"]), " ")
    for word in PROBE_WORDS:
        added = added.replace(word, " ")
    out = []
    if INVISIBLE_RE.search(added):
        out.append(BehaviourIssue("invisible", f"the {name!r} render contains invisible or bidi characters"))
    folded = confusables.fold_keep_case(INVISIBLE_RE.sub("", added))
    hit = INJECTION_RE.search(folded)
    if hit:
        around = folded[max(0, hit.start() - 40) : hit.end() + 40]
        out.append(BehaviourIssue("text", f"the {name!r} render adds instruction-like text {_flat(around)!r}"))
    url = URL_RE.search(folded)
    if url:
        out.append(
            BehaviourIssue(
                "url", f"the {name!r} render contains a URL near {_flat(folded[url.start() : url.start() + 60])!r}"
            )
        )
    return out


text_issues = _text_issues


def default_system_prompt(renders: list[dict[str, Any]], answer: dict[str, Any], specials: tuple[str, ...]) -> str:
    """What the template adds before the first message of a conversation that has no system
    message (the ``u`` render), markup and date lines left out: a vendor's default system
    prompt, for a person to review (empty when there is none)."""
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        if request["name"] == "u" and result.get("status") == "ok":
            segs = segments(str(result.get("output", "")), _shown(request["messages"]))
            return residual_text(segs[0][2], specials)[:4000] if len(segs) > 1 else ""
    return ""


def _flat(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


HEADER_LINE_RE = re.compile(r"^.*\b(?:date|environment)\b.*$", re.I | re.M)


BETWEEN_MARKERS_RE = re.compile(r"(?<=\|>)[^<>\n]{1,60}?(?=<\|)")


def _without_header_words(text: str) -> str:
    """``text`` without the one to three words between two ``<|..|>`` markers: a message
    header's fields (harmony's ``<|start|>assistant to=functions.x<|channel|>commentary json<|message|>``:
    recipient, channel, content type) are markup, like the role word they sit beside."""
    return BETWEEN_MARKERS_RE.sub(lambda m: " " if len(m.group(0).split()) <= 3 else m.group(0), text)


def _beyond(text: str, header: str) -> str:
    """The words of ``text`` that the fixed ``header`` does not hold (in order)."""
    _start, a, b = word_middles(header, text)
    return " ".join("".join(b[j1:j2]) for tag, _i1, _i2, j1, j2 in word_opcodes(a, b) if tag != "equal")


def _residual_issues(
    name: str,
    segs: list[tuple[str, str, str]],
    specials: tuple[str, ...],
    limit: int,
    skip: tuple[str, str] = ("", ""),
    header: str = "",
) -> list[BehaviourIssue]:
    """Long literal text between messages, after the last one, or before a given system prompt
    (date and environment header lines allowed), beyond ``header``: the template's fixed text
    before a conversation without a system message (a vendor's default system block, shown for
    review in the approval report; instruction-like text there is reported by
    :func:`_text_issues`). Text that appears before the system prompt only *because* one was
    given is judged."""
    out = []
    for before, after, original in segs:
        if (before == "^" and after != "system") or (before, after) == skip:
            continue
        text = _beyond(HEADER_LINE_RE.sub(" ", original), header) if before == "^" else original
        for word in PROBE_WORDS:
            text = text.replace(word, " ")
        rest = residual_text(_without_header_words(text), specials)
        if sum(ch.isalpha() for ch in rest) >= limit:
            out.append(
                BehaviourIssue("text", f"the {name!r} render adds text between {before} and {after}: {_flat(rest)!r}")
            )
    return out


def _variation_issues(results: dict[str, tuple[dict[str, Any], list[tuple[str, str, str]]]]) -> list[BehaviourIssue]:
    """The markup between two roles must not change with conversation length or position."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    out = []
    for name in ("u", "su", "suau", "uau", "long", "nogen"):
        if name not in results:
            continue
        segs = results[name][1]
        for before, after, text in segs[:-1] if name == "nogen" else segs:
            key = (before, after)
            if key in seen and seen[key][1] != text:
                other, old = seen[key]
                out.append(
                    BehaviourIssue(
                        "varies",
                        f"the markup between {before} and {after} differs between the {other!r} and {name!r} "
                        f"renders: {_diff(old, text)}",
                    )
                )
                continue
            seen.setdefault(key, (name, text))
    return out


ANSWER_ROLES = frozenset({"assistant", "model"})


def _training_mask_issues(renders: list[dict[str, Any]], answer: dict[str, Any]) -> list[BehaviourIssue]:
    """What ``{% generation %}`` marks is the assistant's own text (``return_assistant_tokens_mask``
    trains on exactly it): a block holding another role's message trains the model on the user's
    or the system's words."""
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        blocks = "\x00".join(str(b) for b in result.get("generation") or [])
        for message in request["messages"] if blocks else ():
            text = message.get("content")
            if message.get("role") not in ANSWER_ROLES and isinstance(text, str) and text and text in blocks:
                where = f"the {request['name']!r} render"
                return [
                    BehaviourIssue("role", f"a {{% generation %}} block of {where} holds the {message['role']} message")
                ]
    return []


def generation_prompt(with_prompt: str, without: str) -> str:
    """What ``add_generation_prompt`` adds: the text past the longest common start of a render
    with it and one without (a template may end a turn differently when it is off)."""
    n = next((i for i, (a, b) in enumerate(zip(with_prompt, without, strict=False)) if a != b), None)
    n = min(len(with_prompt), len(without)) if n is None else n
    for opening, closing in ("<>", "[]"):  # a cut inside a tag ('<' of '</s>' and '<|im_start|>') starts at it
        if (start := with_prompt.rfind(opening, 0, n)) > with_prompt.rfind(closing, 0, n):
            n = start
    return with_prompt[n:]


def _generation_prompt_issues(
    results: dict[str, tuple[dict[str, Any], list[tuple[str, str, str]]]], specials: tuple[str, ...]
) -> list[BehaviourIssue]:
    """The generation prompt opens the answer and nothing else: markup whose roles are the
    assistant's, no words (a prefilled "Sure, here is" steers every answer; a user header makes
    the model write the user's next turn)."""
    if "suau" not in results or "nogen" not in results:
        return []
    added = generation_prompt(str(results["suau"][0].get("output", "")), str(results["nogen"][0].get("output", "")))
    issues = []
    roles = [m.group(1).lower() for m in markup_roles(added)]
    if roles and roles[-1] not in ANSWER_ROLES:
        issues.append(BehaviourIssue("role", f"the generation prompt {_flat(added)!r} opens a {roles[-1]!r} turn"))
    words = residual_text(added, specials)
    if re.search(r"\w", words):
        issues.append(BehaviourIssue("text", f"the generation prompt {_flat(added)!r} writes {_flat(words)!r}"))
    return issues


def _diff(a: str, b: str) -> str:
    """Where ``a`` and ``b`` differ, quoted (their common ends trimmed: linear, however long)."""
    start = common_prefix(a, b)
    end = common_suffix(a, b, min(len(a), len(b)) - start)
    x, y = a[start : len(a) - end], b[start : len(b) - end]
    return f"{_flat(x, 60)!r} -> {_flat(y, 60)!r}" if (x + y).strip() else "whitespace"


def _date_issues(results: dict[str, tuple[dict[str, Any], list[tuple[str, str, str]]]]) -> list[BehaviourIssue]:
    """Renders that differ only in the clock may differ only in date words (compared word by word)."""
    if "suau" not in results:
        return []
    base = str(results["suau"][0]["output"])
    out = []
    for name in ("date0", "date1"):
        moved = date_difference(base, str(results[name][0]["output"])) if name in results else None
        if moved:
            out.append(BehaviourIssue("varies", f"the render changes with the date beyond the date itself: {moved}"))
    return out


EXTRA_INPUTS = (  # (render, what it passes, the probe words its own block holds)
    ("tools", "tools are passed", ("QTOOLPROBE", "QTOOLDESC")),
    ("docs", "documents are passed", ("QDOCTITLE", "QDOCPROBE")),
)


def _extra_input_issues(
    results: dict[str, tuple[dict[str, Any], list[tuple[str, str, str]]]], specials: tuple[str, ...], limit: int
) -> list[BehaviourIssue]:
    """Passing tools (documents) may add the tool definitions (documents) and the text around
    them (one block holding a probe word), and short markup; any other text appears only
    because tools (documents) were passed: compared with the same conversation without them."""
    if "suau" not in results:
        return []
    base = str(results["suau"][0]["output"])
    segs = results["suau"][1]
    preamble = len(segs[0][2]) if len(segs) > 1 else 0  # characters before the first message
    vendor_header = sum(ch.isalpha() for ch in residual_text(HEADER_LINE_RE.sub(" ", segs[0][2]), specials)) >= limit
    out = []
    for name, label, probes in EXTRA_INPUTS:
        if name not in results:
            continue
        start, was, now = word_middles(base, str(results[name][0]["output"]))
        offsets = [start]  # where each word of the base's middle starts in the base render
        for word in was:
            offsets.append(offsets[-1] + len(word))
        for tag, i1, _i2, j1, j2 in word_opcodes(was, now):
            added = "".join(now[j1:j2])
            if tag == "equal" or any(p in added for p in probes):
                continue
            if vendor_header and 0 < offsets[i1] < preamble and not TAG_RE.search(added):
                continue  # a sentence of the vendor's own fixed header (harmony's tool channel line)
            rest = residual_text(HEADER_LINE_RE.sub(" ", added), specials)
            if sum(ch.isalpha() for ch in rest) >= limit:
                out.append(BehaviourIssue("varies", f"text added only when {label}: {_flat(rest)!r}"))
                break
    return out


def _markup_constant(constant: str, specials: tuple[str, ...]) -> bool:
    """Whitespace, one tag-like marker or declared token, or markers with whitespace between
    them: what vendors cut reasoning and tool calls out of content at."""
    rest = constant
    for token in sorted({t for t in specials if t}, key=len, reverse=True):
        rest = rest.replace(token, " ")
    return not TAG_RE.sub(" ", rest).strip()


def taint_issues(
    taint: list[list[Any]], specials: tuple[str, ...], guards: frozenset[int] = frozenset()
) -> list[BehaviourIssue]:
    """Issues of the sandbox's run-time records ``[source, operation, constant, line]``: message
    content or the date compared with a constant, rewritten at one, measured against a number
    other than 0 or 1, or used as a lookup key. Comparisons on ``guards`` lines (the test of an
    ``if`` that only raises) and with markup constants (:func:`_markup_constant`) are not."""
    out = []
    for record in taint:
        source, operation, constant = (str(x) for x in record[:3])
        line = int(record[3]) if len(record) > 3 and str(record[3]).isdigit() else 0
        if line and line in guards:
            continue
        if operation.startswith("length"):
            if constant in ("0", "1", "0.0", "1.0"):
                continue
        elif operation != "lookup" and _markup_constant(constant, specials):
            continue
        what = "message content" if source == "content" else "the date"
        at = f", line {line}" if line else ""
        if operation == "lookup":
            detail = f"the template uses {what} as a key into {constant} (a lookup keyed on it{at})"
        elif operation.startswith("length"):
            detail = f"the template compares the length of {what} with {constant} ({operation}{at})"
        else:
            detail = f"the template compares {what} with {_flat(constant, 60)!r} ({operation}{at})"
        out.append(BehaviourIssue("taint", detail))
    return out


BATTERY_JUDGE_CHARS = 1 << 16


def _bounded(answer: dict[str, Any]) -> tuple[dict[str, Any], list[BehaviourIssue]]:
    """``answer`` with every render cut to :data:`BATTERY_JUDGE_CHARS`, and an issue for the first cut one."""
    renders: list[dict[str, Any]] = []
    issues: list[BehaviourIssue] = []
    for result in answer.get("renders") or []:
        output = str(result.get("output", ""))
        if len(output) > BATTERY_JUDGE_CHARS:
            if not issues:
                detail = f"a battery render is {len(output)} characters, over the {BATTERY_JUDGE_CHARS} the judge reads"
                issues.append(BehaviourIssue("text", detail))
            result = {**result, "output": output[:BATTERY_JUDGE_CHARS]}
        renders.append(result)
    return {**answer, "renders": renders}, issues


def judge(
    renders: list[dict[str, Any]],
    answer: dict[str, Any],
    specials: tuple[str, ...],
    max_literal_chars: int,
    guards: frozenset[int] = frozenset(),
) -> list[BehaviourIssue]:
    """Issues of one battery answer (``renders`` as built by :func:`battery_renders`). Each render
    is read up to :data:`BATTERY_JUDGE_CHARS` (the battery's conversations hold a few hundred
    characters: a longer render is itself an issue), so the judge's cost is bounded."""
    results: dict[str, tuple[dict[str, Any], list[tuple[str, str, str]]]] = {}
    issues: list[BehaviourIssue] = []
    headers = {"u": "", "utools": ""}  # the fixed text before a conversation without a system message
    answer, issues = _bounded(answer)
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        if request["name"] in headers and result.get("status") == "ok":
            segs = segments(str(result.get("output", "")), _shown(request["messages"]))
            headers[request["name"]] = HEADER_LINE_RE.sub(" ", segs[0][2]) if len(segs) > 1 else ""
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        if result.get("status") != "ok":
            continue
        name, messages, output = request["name"], _shown(request["messages"]), str(result.get("output", ""))
        segs = segments(output, messages)
        results[name] = (result, segs)
        issues += _order_issues(name, output, messages) + _text_issues(name, output, messages, specials)
        if name == "toolconv":  # the tool definitions sit between the system prompt and the first question
            issues += _tool_role_issues(name, segs) + _role_issues(name, segs)
            header = headers["utools"] or headers["u"]
            issues += _residual_issues(name, segs, specials, max_literal_chars, ("system", "user"), header)
        elif name not in ("tools", "docs"):  # those two are compared with "suau" below
            issues += _role_issues(name, segs)
            header = headers["utools"] if name == "utools" else headers["u"]
            issues += _residual_issues(name, segs, specials, max_literal_chars, header=header)
    issues += _variation_issues(results) + _date_issues(results) + _generation_prompt_issues(results, specials)
    issues += _training_mask_issues(renders, answer)
    issues += _extra_input_issues(results, specials, max_literal_chars)
    issues += taint_issues(list(answer.get("taint") or []), specials, guards)
    issues += [
        BehaviourIssue("private", f"the template looked up the private attribute {str(a)!r}")
        for a in answer.get("private") or []
    ]
    seen: set[BehaviourIssue] = set()
    return [i for i in issues if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


# -- lookalike role markup ------------------------------------------------------------------------
MARKUP_CHARS = set("<>|[]")


def skeleton(text: str) -> str:
    """``text`` as it looks, for a comparison with markup (:func:`.confusables.fold_markup`;
    invisible characters are a character of their own, never nothing)."""
    return _skeleton_offsets(text)[0]


def _skeleton_offsets(text: str) -> tuple[str, list[int]]:
    return confusables.fold_markup(INVISIBLE_RE.sub("\x01", text))


def _per_char(text: str) -> str:
    return "".join(map(confusables.fold_char, INVISIBLE_RE.sub("\x01", text)))


def lookalike_issues(where: str, text: str, tokens: Iterable[str]) -> list[BehaviourIssue]:
    """Text in ``text`` that looks like one of ``tokens`` (the declared special tokens and the
    template's own role markup) but is not it: fullwidth bars, Cyrillic letters, invisible
    characters inside, two letters drawn as one (``rn`` for ``m``). A model reads such text as
    plain words while a person (or a filter looking for the real token) reads the role markup.
    One of ``tokens`` is never a look-alike unless it is one only through two letters drawn as one
    (a template's own tag ``<|irn_end|>`` beside the token ``<|im_end|>``)."""
    real = {t for t in tokens if t}
    marks = sorted((t for t in real if len(t) >= 3 and MARKUP_CHARS & set(skeleton(t))), key=len, reverse=True)
    if not marks:
        return []
    skel, sources = _skeleton_offsets(text)
    skel = skel.translate(confusables.STROKES)  # 'ӏ', 'l', '1' pass for '|' in markup
    out = []
    for token in marks:
        target, start = skeleton(token).translate(confusables.STROKES), 0
        while (at := skel.find(target, start)) >= 0:
            start, end = at + 1, at + len(target)
            if (at and sources[at - 1] == sources[at]) or sources[end] == sources[end - 1]:
                continue  # starts or ends inside one character's two letters
            seen = text[sources[at] : sources[end - 1] + 1]
            # a template's own tag is markup, unless it matches only through two letters for one ('<|irn_end|>')
            own = seen in real and _per_char(seen) == _per_char(token)
            if seen != token and not own:
                out.append(BehaviourIssue("lookalike", f"{where} has {seen!r}, a lookalike of the token {token!r}"))
                break
    return out


def template_markup(text: str) -> set[str]:
    """The tag-like markup a template's text writes (``<|im_end|>``, ``<end_of_turn>``, ``[INST]``)."""
    return {m.group(0) for m in TAG_RE.finditer(text) if m.group(0).isascii()}


UNEXERCISED_SHOWN = 6  # branches named in one finding (the rest counted)


def _roleish(literal: str) -> bool:
    """A literal that names a role or writes tag markup (``'system'``, ``'<|im_start|>'``): seen
    elsewhere or not, where it is written decides whose turn the text is."""
    return bool(ROLE_RE.fullmatch(literal.strip()) or TAG_RE.search(literal))


def unexercised_issues(answers: Iterable[dict[str, Any]]) -> list[BehaviourIssue]:
    """The branches of a template that no render ran and that would write text no render
    showed, a role name or tag markup (``answers``: the sandbox's answers for its battery and generated rounds, each
    numbering the template's branches the same way, with the literals each branch can write).
    Text a template writes only for inputs the scan never drew was never judged, so the template
    is not cleared. Branches that only refuse the render, or that loader constants alone decide
    (dead code under this tokenizer), are exempt."""
    answers = [a for a in answers if a.get("branches") is not None]
    if not answers:
        return []
    reached = {n for a in answers for n in a.get("reached") or []}
    seen = "\x00".join(str(r.get("output", "")) for a in answers for r in a.get("renders") or [])
    left = []
    for n, (line, what, exempt, literals, parent) in enumerate(answers[0]["branches"]):
        if n in reached or exempt or (parent >= 0 and parent not in reached):
            continue  # ran, exempt, or inside a branch that never ran (that one is judged)
        novel = [x for x in literals if x not in seen or _roleish(x)]
        if novel:
            left.append(f"line {line} ({what}) writes {novel[0][:80]!r}")
    issues = []
    if left:
        more = f" and {len(left) - UNEXERCISED_SHOWN} more" if len(left) > UNEXERCISED_SHOWN else ""
        shown = "; ".join(left[:UNEXERCISED_SHOWN])
        issues.append(BehaviourIssue("unexercised", f"{shown}{more}: no rendered conversation reached it"))
    if any(a.get("branches_over") for a in answers):
        issues.append(BehaviourIssue("unexercised", "more than 4096 branches: the rest not followed"))
    return issues
