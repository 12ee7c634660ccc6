"""Chat templates: static analysis of the Jinja AST (pure) and sandboxed rendering (child process).

:func:`analyze` parses a template (parsing runs no template code) and reports: syntax
errors, dunder / private attribute or ``attr`` filter access (the SSTI patterns), control
flow keyed on message content (trigger backdoors), URLs, literal text that is neither
structure nor special tokens (hidden roles or instructions, invisible characters), and
nesting depth of loops / large ``range()`` or repetition constants.

:func:`render_templates` renders templates with probe conversations in a separate
interpreter (``sandbox_child.py``, kept as a worker and restarted after any render that
timed out, ran out of memory or crashed) under a deadline, an output cap and a memory
limit, and caches results by template digest; nothing is rendered in this process.
:func:`residual_text` is what a rendering adds beyond the conversation, special tokens
and role names.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

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
TAG_RE = re.compile(r"<\|[^|>\n]{0,48}\|>|</?[A-Za-z_][\w:.\-/]{0,40}>|\[/?INST\]|<</?SYS>>|\[/?[A-Z_]{2,24}\]")
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


def analyze(
    text: str, max_loop_depth: int = 3, max_range: int = 10000, max_literal_chars: int = 24
) -> list[TemplateIssue]:
    """Static issues of one template (see the module docstring)."""
    try:
        tree = parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return [TemplateIssue("syntax", f"line {exc.lineno}: {exc.message}")]
    issues = _introspection(tree) + _content_branches(tree) + _literals(tree, max_literal_chars)
    issues += _loops(tree, max_loop_depth, max_range)
    seen: set[TemplateIssue] = set()
    return [i for i in issues if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def _short(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _introspection(tree: nodes.Template) -> list[TemplateIssue]:
    out = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter, nodes.Const)):
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            out.append(TemplateIssue("introspection", f"attribute access .{node.attr} (line {node.lineno})"))
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            key = node.arg.value
            if isinstance(key, str) and key.startswith("_"):
                out.append(TemplateIssue("introspection", f"item access [{key!r}] (line {node.lineno})"))
        elif isinstance(node, nodes.Filter) and node.name == "attr":
            out.append(TemplateIssue("introspection", f"the attr filter (line {node.lineno})"))
        elif isinstance(node, nodes.Const) and isinstance(node.value, str) and DUNDER_RE.search(node.value):
            out.append(TemplateIssue("introspection", f"dunder name in a string {_short(node.value, 40)!r}"))
    return out


def _is_content_ref(node: nodes.Node, aliases: set[str]) -> bool:
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    return isinstance(node, nodes.Name) and node.name in aliases


def _uses_content(expr: nodes.Node, aliases: set[str]) -> bool:
    """Whether ``expr`` reads message content other than as the operand of a type test."""
    if _is_content_ref(expr, aliases):
        return True
    if isinstance(expr, nodes.Test) and expr.name in TYPE_TESTS and _is_content_ref(expr.node, aliases):
        return False
    return any(_uses_content(child, aliases) for child in expr.iter_child_nodes())


def _content_aliases(tree: nodes.Template) -> set[str]:
    aliases: set[str] = set()
    for _ in range(3):  # aliases of aliases
        for node in tree.find_all(nodes.Assign):
            if isinstance(node.target, nodes.Name) and _uses_content(node.node, aliases):
                aliases.add(node.target.name)
    return aliases


def _content_branches(tree: nodes.Template) -> list[TemplateIssue]:
    aliases = _content_aliases(tree)
    out = []
    for node in tree.find_all((nodes.If, nodes.CondExpr, nodes.For)):
        test = getattr(node, "test", None)
        if test is not None and _uses_content(test, aliases):
            kind = {nodes.If: "if", nodes.CondExpr: "inline if", nodes.For: "loop filter"}[type(node)]
            out.append(TemplateIssue("content_branch", f"{kind} on message content (line {node.lineno})"))
    return out


def _output_literals(tree: nodes.Template) -> Iterator[str]:
    for out in tree.find_all(nodes.Output):
        for child in out.nodes:
            if isinstance(child, nodes.TemplateData):
                yield child.data
            else:
                yield from (c.value for c in child.find_all(nodes.Const) if isinstance(c.value, str))
                if isinstance(child, nodes.Const) and isinstance(child.value, str):
                    yield child.value


def _literals(tree: nodes.Template, max_literal_chars: int) -> list[TemplateIssue]:
    out = []
    all_strings = [c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str)]
    all_strings += [d.data for d in tree.find_all(nodes.TemplateData)]
    for text in all_strings:
        if INVISIBLE_RE.search(text):
            out.append(TemplateIssue("invisible", f"invisible or bidi characters in {_short(text, 40)!r}"))
        if URL_RE.search(text):
            out.append(TemplateIssue("url", f"URL in {_short(text)!r}"))
    for text in _output_literals(tree):
        rest = residual_text(text, ())
        if INJECTION_RE.search(rest):
            out.append(TemplateIssue("injection", f"instruction-like text {_short(text, 100)!r}"))
        elif _letters(rest) >= max_literal_chars:
            out.append(TemplateIssue("hidden_text", f"literal text {_short(text, 100)!r}"))
    return out


def _loop_depth(node: nodes.Node, depth: int = 0) -> int:
    here = depth + 1 if isinstance(node, nodes.For) else depth
    return max([here, *(_loop_depth(child, here) for child in node.iter_child_nodes())])


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


def _letters(text: str) -> int:
    return sum(1 for ch in text if ch.isalpha())


def residual_text(output: str, special_tokens: Iterable[str]) -> str:
    """``output`` without probe contents, special tokens, tag-like markers and role words."""
    text = output
    for token in sorted({t for t in special_tokens if t}, key=len, reverse=True):
        text = text.replace(token, " ")
    for canary in CANARIES.values():
        text = text.replace(canary, " ")
    text = TAG_RE.sub(" ", text)
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


@dataclass
class _Cache:
    items: OrderedDict[str, RenderResult] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str) -> RenderResult | None:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: str, value: RenderResult) -> None:
        with self.lock:
            self.items[key] = value
            while len(self.items) > RENDER_CACHE_SIZE:
                self.items.popitem(last=False)


_CACHE = _Cache()


def _cache_key(text: str, context: dict[str, Any], limits: RenderLimits) -> str:
    blob = json.dumps([template_digest(text), context, limits.__dict__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class _Worker:
    """The long-lived sandbox process; one request at a time. Restarted after a template that
    timed out, ran out of memory or crashed it, when the memory limit changes, and every
    :data:`WORKER_MAX_RENDERS` renders."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.memory = 0
        self.served = 0
        self.buffer = b""
        self.lock = threading.Lock()

    def _start(self, memory: int) -> subprocess.Popen[bytes]:
        self.stop()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        self.proc = subprocess.Popen(
            [sys.executable, "-I", CHILD, str(memory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.memory, self.served, self.buffer = memory, 0, b""
        return self.proc

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

    def render(self, text: str, context: dict[str, Any], limits: RenderLimits) -> RenderResult:
        with self.lock:
            proc = self.proc
            if proc is None or proc.poll() is not None or self.memory != limits.memory_bytes:
                proc = self._start(limits.memory_bytes)
            request = {
                "id": "t",
                "text": text,
                "conversations": probe_conversations(),
                "context": context,
                "timeout": limits.timeout_seconds,
                "max_output": limits.max_output_bytes,
            }
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
            except OSError as exc:
                self.stop()
                return RenderResult("crashed", message=f"sandbox worker unreachable: {exc}")
            line = self._readline(time.monotonic() + limits.timeout_seconds + WORKER_GRACE_SECONDS)
            result = self._decode(line, limits)
            self.served += 1
            if result.status not in ("ok", "error", "syntax", "security") or self.served >= WORKER_MAX_RENDERS:
                self.stop()
            return result

    def _decode(self, line: bytes | None, limits: RenderLimits) -> RenderResult:
        if line is None:
            assert self.proc is not None
            code = self.proc.poll()
            if code is None or code in (-signal.SIGKILL, -signal.SIGXCPU):  # hung, or out of CPU time
                return RenderResult("timeout", message=f"render took longer than {limits.timeout_seconds:g}s")
            return RenderResult("crashed", message=f"sandbox worker died (exit {code})")
        try:
            raw = json.loads(line)
            return RenderResult(raw["status"], raw.get("output", ""), raw.get("message", ""), raw["seconds"])
        except (ValueError, KeyError, TypeError):
            return RenderResult("crashed", message="sandbox worker answered garbage")


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def stop_worker() -> None:
    """Stops the sandbox worker (the next render starts a fresh one)."""
    with _WORKER.lock:
        _WORKER.stop()


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
