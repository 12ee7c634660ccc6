"""Renders chat templates in a child process: ``python -I sandbox_child.py MEMORY`` (stdlib + jinja2 only).

Never imported by the sidecar's own process for rendering: :mod:`.chat_template` starts
this file as a separate interpreter and keeps it as a worker. Each request is one JSON
line on stdin, each answer one JSON line on stdout; the worker exits at end of input::

    request: {"id": ..., "text": ..., "conversations": [[{role, content}]], "context": {...},
              "timeout": seconds, "max_output": bytes}
    answer:  {"id": ..., "status": "ok" | "timeout" | "too_large" | "memory" | "security"
              | "syntax" | "error", "output": str, "message": str, "seconds": float}

Bounds: ``RLIMIT_AS`` = MEMORY bytes, ``RLIMIT_CPU`` re-armed per request (a backstop),
``RLIMIT_FSIZE`` 0 (no writes), an ``ITIMER_REAL`` deadline per request, and an output cap
checked while streaming. Templates run in jinja2's ImmutableSandboxedEnvironment,
configured like transformers' ``apply_chat_template`` (trim_blocks, lstrip_blocks,
loopcontrols, ``{% generation %}``, ``raise_exception``, ``tojson``, ``strftime_now``).
"""

from __future__ import annotations

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

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt, time.gmtime(1767225600))
    return env


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


def _on_alarm(signum: int, frame: Any) -> None:
    raise RenderTimeout


def serve_one(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    timeout = float(request["timeout"])
    start = time.monotonic()
    _arm_cpu(timeout + 2)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        result = render_one(env, request["text"], request)
    except RenderTimeout:
        result = {"status": "timeout", "message": f"render took longer than {timeout:g}s"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    result.update(id=request["id"], seconds=round(time.monotonic() - start, 4))
    return result


def main() -> int:
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
