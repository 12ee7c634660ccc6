"""Renders chat templates in a child process: ``python -I sandbox_child.py MEMORY`` (stdlib + jinja2 only).

Never imported by the sidecar's own process for rendering: :mod:`.chat_template` starts
this file as a separate interpreter and keeps it as a worker. Each request is one JSON
line on stdin, each answer one JSON line on stdout; the worker exits at end of input::

    request: {"id": ..., "text": ..., "conversations": [[{role, content}]], "context": {...},
              "timeout": seconds, "max_output": bytes}
    answer:  {"id": ..., "status": "ok" | "timeout" | "too_large" | "memory" | "security"
              | "syntax" | "error", "output": str, "message": str, "seconds": float}

    battery: {"id": ..., "op": "battery", "text": ..., "renders": [{"messages": [...],
              "context": {...}, "now": epoch}], "timeout": seconds, "max_output": bytes}
    answer:  {"id": ..., "status": ..., "renders": [{"status": "ok" | "error", "output", "message"}],
              "taint": [[source, operation, constant, template line]], "private": [attribute names]}

A battery renders one template with many conversations and records, at run time, every
comparison of message content or of the date with a constant (``'trigger' in x``,
``x == '...'``, ``x.startswith(...)``) however the value was reached (macro argument,
namespace attribute, ``.get('content')``, filters), and every private attribute the
template looked up, even when it never used the result.

Bounds: ``RLIMIT_AS`` = MEMORY bytes, ``RLIMIT_CPU`` re-armed per request (a backstop),
``RLIMIT_FSIZE`` 0 (no writes), an ``ITIMER_REAL`` deadline per request, and an output cap
checked while streaming. Templates run in jinja2's ImmutableSandboxedEnvironment,
configured like transformers' ``apply_chat_template`` (trim_blocks, lstrip_blocks,
loopcontrols, ``{% generation %}``, ``raise_exception``, ``tojson``, ``strftime_now``).
"""

from __future__ import annotations

import datetime
import json
import math
import resource
import signal
import sys
import time
from typing import Any


class RenderTimeout(BaseException):
    """Raised by the interval timer; BaseException so templates' error handling cannot catch it."""


def _limit_process(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _arm_cpu(seconds: float) -> None:
    """Lets the process use ``seconds`` more CPU from now (SIGXCPU kills it after that)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = math.ceil(used + seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


TAINT: list[list[Any]] = []
PRIVATE: list[str] = []


TEMPLATE: list[Any] = [None]  # the template being rendered (its lines name where a comparison is)


def _template_line() -> int:
    """The template line the running comparison is on (0 when not known)."""
    frame = sys._getframe(2)
    template = TEMPLATE[0]
    while frame is not None:
        if frame.f_code.co_filename == "<template>" and template is not None:
            try:
                return int(template.get_corresponding_lineno(frame.f_lineno))
            except Exception:
                return 0
        frame = frame.f_back  # type: ignore[assignment]
    return 0


def _record(source: str, operation: str, other: Any) -> None:
    if isinstance(other, str) and not isinstance(other, Probe) and len(TAINT) < 256:
        TAINT.append([source, operation, str.__str__(other)[:200], _template_line()])
    elif operation in ("lookup", "length") and len(TAINT) < 256:
        TAINT.append([source, operation, str(other)[:200], _template_line()])


class Probe(str):
    """A string (message content, the date) that records what the template compares it with."""

    _wsrc = "content"  # private: a template cannot read it (the sandbox refuses _ names)

    def __new__(cls, value: str, source: str = "content") -> Probe:
        obj = super().__new__(cls, value)
        obj._wsrc = source
        return obj

    def _wrap(self, value: Any) -> Any:
        return Probe(value, self._wsrc) if isinstance(value, str) else value

    def __iter__(self) -> Any:  # content|first, content|list, for c in content: each character stays a Probe
        return (Probe(c, self._wsrc) for c in str.__iter__(self))

    def __contains__(self, other: Any) -> bool:
        _record(self._wsrc, "in", other)
        return str.__contains__(self, other)

    def __eq__(self, other: object) -> bool:
        _record(self._wsrc, "==", other)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _record(self._wsrc, "!=", other)
        return str.__ne__(self, other)

    def __hash__(self) -> int:  # content as a dict key or set member: a lookup keyed on content
        _record(self._wsrc, "lookup", "a dict or set")
        return str.__hash__(self)

    def __getitem__(self, key: Any) -> Any:
        return self._wrap(str.__getitem__(self, key))

    def splitlines(self, *args: Any) -> list[Any]:
        return [self._wrap(p) for p in str.splitlines(self, *args)]

    def __add__(self, other: Any) -> Any:
        return self._wrap(str.__add__(self, other))

    def __radd__(self, other: Any) -> Any:
        return self._wrap(str.__add__(other, self)) if isinstance(other, str) else NotImplemented


def _source(values: Any) -> str | None:
    """The source of the first Probe among ``values`` (and one level of lists inside them)."""
    for value in values:
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, Probe):
                return item._wsrc
    return None


def _tainting(func: Any) -> Any:
    """``func`` (a filter or join helper) whose string result stays a Probe when an input was one."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        args = tuple(list(a) if hasattr(a, "__next__") else a for a in args)  # map(...) generators
        out = func(*args, **kwargs)
        source = _source([*args, *kwargs.values()])
        return Probe(out, source) if source and isinstance(out, str) and not isinstance(out, Probe) else out

    if hasattr(func, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


class ProbeInt(int):
    """The length of message content: records what the template compares it with (``> 100``)."""

    _wsrc = "content"

    def __new__(cls, value: int, source: str = "content") -> ProbeInt:
        obj = super().__new__(cls, value)
        obj._wsrc = source
        return obj

    def __hash__(self) -> int:
        return int.__hash__(self)


def _number_comparing(name: str) -> Any:
    def method(self: ProbeInt, other: Any) -> Any:
        if isinstance(other, (int, float)) and not isinstance(other, (bool, ProbeInt)) and len(TAINT) < 256:
            TAINT.append([self._wsrc, f"length {name.strip('_')}", repr(other)[:40], _template_line()])
        return getattr(int, name)(self, other)

    return method


for _name in ("__eq__", "__ne__", "__lt__", "__gt__", "__le__", "__ge__"):
    setattr(ProbeInt, _name, _number_comparing(_name))


def _measuring(func: Any) -> Any:
    """The ``length``/``count`` filter: the length of a Probe is a :class:`ProbeInt`."""

    def wrapped(value: Any, *args: Any, **kwargs: Any) -> Any:
        out = func(value, *args, **kwargs)
        return ProbeInt(out, value._wsrc) if isinstance(value, Probe) and isinstance(out, int) else out

    return wrapped


def _replacing(func: Any) -> Any:
    """The ``replace`` filter: records what it replaces in a Probe (a rewrite keyed on content)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        for i, arg in enumerate(args[:-1]):
            if isinstance(arg, Probe):
                _record(arg._wsrc, "replace", args[i + 1])
                break
        return func(*args, **kwargs)

    if hasattr(func, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


def _keep_taint(env: Any) -> None:
    """Taint survives ``~`` concatenation and the string filters (join, replace, format...);
    the length of content and what ``replace`` rewrites in it are recorded."""
    import jinja2.runtime

    jinja2.runtime.str_join = _tainting(jinja2.runtime.str_join)  # the compiled code imports it
    if "replace" in env.filters:
        env.filters["replace"] = _replacing(env.filters["replace"])
    for name in ("join", "replace", "format", "center", "indent", "wordwrap", "striptags", "string", "truncate"):
        if name in env.filters:
            env.filters[name] = _tainting(env.filters[name])
    for name in ("length", "count"):
        if name in env.filters:
            env.filters[name] = _measuring(env.filters[name])


def _comparing(name: str) -> Any:
    def method(self: Probe, *args: Any) -> Any:
        if args:
            for arg in args[0] if isinstance(args[0], tuple) else args[:1]:
                _record(self._wsrc, name, arg)
        return getattr(str, name)(self, *args)

    return method


def _deriving(name: str) -> Any:
    def method(self: Probe, *args: Any) -> Any:
        return self._wrap(getattr(str, name)(self, *args))

    return method


for _name in ("startswith", "endswith", "find", "rfind", "index", "rindex", "count", "__lt__", "__gt__",
              "__le__", "__ge__"):  # fmt: skip
    setattr(Probe, _name, _comparing(_name))
for _name in ("lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "casefold"):
    setattr(Probe, _name, _deriving(_name))


def _rewriting(name: str) -> Any:
    """``replace``/``split``/``partition``: what the template cuts content at or rewrites in it is
    recorded (markup and whitespace are what vendors cut at), and the pieces stay Probes."""

    def method(self: Probe, *args: Any) -> Any:
        if args:
            _record(self._wsrc, name, args[0])
        out = getattr(str, name)(self, *args)
        if isinstance(out, (list, tuple)):
            return type(out)(self._wrap(p) for p in out)
        return self._wrap(out)

    return method


for _name in ("replace", "split", "rsplit", "partition", "rpartition"):
    setattr(Probe, _name, _rewriting(_name))


def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 - jinja's API

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Recording(ImmutableSandboxedEnvironment):
        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            if attr.startswith("_") and len(PRIVATE) < 64:
                PRIVATE.append(attr[:80])
            return bool(super().is_safe_attribute(obj, attr, value))

    env = Recording(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    # As transformers: a naive datetime's strftime (so '%Z' and '%z' are '', '%f' is microseconds).
    env.globals["strftime_now"] = lambda fmt: Probe(_naive_now().strftime(str(fmt)), "date")
    _keep_taint(env)
    return env


NOW = [1767225600.0]


def _naive_now() -> datetime.datetime:
    """The render's clock (``NOW``, set per request) as the naive datetime transformers' strftime_now formats."""
    return datetime.datetime.fromtimestamp(NOW[0], datetime.UTC).replace(tzinfo=None)


def _stream(template: Any, context: dict[str, Any], cap: int) -> tuple[str, bool]:
    out: list[str] = []
    size = 0
    for chunk in template.generate(**context):
        size += len(chunk.encode("utf-8", "surrogatepass"))
        if size > cap:
            return "".join(out)[:4096], False
        out.append(chunk)
    return "".join(out), True


def render_one(env: Any, text: str, request: dict[str, Any]) -> dict[str, Any]:
    """Renders ``text`` with each probe conversation until one succeeds."""
    import jinja2
    from jinja2.sandbox import SecurityError

    try:
        template = env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        return {"status": "syntax", "message": f"line {exc.lineno}: {exc.message}"}
    except RecursionError:
        return {"status": "too_large", "message": "the template nests too deeply to compile"}
    last = "no conversation rendered"
    for messages in request["conversations"]:
        context = {**request["context"], "messages": messages}
        try:
            output, complete = _stream(template, context, int(request["max_output"]))
        except SecurityError as exc:
            return {"status": "security", "message": str(exc)[:300]}
        except MemoryError:
            return {"status": "memory", "message": "the render ran out of memory"}
        except RecursionError:
            return {"status": "too_large", "message": "the render recursed too deeply"}
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"[:300]
            continue
        if not complete:
            return {"status": "too_large", "output": output, "message": f"output over {request['max_output']} bytes"}
        return {"status": "ok", "output": output, "message": ""}
    return {"status": "error", "message": last}


TEXT_KEYS = frozenset({"content", "text", "reasoning_content", "thinking"})


def _tainted(value: Any, key: str = "") -> Any:
    """``value`` with every string under a text key (message content, its parts' text, a
    document's text, reasoning) a Probe, at any depth; roles, types and names stay plain."""
    if isinstance(value, str):
        return Probe(value) if key in TEXT_KEYS else value
    if isinstance(value, list):
        return [_tainted(v, key) for v in value]
    if isinstance(value, dict):
        return {k: _tainted(v, k if isinstance(k, str) else "") for k, v in value.items()}
    return value


def _battery_one(template: Any, render: dict[str, Any], cap: int) -> dict[str, Any]:
    from jinja2.sandbox import SecurityError

    NOW[0] = float(render.get("now", NOW[0]))
    context = {**render["context"], "messages": _tainted(render["messages"])}
    if context.get("documents"):
        context["documents"] = _tainted(context["documents"])
    try:
        output, complete = _stream(template, context, cap)
    except SecurityError as exc:
        return {"status": "security", "output": "", "message": str(exc)[:300]}
    except MemoryError:
        return {"status": "memory", "output": "", "message": "the render ran out of memory"}
    except RecursionError:
        return {"status": "too_large", "output": "", "message": "the render recursed too deeply"}
    except Exception as exc:
        return {"status": "error", "output": "", "message": f"{type(exc).__name__}: {exc}"[:300]}
    if not complete:
        return {"status": "too_large", "output": output, "message": f"output over {cap} bytes"}
    return {"status": "ok", "output": output, "message": ""}


def battery(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Renders one template with every conversation of the request, recording taint."""
    import jinja2

    del TAINT[:], PRIVATE[:]
    try:
        template = env.from_string(request["text"])
    except jinja2.TemplateSyntaxError as exc:
        return {"status": "syntax", "message": f"line {exc.lineno}: {exc.message}"}
    except RecursionError:
        return {"status": "too_large", "message": "the template nests too deeply to compile"}
    cap = int(request["max_output"])
    TEMPLATE[0] = template
    renders = [_battery_one(template, r, cap) for r in request["renders"]]
    worst = next((r for r in renders if r["status"] in ("security", "memory", "too_large")), None)
    status = worst["status"] if worst else "ok"
    message = worst["message"] if worst else ""
    return {"status": status, "message": message, "renders": renders, "taint": TAINT[:], "private": PRIVATE[:]}


def _render_request(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    return render_one(env, request["text"], request)


def _on_alarm(signum: int, frame: Any) -> None:
    raise RenderTimeout


def serve_one(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    timeout = float(request["timeout"])
    start = time.monotonic()
    _arm_cpu(timeout + 2)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        serve = battery if request.get("op") == "battery" else _render_request
        result = serve(env, request)
    except RenderTimeout:
        result = {"status": "timeout", "message": f"render took longer than {timeout:g}s"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    result.update(id=request["id"], seconds=round(time.monotonic() - start, 4))
    return result


def main() -> int:
    sys.path.extend(sys.argv[2:])  # started with -I -S: the parent names where its libraries live
    _limit_process(int(sys.argv[1]))
    env = _environment()
    signal.signal(signal.SIGALRM, _on_alarm)
    for line in sys.stdin:
        result = serve_one(env, json.loads(line))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
