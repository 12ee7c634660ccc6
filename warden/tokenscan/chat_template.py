"""Chat templates: static analysis of the Jinja AST (pure) and sandboxed rendering (child process).

:func:`analyze` first checks nesting and expression length with the (iterative) lexer, so a
hostile template cannot exhaust the recursion of the parser or of any AST walk, then parses
it (parsing runs no template code) and reports: syntax errors, dunder / private attribute or
``attr`` filter access, also with names folded from literal pieces (the SSTI patterns),
control flow keyed on message content beyond truthiness, type and markup-tag tests (trigger
backdoors), URLs (folded too), instruction-like literal text or invisible characters, and
nesting depth of loops / large ``range()`` or repetition constants. Long literal text alone
is not reported: vendors ship default system prompts; the render battery judges it.

:func:`run_battery` renders a template with the conversations of :mod:`.template_battery`
and :func:`render_templates` with probe conversations, both in a separate interpreter
(``sandbox_child.py``, kept as a worker and restarted after any render that timed out, ran
out of memory or crashed) under a deadline, an output cap and a memory limit, caching
results by template digest; nothing is rendered in this process.
:func:`residual_text` is what a rendering adds beyond the conversation, special tokens
and role names.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from warden.caches import LRUCache
from warden.tokenscan import confusables

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
CANARIES = {
    "system": "QSYSPROBE7F3A",
    "user": "QUSERPROBE51C9",
    "assistant": "QASSTPROBE0D2E",
    "user2": "QUSERPROBE88B4",
}
ROLE_WORDS = ("system", "user", "assistant", "model", "tool", "tools", "developer", "ipython", "function", "human")
TYPE_TESTS = frozenset({"string", "none", "defined", "undefined", "mapping", "iterable", "sequence", "number"})
URL_RE = re.compile(r"\b(?:https?|ftp|file|wss?)://|\bdata:[a-z]+/", re.IGNORECASE)
DUNDER_RE = re.compile(r"__\w+__")
INVISIBLE_RE = re.compile("[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]")
INJECTION_RE = re.compile(
    r"ignore (?:all |any )?(?:the )?(?:previous|prior|above|earlier)|disregard|system prompt|"
    r"do not (?:tell|reveal|mention|disclose)|new instructions|jailbreak|exfiltrat|override|"
    r"secret|password|api[ _-]?key|credential",
    re.IGNORECASE,
)
TAG_RE = re.compile(
    r"<\|[^|>\s]{0,48}\|>|</?[A-Za-z_][\w:.\-/]{0,40}(?:\s{1,4}[A-Za-z_][\w:.\-]{0,40}=\"[^\"<>]{0,60}\"){0,8}\s{0,4}>"
    r"|\[/?INST\]|<</?SYS>>|\[/?[A-Z_]{2,24}\]"
)  # an element tag may carry attributes (<tool_call id=" " type="function">): markup_tag judges every word
MARKUP_WORDS = frozenset(
    {*ROLE_WORDS, "start", "end", "begin", "of", "turn", "text", "header", "sentence", "sys", "inst", "sep", "eot",
     "eom", "eos", "bos", "pad", "unk", "mask", "cls", "call", "calls", "result", "results", "response",
     "responses", "output", "outputs", "input", "think", "thinking", "reasoning", "channel", "message", "return",
     "constrain", "python", "tag", "image", "img", "audio", "video", "vision", "speech", "available", "prompt",
     "args", "arguments", "fim", "prefix", "suffix", "middle", "code", "json", "document", "documents", "doc",
     "context", "query", "source", "sources", "search", "functions", "endoftext", "endofprompt", "role", "token",
     "chatbot", "bot", "content", "placeholder", "reserved", "special", "unused", "break", "patch", "tile",
     "separator", "box", "quad", "object", "ref", "repo", "name", "file", "answer", "solution", "plugin", "type"}
)  # fmt: skip
"""The words markup names are made of (roles, turn and header boundaries, channels, tool calls and
results, modalities, fill-in-the-middle slots): a tag-shaped marker whose name holds any other word
is words to the model (it is no token), and is read as text (:func:`markup_tag`)."""
_NAME_SPLIT_RE = re.compile(r"[^A-Za-z]+|(?<=[a-z])(?=[A-Z])")
RENDER_CACHE_SIZE = 512
WORKER_MAX_RENDERS = 200
WORKER_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class TemplateIssue:
    """One static finding: ``kind`` in syntax, introspection, content_branch, url, hidden_text,
    invisible, injection, loops; ``detail`` quotes what was seen (short)."""

    kind: str
    detail: str


class _Generation(jinja2.ext.Extension):
    """Parses transformers' ``{% generation %}...{% endgeneration %}`` block (never rendered here)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's API

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


_PARSER = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
)
_PARSE_LOCK = threading.Lock()


def template_digest(text: str) -> str:
    """SHA-256 of the template text as UTF-8 (``sha256sum chat_template.jinja``)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse(text: str) -> nodes.Template:
    """The AST; raises jinja2.TemplateSyntaxError."""
    with _PARSE_LOCK:
        return _PARSER.parse(text)


MAX_NESTING = 40
MAX_EXPRESSION_TOKENS = 200
_OPENERS = frozenset({"if", "for", "macro", "call", "filter", "with", "block", "autoescape", "generation", "raw"})
_BRACKETS = {"lparen": 1, "lbracket": 1, "lbrace": 1, "rparen": -1, "rbracket": -1, "rbrace": -1}


def complexity_problem(text: str) -> str | None:
    """Why ``text`` is too deeply nested or too long in one expression to parse safely (the
    parser and every AST walk recurse), or None. The lexer used here is iterative."""
    depth = tokens = 0
    after_begin = False
    try:
        for lineno, kind, value in _PARSER.lex(text):
            if kind in ("block_begin", "variable_begin"):
                tokens, after_begin = 0, kind == "block_begin"
                continue
            tokens += 1
            depth += _BRACKETS.get(kind, 0)
            if after_begin and kind == "name":
                depth += 1 if value in _OPENERS else -1 if value.startswith("end") and value[3:] in _OPENERS else 0
            after_begin = False
            if depth > MAX_NESTING:
                return f"nested more than {MAX_NESTING} levels deep (line {lineno})"
            if tokens > MAX_EXPRESSION_TOKENS:
                return f"an expression of more than {MAX_EXPRESSION_TOKENS} tokens (line {lineno})"
    except jinja2.TemplateSyntaxError:
        return None  # the parser reports it
    return None


def analyze(
    text: str, max_loop_depth: int = 3, max_range: int = 10000, max_literal_chars: int = 24
) -> list[TemplateIssue]:
    """Static issues of one template (see the module docstring). Never recurses without bound:
    an over-complex template is one ``complexity`` issue and is neither parsed nor rendered.
    Cached by template text (every copy of a tokenizer carries the same template)."""
    return list(_analyze_cached(text, max_loop_depth, max_range, max_literal_chars))


@functools.lru_cache(maxsize=256)
def _analyze_cached(
    text: str, max_loop_depth: int, max_range: int, max_literal_chars: int
) -> tuple[TemplateIssue, ...]:
    return tuple(_analyze(text, max_loop_depth, max_range, max_literal_chars))


def _analyze(text: str, max_loop_depth: int, max_range: int, max_literal_chars: int) -> list[TemplateIssue]:
    problem = complexity_problem(text)
    if problem:
        return [TemplateIssue("complexity", f"template {problem}; not analysed")]
    try:
        tree = parse(text)
        issues = _introspection(tree) + _content_branches(tree) + _literals(tree, max_literal_chars)
        issues += _loops(tree, max_loop_depth, max_range)
    except jinja2.TemplateSyntaxError as exc:
        return [TemplateIssue("syntax", f"line {exc.lineno}: {exc.message}")]
    except RecursionError:
        return [TemplateIssue("complexity", "template nests too deeply to analyse")]
    except (ValueError, OverflowError) as exc:  # the lexer's int(): a literal of more than 4300 digits
        return [TemplateIssue("syntax", f"literal not readable: {_short(str(exc), 60)}")]
    seen: set[TemplateIssue] = set()
    return [i for i in issues if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def _short(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


MAX_FOLD_CHARS = 4096
MAX_FOLD_INT = 1 << 20
MAX_FOLD_ITEMS = 64
MAX_FOLD_NODES = 256
_FOLD_FILTERS = frozenset(
    {"join", "lower", "upper", "trim", "reverse", "string", "replace", "first", "last", "format", "capitalize", "title"}
)


class _NoFold(Exception):
    """The expression is not a small constant built from literals (or folding it could grow)."""


def folded(node: nodes.Node) -> Any:
    """The constant value of an expression built from literals (``'__cla' ~ 'ss__'``), else None.

    Bounded by construction: nothing of the template is evaluated by Jinja in this process. Only
    literals are combined, by string concatenation, ``~``, string repetition, slicing and a few
    string filters, each result checked against :data:`MAX_FOLD_CHARS` *before* it is built;
    integers beyond :data:`MAX_FOLD_INT`, ``**``, ``/``, ``%`` and every other operator or filter
    are not folded (a template computing ``9 ** 9 ** 9`` costs nothing here)."""
    try:
        return _fold(node, [MAX_FOLD_NODES])
    except _NoFold:
        return None


def _small(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FOLD_CHARS:
        raise _NoFold
    if type(value) is int and abs(value) > MAX_FOLD_INT:
        raise _NoFold
    if isinstance(value, (list, tuple)) and len(value) > MAX_FOLD_ITEMS:
        raise _NoFold
    return value


def _fold(node: nodes.Node, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _NoFold
    if isinstance(node, nodes.Const):
        if node.value is None or type(node.value) in (str, int, bool, float):
            return _small(node.value)
        raise _NoFold
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return _small([_fold(item, budget) for item in node.items[: MAX_FOLD_ITEMS + 1]])
    if isinstance(node, nodes.Concat):
        return _joined([_fold(n, budget) for n in node.nodes[: MAX_FOLD_ITEMS + 1]])
    if isinstance(node, (nodes.Add, nodes.Mul)):
        return _binary(node, _fold(node.left, budget), _fold(node.right, budget))
    if isinstance(node, nodes.Getitem):
        return _item(_fold(node.node, budget), node.arg, budget)
    if isinstance(node, nodes.Filter) and node.name in _FOLD_FILTERS and node.node is not None:
        if node.kwargs or node.dyn_args or node.dyn_kwargs:
            raise _NoFold
        return _filter(node.name, _fold(node.node, budget), [_fold(a, budget) for a in node.args[:4]])
    raise _NoFold


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or type(value) in (int, bool, float):
        return _small(str(value))
    raise _NoFold


def _joined(parts: list[Any], sep: str = "") -> str:
    texts = [_text(p) for p in parts]
    if sum(map(len, texts)) + len(sep) * len(texts) > MAX_FOLD_CHARS:
        raise _NoFold
    return sep.join(texts)


def _binary(node: nodes.Node, left: Any, right: Any) -> Any:
    if isinstance(node, nodes.Add):
        if isinstance(left, str) and isinstance(right, str):
            return _joined([left, right])
        if type(left) is int and type(right) is int:
            return _small(left + right)
        raise _NoFold
    text, times = (left, right) if isinstance(left, str) else (right, left)
    if isinstance(text, str) and type(times) is int and times >= 0 and len(text) * times <= MAX_FOLD_CHARS:
        return text * times
    if type(left) is int and type(right) is int:
        return _small(left * right)  # both within MAX_FOLD_INT: the product is cheap
    raise _NoFold


def _item(value: Any, arg: nodes.Node, budget: list[int]) -> Any:
    if not isinstance(value, (str, list)):
        raise _NoFold
    if isinstance(arg, nodes.Slice):
        bounds = [None if part is None else _fold(part, budget) for part in (arg.start, arg.stop, arg.step)]
        if any(b is not None and type(b) is not int for b in bounds) or bounds[2] == 0:
            raise _NoFold
        return value[slice(*bounds)]
    index = _fold(arg, budget)
    if type(index) is not int or not -len(value) <= index < len(value):
        raise _NoFold
    return value[index]


def _filter(name: str, value: Any, args: list[Any]) -> Any:
    if name == "join":
        sep = args[0] if args else ""
        if not isinstance(value, list) or not isinstance(sep, str):
            raise _NoFold
        return _joined(value, sep)
    if name in ("first", "last"):
        if not isinstance(value, (str, list)) or not value:
            raise _NoFold
        return value[0] if name == "first" else value[-1]
    if name == "reverse" and isinstance(value, list):
        return value[::-1]
    text = _text(value)
    if name == "replace":
        if len(args) < 2 or not all(isinstance(a, str) for a in args[:2]) or not args[0]:
            raise _NoFold
        old, new = args[0], args[1]
        if len(text) + text.count(old) * max(0, len(new) - len(old)) > MAX_FOLD_CHARS:
            raise _NoFold
        return text.replace(old, new)
    if name == "format":
        return _format(text, args)
    simple: dict[str, Callable[[str], str]] = {
        "lower": str.lower, "upper": str.upper, "trim": str.strip, "reverse": lambda s: s[::-1],
        "string": str, "capitalize": str.capitalize, "title": str.title,
    }  # fmt: skip
    return _small(simple[name](text))


def _format(text: str, args: list[Any]) -> str:
    """``'%s%s'|format(a, b)`` with plain ``%s`` and ``%%`` only (no widths: they allocate)."""
    pieces = re.split(r"(%.)", text)
    out, given = [], iter(args)
    for piece in pieces:
        if piece == "%%":
            out.append("%")
        elif piece == "%s":
            out.append(_text(next(given, "")))
        elif piece.startswith("%") and len(piece) == 2:
            raise _NoFold
        else:
            out.append(piece)
    return _joined(out)


def _folded_strings(tree: nodes.Template) -> Iterator[tuple[int, str]]:
    """Strings computed from literals by concatenation, ``~``, ``*``, ``format`` or ``join``."""
    for node in tree.find_all((nodes.Concat, nodes.Add, nodes.Mul, nodes.Filter)):
        value = folded(node)
        if isinstance(value, str):
            yield node.lineno, value


def _introspection(tree: nodes.Template) -> list[TemplateIssue]:
    out = []
    for lineno, value in _folded_strings(tree):
        if DUNDER_RE.search(value) or value.startswith("_"):
            out.append(
                TemplateIssue("introspection", f"private name built from pieces {_short(value, 40)!r} (line {lineno})")
            )
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter, nodes.Const)):
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            out.append(TemplateIssue("introspection", f"attribute access .{node.attr} (line {node.lineno})"))
        elif isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Slice):
            key = folded(node.arg)
            if isinstance(key, str) and key.startswith("_"):
                out.append(TemplateIssue("introspection", f"item access [{key!r}] (line {node.lineno})"))
        elif isinstance(node, nodes.Filter) and node.name == "attr":
            out.append(TemplateIssue("introspection", f"the attr filter (line {node.lineno})"))
        elif isinstance(node, nodes.Const) and isinstance(node.value, str) and DUNDER_RE.search(node.value):
            out.append(TemplateIssue("introspection", f"dunder name in a string {_short(node.value, 40)!r}"))
    return out


CALLER_FIELDS = frozenset({"content", "name", "description", "title", "text", "arguments", "thinking",
                           "reasoning_content"})  # fmt: skip
"""Fields of messages, tool calls, tools and documents that hold the caller's text: keyed on,
they are content-keyed behaviour like ``content`` itself."""


def _is_content_ref(node: nodes.Node, aliases: set[str]) -> bool:
    if isinstance(node, nodes.Getattr):
        return node.attr in CALLER_FIELDS
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value in CALLER_FIELDS
    return isinstance(node, nodes.Name) and node.name in aliases


def _is_content_ref_any(node: nodes.Node, aliases: set[str]) -> bool:
    if _is_content_ref(node, aliases):
        return True
    # message.get('content'), message.get('content', '')
    return (
        isinstance(node, nodes.Call)
        and isinstance(node.node, nodes.Getattr)
        and node.node.attr == "get"
        and bool(node.args)
        and folded(node.args[0]) in CALLER_FIELDS
    )


def _uses_content(expr: nodes.Node, aliases: set[str]) -> bool:
    """Whether ``expr`` reads message content other than as the operand of a type test."""
    if _is_content_ref_any(expr, aliases):
        return True
    if isinstance(expr, nodes.Test) and expr.name in TYPE_TESTS and _is_content_ref_any(expr.node, aliases):
        return False
    return any(_uses_content(child, aliases) for child in expr.iter_child_nodes())


def _is_trigger_test(test: nodes.Node, aliases: set[str]) -> bool:
    """A branch on content that is more than a truthiness/type test or a markup-tag test
    (``{% if message.content %}``, ``'</think>' in content`` are what vendors write)."""
    while isinstance(test, nodes.Not):
        test = test.node
    if _is_content_ref_any(test, aliases):
        return False
    if not _uses_content(test, aliases):
        return False
    consts = [c.value for c in test.find_all(nodes.Const) if isinstance(c.value, str) and c.value != "content"]
    words = [v for v in consts if v.strip()]  # '' or ' ' (a fallback, a default) is no markup
    numbers = [c.value for c in test.find_all(nodes.Const) if type(c.value) in (int, float)]
    markup = bool(words) and all(TAG_RE.fullmatch(v.strip()) for v in words) and not numbers
    if markup and isinstance(test, (nodes.Compare, nodes.Call)):
        return False
    if not words and isinstance(test, nodes.Compare) and all(n in (0, 1) for n in numbers):
        return False  # an emptiness test: content|length > 0, content == ''
    return not (
        isinstance(test, (nodes.And, nodes.Or))
        and not any(_is_trigger_test(side, aliases) for side in (test.left, test.right))
    )


def _content_aliases(tree: nodes.Template) -> set[str]:
    aliases: set[str] = set()
    for _ in range(3):  # aliases of aliases
        for node in tree.find_all(nodes.Assign):
            if isinstance(node.target, nodes.Name) and _uses_content(node.node, aliases):
                aliases.add(node.target.name)
    return aliases


def _refuses(node: nodes.If) -> bool:
    """Whether an ``{% if %}`` only refuses the conversation: its body is ``raise_exception(...)``
    alone, with no else or elif. Its test is input validation (a vendor refusing its own markup
    inside content): whatever the test sees, the render's text cannot change."""
    if node.else_ or node.elif_:
        return False
    calls = []
    for stmt in node.body:
        if not isinstance(stmt, nodes.Output):
            return False
        for child in stmt.nodes:
            if isinstance(child, nodes.TemplateData) and not child.data.strip():
                continue
            if not (isinstance(child, nodes.Call) and isinstance(child.node, nodes.Name)):
                return False
            calls.append(child.node.name)
    return bool(calls) and all(c == "raise_exception" for c in calls)


@functools.lru_cache(maxsize=64)  # a pure function of the text: every copy of a template asks again
def guard_lines(text: str) -> frozenset[int]:
    """Template lines whose every comparison is the test of a refusing ``if`` (:func:`_refuses`)
    or tests or strips a protocol switch (:func:`switch_lines`): a comparison of content recorded
    at run time on such a line is a guard or the template's own protocol, not a trigger.
    Empty when the template does not parse or is too complex to walk."""
    if complexity_problem(text):
        return frozenset()
    try:
        tree = parse(text)
    except (jinja2.TemplateSyntaxError, RecursionError):
        return frozenset()
    guarded: set[int] = set()
    inside: set[int] = set()
    for node in tree.find_all(nodes.If):
        if _refuses(node):
            guarded |= {c.lineno for c in node.test.find_all((nodes.Compare, nodes.Call))}
            guarded.add(node.test.lineno)
            inside |= {id(c) for c in node.test.find_all(nodes.Node)}
            inside.add(id(node.test))
    elsewhere = {
        c.lineno
        for c in tree.find_all((nodes.Compare, nodes.Call, nodes.Test, nodes.Filter, nodes.Getitem))
        if id(c) not in inside and not (isinstance(c, nodes.Call) and _is_raise(c))
    }
    return frozenset(guarded - elsewhere) | switch_lines(tree)


# -- protocol switches ------------------------------------------------------------------------
# A vendor template may read a documented switch out of the system prompt (SmolLM3's ``/think``,
# ``/no_think``): it sets a flag, strips the switch, and the flag only picks between pieces of the
# template's own protocol text (reasoning markup, the switch itself). What answers say cannot
# depend on it; a trigger whose flag picks any other text is no switch.
SWITCH_RE = re.compile(r"/[A-Za-z][A-Za-z0-9_-]{0,31}")
"""A switch constant: a slash flag (``/think``, ``/no_think``)."""
_SWITCH_OPS = frozenset({"in", "notin", "eq", "ne"})


def _switch_test(test: nodes.Node) -> set[str]:
    """The switch constants ``test`` compares with, when it is only such comparisons (else empty)."""
    while isinstance(test, nodes.Not):
        test = test.node
    if isinstance(test, (nodes.And, nodes.Or)):
        left, right = _switch_test(test.left), _switch_test(test.right)
        return left | right if left and right else set()
    if not isinstance(test, nodes.Compare) or len(test.ops) != 1 or test.ops[0].op not in _SWITCH_OPS:
        return set()
    sides = (test.expr, test.ops[0].expr)
    consts = [n.value for n in sides if isinstance(n, nodes.Const)]
    ok = len(consts) == 1 and isinstance(consts[0], str) and SWITCH_RE.fullmatch(consts[0])
    return {consts[0]} if ok else set()


def _flag_sets(body: list[nodes.Node]) -> set[str] | None:
    """The flags ``body`` sets when it only sets flags to True/False (``{% set ns.x = false %}``)."""
    flags = set()
    for stmt in body:
        if isinstance(stmt, nodes.Output) and all(
            isinstance(c, nodes.TemplateData) and not c.data.strip() for c in stmt.nodes
        ):
            continue
        if not (isinstance(stmt, nodes.Assign) and isinstance(stmt.node, nodes.Const)):
            return None
        if not isinstance(stmt.node.value, bool):
            return None
        target = stmt.target
        if isinstance(target, nodes.NSRef):
            flags.add(f"{target.name}.{target.attr}")
        elif isinstance(target, nodes.Name):
            flags.add(target.name)
        else:
            return None
    return flags


def _protocol_text(node: nodes.Node, switches: set[str]) -> bool:
    """Whether ``node`` writes only protocol text: whitespace, tag-like markup, switch constants."""
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, nodes.TemplateData):
        text = node.data
    elif isinstance(node, nodes.Output):
        return all(_protocol_text(c, switches) for c in node.nodes)
    else:
        return False
    text = TAG_RE.sub(" ", text)  # first: '</think>' holds the switch '/think'
    for switch in sorted(switches, key=len, reverse=True):
        text = text.replace(switch, " ")
    return not text.strip()


def _flag_name(node: nodes.Node) -> str | None:
    """``ns.x`` or ``ns['x']`` as ``"ns.x"``, a plain name read as itself, else None."""
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name):
        return f"{node.node.name}.{node.attr}"
    if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) and isinstance(node.arg, nodes.Const):
        return f"{node.node.name}.{node.arg.value}"
    return node.name if isinstance(node, nodes.Name) and node.ctx == "load" else None


def _flag_reads_are_protocol(tree: nodes.Template, flags: set[str], switches: set[str]) -> bool:
    """Whether every read of ``flags`` is the whole test of an inline or block ``if`` whose
    branches write only protocol text (:func:`_protocol_text`)."""
    allowed: set[int] = set()
    for node in tree.find_all((nodes.CondExpr, nodes.If)):
        test: nodes.Node
        branches: list[nodes.Node]
        if isinstance(node, nodes.CondExpr):
            test, branches = node.test, [node.expr1, *([node.expr2] if node.expr2 is not None else [])]
        elif isinstance(node, nodes.If) and not node.elif_:
            test, branches = node.test, [*node.body, *node.else_]
        else:
            continue
        while isinstance(test, nodes.Not):
            test = test.node
        if _flag_name(test) in flags and all(_protocol_text(b, switches) for b in branches):
            allowed.add(id(test))
    reads = [n for n in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Name)) if _flag_name(n) in flags]
    # a namespace holding a flag is read through one of its names only (never whole: ``ns[key]``, a macro's argument)
    spaces = {f.split(".")[0] for f in flags if "." in f}
    named = {id(n.node) for n in tree.find_all(nodes.Getattr) if _flag_name(n)}
    named |= {id(n.node) for n in tree.find_all(nodes.Getitem) if _flag_name(n)}
    whole = [n for n in tree.find_all(nodes.Name) if n.name in spaces and n.ctx == "load" and id(n) not in named]
    return not whole and all(id(n) in allowed for n in reads)


def _strips_switch(call: nodes.Call, switches: set[str]) -> bool:
    """``x.replace('/switch', '')``: the template removes its own switch from the text."""
    if not (isinstance(call.node, nodes.Getattr) and call.node.attr == "replace") or call.kwargs or len(call.args) != 2:
        return False
    what, into = call.args
    return (
        isinstance(what, nodes.Const) and what.value in switches
        and isinstance(into, nodes.Const) and isinstance(into.value, str) and not into.value.strip()
    )  # fmt: skip


def switch_lines(tree: nodes.Template) -> frozenset[int]:
    """Lines whose every comparison tests or strips a protocol switch (see above): an ``if`` on
    slash-flag constants whose branches only set flags, every flag read only choosing protocol
    text. A line with any other comparison, call with arguments or filter is none."""
    switches: set[str] = set()
    accounted: set[int] = set()
    lines: set[int] = set()
    for node in tree.find_all(nodes.If):
        tests = [node.test, *(e.test for e in node.elif_)]
        found = [_switch_test(t) for t in tests]
        bodies = [node.body, *(e.body for e in node.elif_), node.else_]
        flags = [_flag_sets(b) for b in bodies]
        if not all(found) or any(f is None for f in flags):
            continue
        names = set().union(*(f for f in flags if f))
        consts = set().union(*found)
        if not _flag_reads_are_protocol(tree, names, consts):
            continue
        switches |= consts
        for t in tests:
            accounted |= {id(c) for c in t.find_all(nodes.Node)} | {id(t)}
            lines.add(t.lineno)
    for call in tree.find_all(nodes.Call):
        if switches and _strips_switch(call, switches):
            accounted |= {id(c) for c in call.find_all(nodes.Node)} | {id(call)}
            lines.add(call.lineno)
    others = {
        c.lineno
        for c in tree.find_all((nodes.Compare, nodes.Call, nodes.Test, nodes.Filter, nodes.Getitem))
        if id(c) not in accounted and not (isinstance(c, nodes.Call) and not c.args and not c.kwargs)
    }
    return frozenset(lines - others)


def _is_raise(call: nodes.Call) -> bool:
    return isinstance(call.node, nodes.Name) and call.node.name == "raise_exception"


def _content_branches(tree: nodes.Template) -> list[TemplateIssue]:
    aliases = _content_aliases(tree)
    out = []
    for node in tree.find_all((nodes.If, nodes.CondExpr, nodes.For)):
        if isinstance(node, nodes.If) and _refuses(node):
            continue
        test = getattr(node, "test", None)
        if test is not None and _is_trigger_test(test, aliases):
            kind = {nodes.If: "if", nodes.CondExpr: "inline if", nodes.For: "loop filter"}[type(node)]
            out.append(TemplateIssue("content_branch", f"{kind} on message content (line {node.lineno})"))
    return out


def _error_messages(tree: nodes.Template) -> set[int]:
    """ids of the Const nodes that are arguments of ``raise_exception`` (never output)."""
    out: set[int] = set()
    for call in tree.find_all(nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name == "raise_exception":
            out.update(id(c) for arg in call.args for c in arg.find_all(nodes.Const))
            out.update(id(a) for a in call.args if isinstance(a, nodes.Const))
    return out


def _output_literals(tree: nodes.Template) -> Iterator[str]:
    errors = _error_messages(tree)
    for out in tree.find_all(nodes.Output):
        for child in out.nodes:
            if isinstance(child, nodes.TemplateData):
                yield child.data
            elif isinstance(child, nodes.Const) and isinstance(child.value, str):
                yield child.value
            else:
                value = folded(child)
                if isinstance(value, str):
                    yield value
                    continue
                yield from (
                    c.value for c in child.find_all(nodes.Const) if isinstance(c.value, str) and id(c) not in errors
                )


def _literals(tree: nodes.Template, max_literal_chars: int) -> list[TemplateIssue]:
    """Invisible characters and URLs in any literal; instruction-like text in output literals
    (``max_literal_chars`` is kept for callers; the battery applies it to renders)."""
    out = []
    all_strings = [c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str)]
    all_strings += [d.data for d in tree.find_all(nodes.TemplateData)]
    all_strings += [value for _line, value in _folded_strings(tree)]
    for text in all_strings:
        if INVISIBLE_RE.search(text):
            out.append(TemplateIssue("invisible", f"invisible or bidi characters in {_short(text, 40)!r}"))
        if URL_RE.search(text):
            out.append(TemplateIssue("url", f"URL in {_short(text)!r}"))
    # Long literal text alone is not a finding (vendors ship default system prompts, date
    # headers and tool instructions): text that instructs or steers is (:func:`instruction_text`),
    # wherever the template keeps it (output, {% set %}, a macro argument); error messages are not.
    errors = _error_messages(tree)
    texts = [c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str) and id(c) not in errors]
    texts += [d.data for d in tree.find_all(nodes.TemplateData)]
    texts += [value for _line, value in _folded_strings(tree)]
    for text in dict.fromkeys(texts):
        why = instruction_text(text)
        if why:
            out.append(TemplateIssue("injection", f"{why} in {_short(text, 100)!r}"))
    return out


# -- instruction-like text ---------------------------------------------------------------------
# Vendor text around a conversation *describes*: who the model is and who made it, the date and
# knowledge cutoff, the protocol (channels, tool-call format, reasoning switches), behaviour norms
# ("ask when a question is unclear"). Injected text *directs what answers say*: it promotes
# something, tells the model to say or include a specific thing (a name, a quoted phrase, a site),
# scopes a directive over every answer, or ranks a named party above others. Judged on the text as
# it looks (confusables folded, invisible characters removed, identifiers split into words).
PROMOTE_RE = re.compile(
    r"\b(?:recommend|promot|advertis|endors|sponsor|upsell|advocat|subscrib|purchas|shill)\w*|\bbuy(?:s|ing)?\b|"
    r"\bsign(?:s|ed|ing)? up\b|\b(?:sell|sells|selling|affiliate|coupons?|promo(?:tional)? codes?|discount codes?|"
    r"referral links?)\b",
    re.IGNORECASE,
)
SAY_RE = re.compile(
    r"\binclud(?:e|es|ed)\b|\b(?:mention|insert|append|prepend|say|said|tell|told|claim|insist|remind|link|refer|redirect|direct|"
    r"respond|repl(?:y|ies|ied)|answer|suggest|advis|urg|encourag|prais|favou?r|recite|repeat|promis|prefer|visit|"
    r"steer|nudg|criticis|criticiz|disparag|discourag)\w*|\bstate[sd]? that\b|\bpoint\w*\s+(?:\w+\s+){0,3}?(?:to|at)\b|"
    r"\b(?:end|begin|start|conclude|finish|close|sign)\w*\b[^.]{0,40}\bwith\b|"
    r"\b(?:work|weav|wove|slip|sneak|blend|fold|inject|build)\w*\b[^.]{0,60}?\binto\b",  # "weave X into ..."
    re.IGNORECASE,
)
EVERY_ANSWER_RE = re.compile(
    r"\b(?:every|each|all|any)\s+(?:(?:of\s+)?(?:your|the|my)\s+)?(?:answer|response|reply|replies|completion|output)"
    r"|\b(?:every|each|all|any)\s+(?:of\s+)?your\s+(?:message|text|post|writing)s?\b"  # the model's own messages
    r"|\b(?:always|never|whenever|no matter)\b"
    r"|\b(?:whatever|everything|anything)\s+(?:you\s+)?(?:write|say|answer|reply|produce|generate)\b",
    re.IGNORECASE,
)
SUPERLATIVE_RE = re.compile(
    r"\b(?:best|better|superior|leading|cheapest|safest|most trusted|number one|only (?:choice|option|provider)"
    r"|(?:ideal|top|perfect|obvious|preferred) (?:choice|pick|option|vendor|provider)|go-to"
    r"|(?:option|choice|pick|one|vendor|provider) (?:you|to) (?:favou?r|prefer|pick|choose|recommend))\b",
    re.IGNORECASE,
)
STEERING_LEXICON: dict[str, dict[str, tuple[str, ...]]] = {
    # language -> word class -> patterns (regex, case-insensitive): "promote" alone is steering (as
    # PROMOTE_RE); "say" is with a scope or a named party in the sentence (as SAY_RE); "scope" as
    # EVERY_ANSWER_RE. Verb forms, not nouns that vendor prompts use ("conseils", "Empfehlungen" are).
    "German": {"promote": (r"empfiehl\w*", r"empfehle\b", r"empfehlen\b", r"bewirb\b", r"bewerben\b",
                           r"werb(?:e|en|t|ung)\b", r"kaufen\b"),
               "say": (r"erwähne\w*", r"nenne\b", r"sag\b", r"sage\b", r"verweise\b", r"füge\w*"),
               "scope": (r"jede[rnm]? antwort", r"allen antworten", r"immer\b", r"stets\b")},
    "Spanish": {"promote": (r"recomiend\w*", r"recomend\w*", r"promocion\w*", r"promuev\w*", r"publicit\w*",
                            r"compr(?:a|ar)\b"),
                "say": (r"menciona\w*", r"incluy\w*", r"incluir\b", r"di\b", r"sugier\w*"),
                "scope": (r"cada respuesta", r"todas las respuestas", r"siempre\b")},
    "French": {"promote": (r"recommand\w*", r"promouv\w*", r"promeu\w*", r"publicit\w*", r"achet(?:er|ez)\b"),
               "say": (r"conseill(?:e|ez|er)\b", r"mentionn\w*", r"inclu(?:s|ez|re)\b", r"dis\b", r"suggèr\w*"),
               "scope": (r"chaque réponse", r"toutes (?:les|vos|tes) réponses", r"toujours\b")},
    "Italian": {"promote": (r"raccomand\w*", r"promuov\w*", r"pubblicizz\w*"),
                "say": (r"consiglia\w*", r"menziona\w*", r"includi\w*"),
                "scope": (r"ogni risposta", r"tutte le risposte", r"sempre\b")},
    "Portuguese": {"promote": (r"recomend\w*", r"promov\w*", r"divulg\w*"),
                   "say": (r"mencion\w*", r"inclua\w*", r"sugira\w*"),
                   "scope": (r"cada resposta", r"todas as respostas", r"sempre\b")},
    "Russian": {"promote": (r"рекоменд\w*", r"реклам\w*", r"продвига\w*", r"(?:по)?совету\w*", r"купи\w*"),
                "say": (r"упомина\w*", r"упомян\w*", r"скажи\b", r"добав\w*", r"предлага\w*", r"предложи\w*"),
                "scope": (r"кажд\w* ответ\w*", r"во всех ответах", r"всегда\b")},
    "Chinese": {"promote": (r"推荐", r"推广", r"宣传", r"广告", r"推銷", r"推销", r"購買", r"购买"),
                "say": (r"提到", r"提及", r"加上", r"附上", r"告诉"),
                "scope": (r"每[个次条一](?:个)?回答", r"每[个次条](?:回复|答复)", r"所有回答", r"总是", r"始终",
                          r"一律")},
}  # fmt: skip
"""One table of steering words in other languages than English (what the English patterns above read)."""


def _unmarked(word: str) -> str:
    """``word`` as :func:`readable` leaves it: decomposed, accents removed (``réponse`` -> ``reponse``)."""
    return "".join(c for c in unicodedata.normalize("NFKD", word) if unicodedata.category(c) != "Mn")


def _lexicon(kind: str) -> re.Pattern[str]:
    """The ``kind`` words of every language as one pattern: a word of a script with spaces starts
    at a word boundary, a CJK word anywhere (no spaces between words)."""
    words = [_unmarked(w) for classes in STEERING_LEXICON.values() for w in classes[kind]]
    return re.compile("|".join(r"\b" + w if w[0].isascii() else w for w in words), re.IGNORECASE)


LEXICON_PROMOTE_RE, LEXICON_SAY_RE, LEXICON_SCOPE_RE = (_lexicon(k) for k in ("promote", "say", "scope"))
DOMAIN_RE = re.compile(
    r"\b[a-z0-9][a-z0-9-]{0,60}\.(?:com|net|org|io|ai|co|info|biz|xyz|app|dev|shop|store|ru|cn)\b", re.I
)
QUOTED_RE = re.compile(r"(?<![A-Za-z])[\"“'‘]([^\"”'’\n]{2,80}?)[\"”'’](?![A-Za-z])")
# sentences; "cutoff: 2024-06 Respond", "{...}.Do not" and "... plan You are" are two
SENTENCE_RE = re.compile(r"(?<=[.!?;])\s+|(?<=[.!?])(?=[A-Z])|(?<=[0-9:])\s+(?=[A-Z])|\s+(?=(?:You|Your)\b)|\n+|[()]")
NOUN_BEFORE_RE = re.compile(
    r"\b(?:a|an|the|your|my|our|their|its|this|that|good|final|short|full|can|could|may|might|able to)\s+\Z",
    re.IGNORECASE,
)
"""Before "answer", "reply": the noun (a good answer) or a capability (you can answer), not a directive."""
IDENTITY_RE = re.compile(
    r"\bas (?:your|its|the model's) (?:creators?|developers?|makers?|authors?|trainers?|name)\b", re.IGNORECASE
)
"""A directive's object naming who made the model ("refer to X as your creator"): identity."""
OBJECT_CHARS = 120
PLAIN_CAPS = frozenset(
    {"I", "JSON", "XML", "YAML", "HTML", "CSV", "API", "URL", "ID", "UTC", "ISO", "AI", "LLM", "OK", "MUST", "SHOULD",
     "SHALL", "NOT", "NEVER", "ALWAYS", "ONLY", "DO", "NO", "YES", "IMPORTANT", "NOTE", "Markdown", "LaTeX"}
)  # fmt: skip
SUBJECT_RE = re.compile(r"\s*([A-Z][\w&']*)(?:\s+[A-Z][\w&']*)*\s+(?:is|are|remains?|offers?|has|have)\b")
PLAIN_STARTS = frozenset(
    {"This", "That", "These", "Those", "It", "There", "Here", "The", "You", "Your", "We", "Our", "They", "Their", "He",
     "She", "What", "Which", "Who", "When", "Where", "Why", "How", "A", "An", "Each", "Every", "All", "Any", "No",
     "Some", "One", "If", "I", "My", "Today", "Now", "Do", "Don't", "Please", "Use", "Given", "For", "In", "To",
     "Then", "Finally", "First", "Firstly", "Secondly", "Thirdly", "Also", "Note", "Never", "Always", "Only"}
)  # fmt: skip
LANGUAGES = frozenset(
    {"English", "American", "British", "French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Russian",
     "Chinese", "Mandarin", "Japanese", "Korean", "Arabic", "Hindi", "Turkish", "Polish", "Persian", "Vietnamese",
     "Czech", "Ukrainian", "Romanian", "Greek", "Hebrew", "Indonesian", "Thai", "Swedish", "Tagalog"}
)  # fmt: skip
"""Capitalised in English, yet no party: "answer in many languages, such as French" names none."""
_ASKER = r"(?:\s+(?:user|question|query|input|prompt|request|message|conversation)s?(?:'s?)?){0,2}"
NORM_RE = re.compile(  # the role word may be cut out already ("as the ."): residual text has no role names
    r"\s+(?:only\s+)?in\s+(?:(?:the\s+)?same\s+language(?:\s+as(?:\s+the)?" + _ASKER + r")?|"
    r"(?:" + "|".join(sorted(LANGUAGES)) + r"))\s*(?:[.!;,]|\Z)",
    re.IGNORECASE,
)
"""After a saying verb ("Always respond in the same language as the user.", "reply in English."): a
norm on the language answers are written in, the whole object of its verb; no party, no content."""
_IDENT_RE = re.compile(r"[_▁]+|(?<=[A-Za-z])-(?=[A-Za-z])|(?<=[a-z])(?=[A-Z][a-z])")


_HIDDEN = frozenset({"Mn", "Me", "Cf", "Cc", "Co", "Cs"})


def readable(text: str) -> str:
    """``text`` as a model and a person read it: invisible characters and marks removed, look-alikes
    folded (:mod:`.confusables`, case kept), structural markers blanked and other tags' words kept,
    identifiers (``ALWAYS_RECOMMEND_ACME``, ``always-recommend``) split into words."""
    visible = _visible(text.translate(confusables.TABLE))  # before NFKD, which moves some look-alikes (U+03F2)
    return _IDENT_RE.sub(" ", without_markup(confusables.fold_keep_case(visible)))


def _visible(text: str) -> str:
    """``text`` decomposed (NFKD) without marks, format and control characters (zero-width,
    bidi, tag characters, combining accents stacked on letters); newlines and tabs kept."""
    return "".join(
        c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) not in _HIDDEN or c in "\n\t"
    )


def _entities(sentence: str, opens: bool = True) -> list[str]:
    """Capitalised words that name a party (product, company, person, site): not a sentence's,
    label's or comma clause's first word in title case, not plain capitals (``JSON``, ``MUST``),
    sentence words (``Do``, ``When``), languages or roles. A first word with capitals inside
    (``ACME``, ``OpenAI``) is a name too. ``opens``: ``sentence`` starts a sentence (else it is a
    verb's object, whose first word is no sentence start)."""
    words = list(re.finditer(r"[A-Za-z][A-Za-z0-9&']*", sentence))
    out = []
    for i, m in enumerate(words):
        w = m.group(0)
        if w in PLAIN_CAPS or w in PLAIN_STARTS or w in LANGUAGES or w.lower() in ROLE_WORDS:
            continue
        inner_caps = any(c.isupper() for c in w[1:])
        before = sentence[max(0, m.start() - 8) : m.start()].rstrip()  # a window: linear in the sentence
        clause_start = (not i and opens) or before.endswith((":", "#", "*", "-", "\u2022", ","))
        if inner_caps or (w[0].isupper() and not clause_start):
            out.append(w)
    return out


def _says(bare: str) -> Iterator[re.Match[str]]:
    """The saying verbs of ``bare`` used as verbs (the noun test looks at a window before each:
    linear in the sentence)."""
    return (m for m in SAY_RE.finditer(bare) if not NOUN_BEFORE_RE.search(bare, max(0, m.start() - 16), m.start()))


def steering(sentence: str) -> str | None:
    """Why one sentence directs what answers say (see above), or None."""
    if m := PROMOTE_RE.search(sentence):
        return f"promotion ({m.group(0)!r})"
    quoted = [q for q in QUOTED_RE.findall(sentence) if len(q.split()) >= 2]
    bare = QUOTED_RE.sub(" ", sentence)  # a quoted phrase is an object, never the verb
    say = next(_says(bare), None)
    rest = bare[: say.start()] + " " * len(say.group(0)) + bare[say.end() :] if say else bare  # the verb is no name
    if say:  # its object follows it: a language list before "answer" names none
        obj = rest[say.start() : say.end() + OBJECT_CHARS]
        target = [] if IDENTITY_RE.search(obj) else _entities(obj, opens=False)
        target = target or [q for q in quoted if q in obj] or DOMAIN_RE.findall(obj)
        if target:
            return f"a directive to say {target[0]!r} ({say.group(0)!r})"
    scope = EVERY_ANSWER_RE.search(bare)
    scoped = scope and next(  # any verb but a language norm's, or the scope's own noun ("every answer")
        (m for m in _says(bare) if not NORM_RE.match(bare, m.end()) and not scope.start() <= m.start() < scope.end()),
        None,
    )
    if scope and scoped:
        return f"a directive over every answer ({scope.group(0)!r} ... {scoped.group(0)!r})"
    subject = SUBJECT_RE.match(bare)
    named = [subject.group(1)] if subject and subject.group(1) not in PLAIN_STARTS else []
    if (best := SUPERLATIVE_RE.search(bare)) and (names := named + _entities(rest) or DOMAIN_RE.findall(sentence)):
        return f"a ranking of {names[0]!r} ({best.group(0)!r})"
    return _steering_elsewhere(sentence)


def _steering_elsewhere(sentence: str) -> str | None:
    """:func:`steering` in the languages of :data:`STEERING_LEXICON`: a promotion word, or a saying
    word with a scope over every answer or a named party in the sentence."""
    if m := LEXICON_PROMOTE_RE.search(sentence):
        return f"promotion ({m.group(0)!r})"
    if say := LEXICON_SAY_RE.search(sentence):
        if scope := LEXICON_SCOPE_RE.search(sentence):
            return f"a directive over every answer ({scope.group(0)!r} ... {say.group(0)!r})"
        if names := _entities(sentence[say.end() : say.end() + OBJECT_CHARS], opens=False):
            return f"a directive to say {names[0]!r} ({say.group(0)!r})"
    return None


BASE64_RE = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/=_-])")
GROUPED_RE = re.compile(r"(?<![A-Za-z0-9+/=])(?:[A-Za-z0-9+/=]{4,12}[ \t]+){3,}[A-Za-z0-9+/=]{2,12}")  # b64 in groups
HEX_RE = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}[ :]?){12,}(?![0-9A-Fa-f])")
BASE32_RE = re.compile(r"(?<![A-Z2-7=])[A-Z2-7]{16,}={0,6}(?![A-Z2-7=])")
ROT13 = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm"
)


def _readable_bytes(data: bytes) -> str | None:
    """``data`` as text when it is printable UTF-8 holding three words or more."""
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(c.isprintable() or c in "\n\t" for c in decoded)
    ok = decoded and printable >= 0.95 * len(decoded) and len(re.findall(r"[^\W0-9_]{2,}", decoded)) >= 3
    return decoded if ok else None


def _decodings(text: str) -> Iterator[tuple[str, bytes]]:
    """Each run of ``text`` in an encoding a model reads and a reviewer does not: base64 (either
    alphabet, padded or not, whole or in space-separated groups), base32, hex."""
    runs = [(m.group(0), "base64") for m in BASE64_RE.finditer(text)]
    runs += [(re.sub(r"\s+", "", m.group(0)), "base64") for m in GROUPED_RE.finditer(text)]
    for run, _kind in runs:
        padded = run + "=" * (-len(run) % 4)
        with contextlib.suppress(binascii.Error, ValueError):
            yield "base64", base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    for m in BASE32_RE.finditer(text):
        run = m.group(0).rstrip("=")
        with contextlib.suppress(binascii.Error, ValueError):
            yield "base32", base64.b32decode(run + "=" * (-len(run) % 8))
    for m in HEX_RE.finditer(text):
        with contextlib.suppress(ValueError):
            yield "hex", bytes.fromhex(re.sub(r"[ :]", "", m.group(0)))


def encoded_text(text: str) -> str | None:
    """The first run of ``text`` that decodes (:func:`_decodings`) to readable words: text a model
    can read and a reviewer cannot (three words or more, printable UTF-8)."""
    for _kind, data in _decodings(text):
        if (decoded := _readable_bytes(data)) is not None:
            return decoded
    return None


def _plain_instruction(text: str) -> bool:
    """:func:`instruction_text` of a decoded view, without decoding it again."""
    flat = readable(text)
    if INJECTION_RE.search(flat):
        return True
    cues = (PROMOTE_RE, SAY_RE, SUPERLATIVE_RE, LEXICON_PROMOTE_RE, LEXICON_SAY_RE)  # linear: no cue, no steering
    if not any(cue.search(flat) for cue in cues):
        return False
    return any(steering(x) for x in SENTENCE_RE.split(flat) if x.strip())


@functools.lru_cache(maxsize=2048)  # pure: a directory of template copies asks once per distinct render
def instruction_text(text: str) -> str | None:
    """Why fixed template text is instruction-like (an injection phrase, or a sentence that
    steers answers: :func:`steering`), judged as it reads (:func:`readable`); None when it only
    describes (identity, date, knowledge cutoff, protocol, behaviour norms)."""
    flat = readable(text)
    plain = spelled_out(flat)
    scripts = _IDENT_RE.sub(" ", without_markup(_visible(text)))  # other scripts unfolded: the lexicon reads them
    if encoded := encoded_text(text):
        return f"encoded text (decodes to {_short(encoded, 60)!r})"
    if (rotated := text.translate(ROT13)) != text and _plain_instruction(rotated):
        return f"encoded text (ROT13 of {_short(readable(rotated), 60)!r})"
    for view in dict.fromkeys((flat, plain, scripts)):
        if m := INJECTION_RE.search(view):
            return f"instruction-like text ({m.group(0)!r})"
        for sentence in SENTENCE_RE.split(view):
            why = steering(sentence) if sentence.strip() else None
            if why:
                return f"steering text: {why}"
    return None


SPACED_RE = re.compile(r"(?<![A-Za-z])(?:[A-Za-z] ){3,}[A-Za-z](?![A-Za-z])")
"""Four or more letters with one space between each (``R e c o m m e n d``; readable text has
``R-e-c-o`` and ``R_e_c_o`` as that too)."""
LEET_RE = re.compile(
    r"(?<![\w@$])(?=(?:[A-Za-z0-9@$]*?[A-Za-z]){3})(?=[A-Za-z@$0-9]*?[0134578@$])[A-Za-z0134578@$]+(?![\w@$])"
)
"""A word of three letters or more written partly with digits that pass for letters (or ``@``,
``$``): ``R3c0mm3nd``, ``4dvertise``, ``b3st``. A digit that passes for none (``Qwen2``) keeps a
word as it is."""
LEET = str.maketrans("0134578@$", "oieastbas")


def spelled_out(text: str) -> str:
    """``text`` with letter-spaced words joined and digits used as letters read as letters (``0``
    as ``o``, ``3`` as ``e``, ...): the spelling a model reads through. Other words are kept."""
    joined = SPACED_RE.sub(lambda m: m.group(0).replace(" ", ""), text)
    return LEET_RE.sub(lambda m: m.group(0).translate(LEET), joined)


def _loop_depth(tree: nodes.Node) -> int:
    """Deepest nesting of ``{% for %}`` loops (iterative walk)."""
    best, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        here = depth + 1 if isinstance(node, nodes.For) else depth
        best = max(best, here)
        stack.extend((child, here) for child in node.iter_child_nodes())
    return best


def _loops(tree: nodes.Template, max_depth: int, max_range: int) -> list[TemplateIssue]:
    out = []
    depth = _loop_depth(tree)
    if depth > max_depth:
        out.append(TemplateIssue("loops", f"loops nested {depth} deep (policy allows {max_depth})"))
    for call in tree.find_all(nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name == "range":
            big = [a.value for a in call.args if isinstance(a, nodes.Const) and isinstance(a.value, int)]
            if any(abs(v) > max_range for v in big):
                out.append(TemplateIssue("loops", f"range({max(big, key=abs)}) (line {call.lineno})"))
    for mul in tree.find_all((nodes.Mul, nodes.Pow)):
        for side in (mul.left, mul.right):
            if isinstance(side, nodes.Const) and isinstance(side.value, int) and abs(side.value) > max_range:
                out.append(TemplateIssue("loops", f"multiplication by {side.value} (line {mul.lineno})"))
    return out


def markup_tag(tag: str) -> bool:
    """Whether a tag-shaped marker (a :data:`TAG_RE` match that is no declared token) names
    structure only: every word of its name is one of :data:`MARKUP_WORDS`, or at most two letters
    (``<s>``, ``<|im_sep|>``, ``[INST]``). ``<|recommend_the_acme_plan|>`` is not markup."""
    return all(w.lower() in MARKUP_WORDS or len(w) <= 2 for w in _NAME_SPLIT_RE.split(tag) if w)


def _tag_text(match: re.Match[str]) -> str:
    tag = match.group(0)
    return " " if markup_tag(tag) else " " + " ".join(w for w in re.split(r"[\W_]+", tag) if w) + " "


def without_markup(text: str) -> str:
    """``text`` with structural markers (:func:`markup_tag`) blanked and the words of any other
    tag-shaped marker kept as words (an instruction spelled as a tag is still an instruction)."""
    return TAG_RE.sub(_tag_text, text)


def residual_text(output: str, special_tokens: Iterable[str]) -> str:
    """``output`` without probe contents, declared tokens, structural markers and role words.
    A tag-shaped marker that is no declared token and names more than structure
    (:func:`markup_tag`) is text the model reads: its words stay."""
    text = output
    for token in sorted({t for t in special_tokens if t}, key=len, reverse=True):
        text = text.replace(token, " ")
    for canary in CANARIES.values():
        text = text.replace(canary, " ")
    text = without_markup(text)
    words = re.split(r"(\W+)", text)
    kept = [w for w in words if w.lower() not in ROLE_WORDS]
    return " ".join("".join(kept).split())


# -- rendering -------------------------------------------------------------------------
def probe_conversations() -> list[list[dict[str, str]]]:
    """Conversation shapes tried in order until one renders (templates may demand a shape)."""
    c = CANARIES
    full = [
        {"role": "system", "content": c["system"]},
        {"role": "user", "content": c["user"]},
        {"role": "assistant", "content": c["assistant"]},
        {"role": "user", "content": c["user2"]},
    ]
    return [full, full[1:], full[1:2]]


@dataclass(frozen=True)
class RenderLimits:
    timeout_seconds: float
    max_output_bytes: int
    memory_bytes: int


@dataclass(frozen=True)
class RenderResult:
    """``status``: ok, timeout, too_large, memory, security, syntax, error (template raised on
    every probe), or crashed (the child died without an answer)."""

    status: str
    output: str = ""
    message: str = ""
    seconds: float = 0.0


_CACHE: LRUCache[str, RenderResult] = LRUCache(RENDER_CACHE_SIZE)  # by digest, context and limits


def _cache_key(text: str, context: dict[str, Any], limits: RenderLimits) -> str:
    blob = json.dumps([template_digest(text), context, limits.__dict__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def import_dirs(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The directories the sandbox children import ``modules`` from. The children start with
    ``-I -S`` (no site: no ``.pth`` file runs in them, and start-up is ~20 ms shorter) and put
    only these directories on ``sys.path``."""
    out: list[str] = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
        if origin and os.path.dirname(origin) not in out:
            out.append(os.path.dirname(origin))
    return tuple(out)


class _Worker:
    """A long-lived sandbox process running ``script``; one request at a time. Restarted after
    a request that timed out, ran out of memory or crashed it, when the memory limit changes,
    and every :data:`WORKER_MAX_RENDERS` requests."""

    def __init__(
        self, script: str = CHILD, env: dict[str, str] | None = None, modules: Sequence[str] = ("jinja2",)
    ) -> None:
        self.script, self.extra_env, self.modules = script, dict(env or {}), tuple(modules)
        self.proc: subprocess.Popen[bytes] | None = None
        self.memory = 0
        self.served = 0
        self.requests = 0  # sent over this object's lifetime, across restarts (tests, metrics)
        self.buffer = b""
        self.lock = threading.Lock()

    def _start(self, memory: int) -> subprocess.Popen[bytes]:
        self.stop()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", **self.extra_env}
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", self.script, str(memory), *import_dirs(self.modules)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.memory, self.served, self.buffer = memory, 0, b""
        return self.proc

    def prestart(self, memory: int) -> None:
        """Starts the worker now, without waiting for it, so its interpreter start and imports
        overlap the caller's own work; a no-op while a worker with this limit is running or
        another thread is using it."""
        if self.lock.acquire(blocking=False):
            try:
                if self.proc is None or self.proc.poll() is not None or self.memory != memory:
                    self._start(memory)
            finally:
                self.lock.release()

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None

    def _readline(self, deadline: float) -> bytes | None:
        """One answer line, or None on timeout or end of output."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def call(
        self, request: dict[str, Any], memory: int, timeout: float, on_sent: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Sends one request and returns the child's answer, or ``{"status": "timeout" | "crashed"}``
        when it gave none in time (the child is then killed and restarted next time).
        ``on_sent`` is called once the request is written, or at once when the worker is busy
        (a caller about to hold the GIL in a long parse waits for it, so the child starts first),
        and in any case before this returns or raises (a worker that cannot start)."""
        if not self.lock.acquire(blocking=False):
            if on_sent is not None:
                on_sent()
                on_sent = None
            self.lock.acquire()
        try:
            return self._call(request, memory, timeout, on_sent)
        finally:
            self.lock.release()
            if on_sent is not None:
                on_sent()  # again after a write is harmless: it sets an event

    def _call(
        self, request: dict[str, Any], memory: int, timeout: float, on_sent: Callable[[], None] | None
    ) -> dict[str, Any]:
        proc = self.proc
        if proc is None or proc.poll() is not None or self.memory != memory:
            proc = self._start(memory)
        self.requests += 1
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            self.stop()
            return {"status": "crashed", "message": f"sandbox worker unreachable: {exc}"}
        finally:
            if on_sent is not None:
                on_sent()
        line = self._readline(time.monotonic() + timeout + WORKER_GRACE_SECONDS)
        answer = self._decode(line, timeout)
        self.served += 1
        if answer["status"] not in ("ok", "error", "syntax", "security") or self.served >= WORKER_MAX_RENDERS:
            self.stop()
        return answer

    def render(self, text: str, context: dict[str, Any], limits: RenderLimits) -> RenderResult:
        request = {
            "id": "t",
            "text": text,
            "conversations": probe_conversations(),
            "context": context,
            "timeout": limits.timeout_seconds,
            "max_output": limits.max_output_bytes,
        }
        raw = self.call(request, limits.memory_bytes, limits.timeout_seconds)
        return RenderResult(
            raw["status"], str(raw.get("output", "")), str(raw.get("message", "")), raw.get("seconds", 0.0)
        )

    def _decode(self, line: bytes | None, timeout: float) -> dict[str, Any]:
        if line is None:
            assert self.proc is not None
            code = self.proc.poll()
            if code is None or code in (-signal.SIGKILL, -signal.SIGXCPU):  # hung, or out of CPU time
                return {"status": "timeout", "message": f"took longer than {timeout:g}s"}
            return {"status": "crashed", "message": f"sandbox worker died (exit {code})"}
        try:
            raw = json.loads(line)
        except ValueError:
            raw = None
        if not isinstance(raw, dict) or not isinstance(raw.get("status"), str):
            return {"status": "crashed", "message": "sandbox worker answered garbage"}
        return raw


class _WorkerPool:
    """Up to ``size`` :class:`_Worker` processes of one script, for requests that arrive together
    (:func:`~.scanner.scan_paths` over many distinct tokenizers). Each worker is still one
    request at a time, under its own memory cap and deadline. A call takes the idle worker used
    last (sequential scans keep using one warm worker; the others start only when requests
    overlap), or waits for one."""

    def __init__(self, size: int, script: str, env: dict[str, str] | None, modules: Sequence[str]) -> None:
        self.workers = [_Worker(script, env, modules) for _ in range(max(1, size))]
        self.idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        for worker in reversed(self.workers):
            self.idle.put(worker)

    @property
    def requests(self) -> int:
        return sum(w.requests for w in self.workers)

    def prestart(self, memory: int) -> None:
        self.workers[0].prestart(memory)

    def stop(self) -> None:
        for worker in self.workers:
            with worker.lock:
                worker.stop()

    def call(
        self, request: dict[str, Any], memory: int, timeout: float, on_sent: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """As :meth:`_Worker.call`, on an idle worker (``on_sent`` at once when all are busy)."""
        try:
            worker = self.idle.get_nowait()
        except queue.Empty:
            if on_sent is not None:
                on_sent()
                on_sent = None
            worker = self.idle.get()
        try:
            return worker.call(request, memory, timeout, on_sent)
        finally:
            self.idle.put(worker)


def pool_size(limit: int = 4) -> int:
    """Sandbox workers for one kind of request: half the CPUs this process may run on, at most
    ``limit`` (1 on a 2-core machine: there a second worker only competes with this process)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(limit, cpus // 2))


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def prestart_worker(memory: int) -> None:
    """Starts the sandbox worker in the background (see :meth:`_Worker.prestart`)."""
    _WORKER.prestart(memory)


def stop_worker() -> None:
    """Stops the sandbox worker (the next render starts a fresh one)."""
    with _WORKER.lock:
        _WORKER.stop()


def run_battery(text: str, renders: list[dict[str, Any]], limits: RenderLimits) -> dict[str, Any]:
    """The sandbox child's answer to a battery of renders of ``text`` (cached by content)."""
    key = "battery:" + _cache_key(text, {"renders": renders}, limits)
    cached = _CACHE.get(key)
    if cached is not None:
        return json.loads(cached.output)  # type: ignore[no-any-return]
    request = {
        "id": "b",
        "op": "battery",
        "text": text,
        "renders": renders,
        "timeout": limits.timeout_seconds * 4,
        "max_output": limits.max_output_bytes,
    }
    answer = _WORKER.call(request, limits.memory_bytes, limits.timeout_seconds * 4)
    if answer["status"] != "crashed":
        _CACHE.put(key, RenderResult("battery", json.dumps(answer)))
    return answer


def render_templates(texts: Sequence[str], context: dict[str, Any], limits: RenderLimits) -> list[RenderResult]:
    """Renders each template in the sandbox worker (cached by digest, context and limits).

    A ``crashed`` result (the sandbox itself failed) is not cached, so the next scan retries."""
    keys = [_cache_key(t, context, limits) for t in texts]
    done: dict[str, RenderResult] = {}
    for key in keys:
        cached = _CACHE.get(key)
        if cached is not None:
            done[key] = cached
    for key, text in dict(zip(keys, texts, strict=True)).items():
        if key not in done:
            done[key] = result = _WORKER.render(text, context, limits)
            if result.status != "crashed":
                _CACHE.put(key, result)
    return [done[k] for k in keys]
