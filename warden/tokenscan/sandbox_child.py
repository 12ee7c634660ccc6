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
              "taint": [[source, operation, constant, template line]], "private": [attribute names],
              "demands": [[source, operation, constant, path]]}

A battery renders one template with many conversations. Message content (and its parts'
text, documents' text, reasoning) and the clock (``strftime_now``) are recording values
(:class:`Probe`, :class:`ProbeInt`, :class:`ProbeFloat`; source ``content`` or ``date``), and
whatever the template derives from them stays one: the environment's own hooks taint the result
of every call, arithmetic operator, filter, macro/``caller()``/``{% set %}`` block and printed
``{{ }}`` with a tainted input. A record ``[source, operation, constant, line]`` is kept, once
each, for every comparison, membership test or rewrite of a tainted value with a constant
(``'trigger' in x``, ``x in '...'``, ``x == '...'``, ``x.startswith(...)``, ``select('equalto')``)
or with another tainted value, by that value's text (a constant laundered as ``x[:0] ~ '...'``
is judged as the constant; one equal to a whole message text of the render is content compared
with content, the conversation's structure, and is not recorded), every ``str.is*()`` test,
lookup keyed on it, identity test, comparison or truth test of a derived number (with another
derived number by its plain value), and use of a derived number as a repetition count, index,
slice bound or ``range()`` argument. Taint follows content into bytes (``encode()``, and
``decode()`` back: :class:`ProbeBytes`), into the pieces ``|list``/``|batch`` make of it
(:class:`TaintedList`: their length, a loop over them) and into a loop over it: its
``loop.index``/``loop.length`` and what the loop stores in a namespace are tainted (a counter
incremented per character measures content). Past 256 records a last ``overflow`` record says
recording stopped. The string forms of the globals (``dict``, ``namespace``,
``raise_exception``, ``strftime_now``), written as transformers 5 shows them, are recording
values of source ``environment``. Every private attribute the template looked up is listed,
even when it never used the result.

Inputs (demands). A render that names its keyword arguments (``"inputs": [names]``: the generated
conversations) has its inputs labelled by the same machinery, with a source naming the input: roles
(``input:role``), content-block types (``input:type``), tool names, those keyword arguments
(strings, and numbers as tainted numbers) are Probes; the message, tool and document lists are
counted lists (``input:count:...``: their length, a slice's length, a loop's counters and what the
loop counts in a namespace are tainted numbers; a count minus a constant is tested as the count; so
are a message's content blocks and tool calls); each message, content block, tool, its function and
parameter properties and each document is an input dict: a key the template asks it for and it lacks
(``m['meta' ~ 'data']``, ``.get(k)``, ``k in m``) is recorded by name, and a loop over it or its
``items()``/``keys()`` (``|list``, ``|dictsort``) yields its keys as Probes (``input:key:<label>``).
A record of an input source is a *demand* ``[source, operation, constant, path]`` (``path``: the
slices, case/trim filters and constant affixes between the input and the value tested), not taint: up to 256 distinct
ones, then an ``overflow`` demand. A value derived from content and an input keeps content's source,
and a comparison of two Probes records it for both, so labelling inputs never hides a content
record; labelled values render exactly as the plain ones (their string forms, ``tojson``, views).
:mod:`.demands` turns the demands into a second round of inputs that pass them.

Bounds: ``RLIMIT_AS`` = MEMORY bytes, ``RLIMIT_CPU`` re-armed per request (a backstop),
``RLIMIT_FSIZE`` 0 (no writes), an ``ITIMER_REAL`` deadline per request, and an output cap
checked while streaming. Templates run in jinja2's ImmutableSandboxedEnvironment,
configured like transformers' ``apply_chat_template`` (trim_blocks, lstrip_blocks,
loopcontrols, ``{% generation %}``, ``raise_exception``, ``tojson``, ``strftime_now``).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import re
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
SEEN: set[tuple[str, str, str, int]] = set()  # the records of the current request (TAINT without repeats)
MAX_RECORDS = 256


TEMPLATE: list[Any] = [None]  # the template being rendered (its lines name where a comparison is)


def _template_line() -> int:
    """The template line the running comparison is on (0 when not known)."""
    frame = sys._getframe(1)
    template = TEMPLATE[0]
    while frame is not None:
        if frame.f_code.co_filename == "<template>" and template is not None:
            try:
                return int(template.get_corresponding_lineno(frame.f_lineno))
            except Exception:
                return 0
        frame = frame.f_back  # type: ignore[assignment]
    return 0


INPUT = "input:"  # the sources naming a conversation input (role, key, kwarg, count): their records are demands
DEMANDS: list[list[Any]] = []  # [source, operation, constant, path]: what the template tested an input against
DEMAND_SEEN: set[tuple[Any, ...]] = set()
RENDER = [0]  # the index of the render in progress among the request's
MAX_DEMANDS = 256
INPUT_DICTS: dict[int, str] = {}  # id of an input dict of the render (a message, a part, a tool...) -> its label
INPUT_VIEWS: dict[int, str] = {}  # id of an input dict's items()/keys() view -> the dict's label
KEPT: list[Any] = []  # those views, alive until the render ends (an id names one object meanwhile)
INPUT_PATHS: dict[int, str] = {}  # id of an input dict -> where it is in the render (``tools/*/function``)
FREE_KEYED = frozenset({"arguments", "properties"})  # dicts keyed by names the caller picks: ``*`` in a path
MAX_LABELLED = 64  # items of one list or dict labelled by path


def _is_input(source: str | None) -> bool:
    return source is not None and source.startswith(INPUT)


def _stronger(a: str | None, b: str | None) -> str | None:
    """The source a value derived from both keeps: content, the clock or the environment over an
    input label (a content record is a finding, a demand only asks for more inputs)."""
    if a is None or (_is_input(a) and b is not None and not _is_input(b)):
        return b
    return a


def _demand(source: str, operation: str, constant: str, path: tuple[Any, ...] = ()) -> None:
    """One demand ``[source, operation, constant, path]``: the template tested a value derived
    from the input ``source`` (after the steps ``path``: slices, case and trim filters) with
    ``constant``; each distinct one once, at most MAX_DEMANDS (then an ``overflow`` demand)."""
    if len(DEMANDS) > MAX_DEMANDS:  # recording stopped: nothing more is kept (nor remembered)
        return
    record = (source, operation, constant[:200], path[:8])
    if record in DEMAND_SEEN:
        return
    DEMAND_SEEN.add(record)
    if len(DEMANDS) < MAX_DEMANDS:  # the render it was first seen in: round three keeps that render's edits
        DEMANDS.append([source, operation, constant[:200], [list(p) for p in path[:8]], RENDER[0]])
    elif len(DEMANDS) == MAX_DEMANDS:
        DEMANDS.append([source, "overflow", f"more than {MAX_DEMANDS} distinct input tests", []])


def _note(source: str, operation: str, constant: str, path: tuple[Any, ...] = ()) -> None:
    """One run-time record ``[source, operation, constant, template line]``, each distinct one
    once (a record of an input is a demand: :func:`_demand`). Past MAX_RECORDS distinct records
    one last record says recording stopped: a template cannot hide a trigger behind a flood of
    harmless comparisons (that record is judged too)."""
    if _is_input(source):
        _demand(source, operation, constant, path)
        return
    record = (source, operation, constant[:200], _template_line())
    if record in SEEN:
        return
    SEEN.add(record)
    if len(TAINT) < MAX_RECORDS:
        TAINT.append(list(record))
    elif len(TAINT) == MAX_RECORDS:
        TAINT.append([source, "overflow", f"more than {MAX_RECORDS} distinct comparisons (recording stopped)", 0])


SOURCES: set[str] = set()  # the render's source texts: its message texts, whole and trimmed (set per render)
INPUT_TEXTS: set[str] = set()  # the strings and keys labelled by path (set per render)


def _constant(other: Any) -> str | None:
    """The text a comparison with ``other`` compares with, as a record's constant: a constant
    string; a tainted string too (a constant joined to ``content[:0]`` is one), unless it is a
    whole message text of the render (content compared with another message's content: the
    conversation's structure, not a trigger; a constant laundered to equal a battery message
    is missed here, but that render then shows what the trigger does). None for anything else."""
    if isinstance(other, (bytes, bytearray)):  # bytes compared with bytes: by their UTF-8 text
        plain, tainted = bytes.decode(bytes(other), "utf-8", "backslashreplace"), isinstance(other, ProbeBytes)
    elif isinstance(other, str):
        plain, tainted = str.__str__(other), isinstance(other, Probe)
    else:
        return None
    return None if tainted and plain in SOURCES else plain


def _record(source: str, operation: str, other: Any, path: tuple[Any, ...] = ()) -> None:
    """A comparison (or rewrite, or cut) of a tainted string with ``other``: recorded when
    ``other`` is a string (:func:`_constant`), tainted or not; a lookup keyed on the string is
    recorded with what it looks into. ``path``: the steps from an input to the string (demands)."""
    if _is_input(source) and isinstance(other, Probe) and _is_input(other._wsrc) and str.__str__(other) in INPUT_TEXTS:
        return  # an input compared with another input's value (a parameter name in `required`): structure
    constant = _constant(other)
    if constant is not None:
        _note(source, operation, constant, path)
    elif operation in ("lookup", "length"):
        _note(source, operation, str(other), path)


def _record_both(probe: Probe, operation: str, other: Any) -> None:
    """``probe`` compared with ``other``; when ``other`` is a value of another source, the test is
    recorded for it too (an input compared with content is a content test: Python asks the left
    one of two Probes only)."""
    _record(probe._wsrc, operation, other, probe._wpath)
    if isinstance(other, Probe) and other._wsrc != probe._wsrc:
        _record(other._wsrc, operation, probe, other._wpath)


class Probe(str):
    """A string (message content, the date, the environment's names, or an input: a role, a key,
    a keyword argument) that records what the template compares it with; whatever the template
    derives from it stays a Probe. ``_wpath``: the steps from an input to this string (demands)."""

    _wsrc = "content"  # private: a template cannot read it (the sandbox refuses _ names)
    _wpath: tuple[Any, ...] = ()

    def __new__(cls, value: str, source: str = "content", path: tuple[Any, ...] = ()) -> Probe:
        obj = super().__new__(cls, value)
        obj._wsrc = source
        if path:
            obj._wpath = path
        return obj

    def _wrap(self, value: Any) -> Any:
        return _tainted_result(value, self._wsrc)

    def _kept(self, value: Any, other: Any = None, step: tuple[Any, ...] | None = None) -> Any:
        """``_wrap``, for the str methods CPython answers with the very same object when nothing
        changed (``strip()`` of stripped text, ``s[:]``, ``s + ''``, a split that found no
        separator): ``self`` then, so ``is sameas`` answers as in the loader. ``other``: the
        other operand (its source wins over an input's); ``step``: what this derivation did."""
        source = _stronger(self._wsrc, _taint(other)) or self._wsrc
        path = (*self._wpath, step) if step is not None and _is_input(source) else ()
        if isinstance(value, (list, tuple)):
            return type(value)(self if _unchanged(p, self) else _tainted_result(p, source) for p in value)
        if _unchanged(value, self) and source == self._wsrc:
            return self
        return Probe(value, source, path) if type(value) is str else _tainted_result(value, source)

    def __iter__(self) -> Any:  # content|first, content|list, for c in content: each character stays a Probe
        return (Probe(c, self._wsrc) for c in str.__iter__(self))

    def __contains__(self, other: Any) -> bool:
        _record(self._wsrc, "in", other, self._wpath)
        if isinstance(other, Probe) and other._wsrc != self._wsrc:
            _record(other._wsrc, "in a constant", self, other._wpath)
        return str.__contains__(self, other)

    def __eq__(self, other: object) -> bool:
        _record_both(self, "==", other)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _record_both(self, "!=", other)
        return str.__ne__(self, other)

    def __hash__(self) -> int:  # content as a dict key or set member: a lookup keyed on content
        _record(self._wsrc, "lookup", "a dict or set")
        return str.__hash__(self)

    def __getitem__(self, key: Any) -> Any:
        out = str.__getitem__(self, key)
        if isinstance(key, slice):
            return self._kept(out, step=("slice", *(_small_int(b) for b in (key.start, key.stop, key.step))))
        return self._wrap(out)

    def __add__(self, other: Any) -> Any:
        step = ("affix", "", other) if type(other) is str and len(other) <= 200 else None
        return self._kept(str.__add__(self, other), other, step)

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        step = ("affix", other, "") if type(other) is str and len(other) <= 200 else None
        return self._kept(str.__add__(other, self), other, step)

    def __mul__(self, other: Any) -> Any:
        return self._kept(str.__mul__(self, other))

    __rmul__ = __mul__

    def __mod__(self, other: Any) -> Any:
        return self._kept(str.__mod__(self, other))

    def encode(self, *args: Any, **kwargs: Any) -> Any:  # content as bytes stays tainted
        return ProbeBytes(str.encode(self, *args, **kwargs), self._wsrc)


def _small_int(value: Any) -> int | None:
    """A slice bound as a demand's step: an int that fits 32 bits, else None (unknown)."""
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 31) < value < (1 << 31):
        return int.__index__(value)
    return None


def _unchanged(value: Any, probe: Probe) -> bool:
    return type(value) is str and str.__eq__(value, probe) is True


def _comparing(name: str) -> Any:
    """``startswith``/``find``/``<``...: the constant argument is recorded; a position or count
    is a number derived from content whose tests against -1/0 stand for the argument's test."""

    def method(self: Probe, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get("prefix", kwargs.get("suffix", kwargs.get("sub")))
        for arg in first if isinstance(first, tuple) else (first,):
            _record(self._wsrc, name, arg, self._wpath)
        out = getattr(str, name)(self, *args, **kwargs)
        basis = _constant(first)
        return _number(out, self._wsrc, "number", basis)

    return method


def _deriving(name: str) -> Any:
    keeps = name in KEEPING
    step = (name,) if name in STEPS else None

    def method(self: Probe, *args: Any, **kwargs: Any) -> Any:
        out = getattr(str, name)(self, *args, **kwargs)
        if step is not None and _is_input(self._wsrc) and all(a is None for a in args) and type(out) is str:
            return Probe(out, self._wsrc, (*self._wpath, step))
        return self._kept(out) if keeps else self._wrap(out)

    return method


def _rewriting(name: str) -> Any:
    """``replace``/``split``/``partition``/``removeprefix``: what the template cuts content at or
    rewrites in it is recorded (markup and whitespace are what vendors cut at); the pieces stay Probes."""

    def method(self: Probe, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get("sep", kwargs.get("old", kwargs.get("prefix", kwargs.get("suffix"))))
        if first is not None:
            _record(self._wsrc, name, first, self._wpath)
        return self._kept(getattr(str, name)(self, *args, **kwargs))

    return method


def _testing(name: str) -> Any:
    """``isdigit``/``istitle``...: a test of content's letters is content-keyed (recorded by name)."""

    def method(self: Probe) -> bool:
        _note(self._wsrc, name, f"a str.{name}() test")
        return bool(getattr(str, name)(self))

    return method


COMPARING = ("startswith", "endswith", "find", "rfind", "index", "rindex", "count", "__lt__", "__gt__", "__le__",
             "__ge__")  # fmt: skip
REWRITING = ("replace", "split", "rsplit", "partition", "rpartition", "removeprefix", "removesuffix")
DERIVING = ("lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "casefold", "swapcase", "ljust",
            "rjust", "center", "zfill", "expandtabs", "translate", "join", "splitlines", "format",
            "format_map")  # fmt: skip
STEPS = frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "casefold", "swapcase"})
KEEPING = frozenset({"strip", "lstrip", "rstrip", "ljust", "rjust", "center", "zfill", "expandtabs", "splitlines"})
TESTING = (
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isprintable",
    "istitle",
    "isupper",
)  # fmt: skip  (isspace is an emptiness test, like strip() == '')

for _name in COMPARING:
    setattr(Probe, _name, _comparing(_name))
for _name in REWRITING:
    setattr(Probe, _name, _rewriting(_name))
for _name in DERIVING:
    setattr(Probe, _name, _deriving(_name))
for _name in TESTING:
    setattr(Probe, _name, _testing(_name))


def _probe_markup() -> type:
    """A Probe that is also ``Markup`` (content|e): escaping behaves as markupsafe's, the taint stays."""
    from markupsafe import Markup

    class ProbeMarkup(Markup, Probe):  # Markup first: its escaping methods win, Probe records the rest
        def __new__(cls, value: Any = "", source: str = "content") -> ProbeMarkup:
            obj = Markup.__new__(cls, value)
            obj._wsrc = getattr(value, "_wsrc", source)
            return obj

    for name in REWRITING:
        if hasattr(Markup, name):
            setattr(ProbeMarkup, name, _recording_markup(name, getattr(Markup, name)))
    return ProbeMarkup


def _recording_markup(name: str, markup_method: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            _record(self._wsrc, name, args[0])
        return markup_method(self, *args, **kwargs)

    return method


class _Number:
    """What ProbeInt and ProbeFloat share: a number derived from content (its length, ``|int``,
    arithmetic on those) or from the clock, recording what the template compares it with.

    ``_wkind``: ``length`` (a length: 0 and 1 are emptiness tests) or ``number``; ``_wbasis``:
    the constant a position or count was taken of (``find('</think>')``): its tests against -1
    and 0 are that constant's membership test."""

    _wsrc = "content"
    _wkind = "length"
    _wbasis: str | None = None
    _wshift: int | None = None  # a count of an input is its length minus this (``messages[1:]|length``, ``- 1``)
    _worig: Any = None  # the plain number the loader would hold (``is sameas`` compares these)

    def _plain(self) -> int | float:
        raise NotImplementedError

    def __hash__(self) -> int:  # a length or number as a dict key: a lookup keyed on content
        _note(self._wsrc, "lookup", "a dict or set")
        return hash(self._plain())

    def __bool__(self) -> bool:
        if self._wkind != "length":
            self._compared("truth", 0)
        return bool(self._plain())

    def _compared(self, name: str, other: Any) -> None:
        """Records a comparison with a number, tainted or not (a tainted one by the plain value
        the loader would compare with: ``us > us * 0`` is a test against 0)."""
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return
        if isinstance(other, _Number):
            other = other._plain()
        if self._wbasis is not None and other in (-1, 0):
            _note(self._wsrc, f"{name} of a position", self._wbasis)
        elif self._wshift and _is_input(self._wsrc) and type(other) is int:  # the bound on the input itself
            _note(self._wsrc, f"{self._wkind} {name.strip('_')}", _shown_number(other + self._wshift))
        else:
            _note(self._wsrc, f"{self._wkind} {name.strip('_')}", _shown_number(other))


def _shown_number(value: int | float) -> str:
    """``value`` as a record's constant; a huge int by its size (its repr may exceed Python's
    digit limit, and a comparison must never fail in the sandbox only)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return repr(value + 0)[:40]


class ProbeInt(_Number, int):
    """An int derived from a tainted value (content's length, ``|int`` of content or of the clock)."""

    def __new__(cls, value: int, source: str = "content", kind: str = "length", basis: str | None = None) -> ProbeInt:
        obj = int.__new__(cls, value)
        obj._wsrc, obj._wkind, obj._wbasis, obj._worig = source, kind, basis, value
        return obj

    def _plain(self) -> int:
        return self._worig  # the object the loader would hold (for is sameas)


class ProbeFloat(_Number, float):
    """A float derived from a tainted value (``/`` on a length, ``|float`` of content)."""

    def __new__(cls, value: float, source: str = "content", kind: str = "number") -> ProbeFloat:
        obj = float.__new__(cls, value)
        obj._wsrc, obj._wkind, obj._worig = source, kind, value
        return obj

    def _plain(self) -> float:
        return self._worig


def _number(value: Any, source: str, kind: str = "number", basis: str | None = None) -> Any:
    """``value`` tainted when it is a number (bools cannot be: their tests record where they are made)."""
    if isinstance(value, (bool, _Number)):
        return value
    if isinstance(value, int):
        return ProbeInt(value, source, kind, basis)
    if isinstance(value, float):
        return ProbeFloat(value, source, kind)
    return value


SHIFTS = {"__sub__": 1, "__add__": -1, "__radd__": -1}  # how an input count's offset moves per operator
REFLECTED = {"__eq__": "__eq__", "__ne__": "__ne__", "__lt__": "__gt__", "__gt__": "__lt__", "__le__": "__ge__",
             "__ge__": "__le__"}  # fmt: skip


def _number_comparing(name: str, base: type) -> Any:
    def method(self: Any, other: Any) -> Any:
        self._compared(name, other)
        if isinstance(other, _Number) and other._wsrc != self._wsrc:  # Python asks the left one only
            other._compared(REFLECTED[name], self)
        return getattr(base, name)(self, other)

    return method


def _number_deriving(name: str, base: type) -> Any:
    def method(self: Any, *args: Any) -> Any:
        out = getattr(base, name)(self, *args)
        if out is NotImplemented:
            return out
        source = _stronger(self._wsrc, _taint(args[0]) if args else None)
        if isinstance(out, tuple):  # divmod
            return tuple(_number(x, source) for x in out)  # type: ignore[arg-type]
        result = _number(out, source)  # type: ignore[arg-type]
        if _is_input(source) and isinstance(result, ProbeInt) and name in SHIFTS and args:
            shift = _small_int(args[0]) if not isinstance(args[0], _Number) else None
            if shift is not None and source == self._wsrc and self._wshift is not None:  # count - 1: tests of count
                result._wshift = self._wshift + SHIFTS[name] * shift
        return result

    return method


NUMBER_COMPARING = ("__eq__", "__ne__", "__lt__", "__gt__", "__le__", "__ge__")
ARITHMETIC = ("add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "divmod", "and", "or", "xor", "lshift",
              "rshift")  # fmt: skip
NUMBER_DERIVING = (
    *(f"__{p}{op}__" for op in ARITHMETIC for p in ("", "r")),
    *("__neg__", "__pos__", "__abs__", "__invert__", "__round__", "__trunc__", "__floor__", "__ceil__"),
)
for _cls, _base in ((ProbeInt, int), (ProbeFloat, float)):
    for _name in NUMBER_COMPARING:
        setattr(_cls, _name, _number_comparing(_name, _base))
    for _name in NUMBER_DERIVING:
        if hasattr(_base, _name):
            setattr(_cls, _name, _number_deriving(_name, _base))


class ProbeBytes(bytes):
    """Tainted bytes (``content.encode()``): comparisons record their other side as text,
    ``decode()`` gives a Probe back, items are tainted numbers, derived bytes stay ProbeBytes."""

    _wsrc = "content"

    def __new__(cls, value: bytes, source: str = "content") -> ProbeBytes:
        obj = super().__new__(cls, value)
        obj._wsrc = source
        return obj

    def __eq__(self, other: object) -> bool:
        _record(self._wsrc, "==", other)
        return bytes.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        _record(self._wsrc, "!=", other)
        return bytes.__ne__(self, other)  # type: ignore[no-any-return]

    def __contains__(self, other: Any) -> bool:
        _record(self._wsrc, "in", other)
        return bytes.__contains__(self, other)

    def __hash__(self) -> int:
        _note(self._wsrc, "lookup", "a dict or set")
        return bytes.__hash__(self)

    def __getitem__(self, key: Any) -> Any:
        return _tainted_result(bytes.__getitem__(self, key), self._wsrc)

    def __iter__(self) -> Any:
        return (ProbeInt(b, self._wsrc, "number") for b in bytes.__iter__(self))

    def __add__(self, other: Any) -> Any:
        return ProbeBytes(bytes.__add__(self, other), self._wsrc)

    def __radd__(self, other: Any) -> Any:
        return ProbeBytes(bytes(other) + bytes(self), self._wsrc) if isinstance(other, bytes) else NotImplemented

    def __mul__(self, other: Any) -> Any:
        return ProbeBytes(bytes.__mul__(self, other), self._wsrc)

    __rmul__ = __mul__

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        return Probe(bytes.decode(self, *args, **kwargs), self._wsrc)


def _bytes_method(name: str, comparing: bool) -> Any:
    def method(self: ProbeBytes, *args: Any, **kwargs: Any) -> Any:
        if comparing and args:
            for arg in args[0] if isinstance(args[0], tuple) else (args[0],):
                _record(self._wsrc, name, arg)
        return _tainted_result(getattr(bytes, name)(self, *args, **kwargs), self._wsrc)

    return method


BYTES_COMPARING = (*COMPARING, *REWRITING)
for _name in BYTES_COMPARING:
    setattr(ProbeBytes, _name, _bytes_method(_name, True))
for _name in ("lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "swapcase", "hex", "join",
              "ljust", "rjust", "center", "zfill", "translate", "splitlines", "expandtabs"):  # fmt: skip
    setattr(ProbeBytes, _name, _bytes_method(_name, False))


class TaintedList(list):  # type: ignore[type-arg]
    """A list made of a tainted string's pieces (``content|list``, ``content|batch(n)``): its
    length is a tainted number and a loop over it counts content."""

    _wsrc = "content"
    _wshift = 0  # a slice of an input list: how many of the input's items it left out


def _tainted_list(items: Any, source: str) -> TaintedList:
    """``items`` (pieces of a tainted value, or lists of them) as a TaintedList of tainted pieces."""
    out = TaintedList(_tainted_list(i, source) if isinstance(i, list) else _tainted_result(i, source) for i in items)
    out._wsrc = source
    return out


TAINTED = (Probe, _Number, ProbeBytes)
SEQUENCES = (Probe, ProbeBytes, TaintedList)  # a loop over one counts content


def _taint(value: Any) -> str | None:
    """The source of ``value`` when it is a tainted string or number, else None."""
    return value._wsrc if isinstance(value, TAINTED) else None


def _taint_in(values: Any, depth: int = 3) -> str | None:
    """The source of the first tainted value among ``values``, looking ``depth`` levels into
    lists, tuples and dict values (the first 64 items of each: a bound on the cost); a content
    (clock, environment) source before an input's (:func:`_stronger`)."""
    found: str | None = None
    for i, value in enumerate(values):
        if i >= 64:
            break
        if isinstance(value, TAINTED):
            found = _stronger(found, str(value._wsrc))
        elif depth > 1 and isinstance(value, (list, tuple, dict)):
            found = _stronger(found, _taint_in(value.values() if isinstance(value, dict) else value, depth - 1))
        if found is not None and not _is_input(found):
            return found
    return found


def _tainted_result(value: Any, source: str) -> Any:
    """``value`` (derived from a tainted input) as a Probe, a tainted number, or a list of Probes."""
    if isinstance(value, str):
        if isinstance(value, Probe):
            return value
        if hasattr(value, "__html__"):
            return PROBE_MARKUP[0](value, source)
        return Probe(value, source)
    if isinstance(value, list):
        return [_tainted_result(v, source) if isinstance(v, (str, bytes)) else v for v in value]
    if isinstance(value, tuple):
        return tuple(_tainted_result(v, source) if isinstance(v, (str, bytes)) else v for v in value)
    if isinstance(value, bytes) and not isinstance(value, ProbeBytes):
        return ProbeBytes(value, source)
    return _number(value, source)


PROBE_MARKUP: list[Any] = [Probe]  # ProbeMarkup once markupsafe is importable (in _environment)


class _Spy:
    """An iterator passed to ``join`` in place of ``inner`` (never handed back to the template):
    notes whether it yielded a tainted value."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._source: str | None = None

    def __iter__(self) -> _Spy:
        return self

    def __next__(self) -> Any:
        value = next(self._inner)
        if self._source is None:
            self._source = _taint_in((value,))
        return value


FILTER_STEPS = {
    "lower": ("lower",),
    "upper": ("upper",),
    "trim": ("strip",),
    "title": ("title",),
    "capitalize": ("capitalize",),
}  # fmt: skip  (filters a demand's path names)


def _input_keys(items: list[Any], label: str) -> list[Any]:
    """``items`` (an input dict's keys, or its (key, value) pairs) with each key a Probe of source
    ``input:key:<label>``: a test of a key's name or length is a demand for a field so named."""
    source = f"{INPUT}key:{label}"
    return [
        (Probe(i[0], source), *i[1:]) if isinstance(i, tuple) and i and type(i[0]) is str
        else Probe(i, source) if type(i) is str else i
        for i in items
    ]  # fmt: skip


KEY_FILTERS = ("list", "dictsort", "items")  # filters that yield a dict's keys (or items) in Python


def _tainting(func: Any, numbers: bool = False, pieces: bool = False, name: str = "") -> Any:
    """``func`` (a filter or join helper) whose string result stays tainted when an input was
    (a string or number, or one inside the lists and dicts passed); with ``numbers``, a number
    it computes from a tainted string or number (``|int``, ``|abs``, ``|wordcount``) is tainted
    too; with ``pieces``, the sequence it makes of a tainted string is a :class:`TaintedList`.
    Numbers computed from containers (``messages|length``) are the conversation's shape, not content."""

    skip = 1 if hasattr(func, "jinja_pass_arg") else 0  # the context or eval context jinja passes first
    step = FILTER_STEPS.get(name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = func(*args, **kwargs)
        value = args[skip] if len(args) > skip else None
        # content|list, content|batch(n): its pieces (an input list's pieces stay what the loader gives)
        if pieces and isinstance(value, SEQUENCES) and not isinstance(out, (str, bytes)) and not _is_input(value._wsrc):
            return _tainted_list(out, value._wsrc)
        label = INPUT_DICTS.get(id(value)) or INPUT_VIEWS.get(id(value)) if name in KEY_FILTERS else None
        if label and isinstance(out, list):
            return _input_keys(out, label)  # an input dict's keys (or its view's items), as the template tests them
        if label and name == "items":  # an iterator, as the loader's: its pairs' keys as the template tests them
            return iter(_input_keys(list(out), label))
        if step is not None and isinstance(value, Probe) and _is_input(value._wsrc) and type(out) is str:
            return Probe(out, value._wsrc, (*value._wpath, step))  # (role|lower) == 'x': a step of its path
        if isinstance(out, str) and not isinstance(out, Probe):
            source = _taint_in((*args, *kwargs.values()))
            return _tainted_result(out, source) if source else out
        if numbers and isinstance(out, (int, float)) and not isinstance(out, (bool, _Number)):
            value = next((a for a in args[:2] if isinstance(a, TAINTED)), None)
            return out if value is None else _number(out, value._wsrc, getattr(value, "_wkind", "number"))
        return out

    if hasattr(func, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


def _single_piece(args: Any, out: Any) -> Probe | None:
    """The Probe a join of one piece returned (CPython returns the piece itself), else None."""
    for arg in args:
        if isinstance(arg, (list, tuple)) and len(arg) == 1 and type(arg[0]) is Probe and _unchanged(out, arg[0]):
            return arg[0]
    return None


def _affixed(pieces: Any, out: str) -> Probe | None:
    """``x ~ '!'`` (``'a' ~ x ~ 'b'``): one input Probe joined with constant strings keeps its
    path, with the step ``("affix", before, after)`` (a demand's value is the constant cut)."""
    if not isinstance(pieces, (tuple, list)) or len(pieces) > 16:
        return None
    inputs = [i for i, p in enumerate(pieces) if isinstance(p, Probe)]
    if len(inputs) != 1 or not all(type(p) is str for i, p in enumerate(pieces) if i != inputs[0]):
        return None
    at, probe = inputs[0], pieces[inputs[0]]
    before, after = "".join(pieces[:at]), "".join(pieces[at + 1 :])
    if len(before) + len(after) > 200 or not _is_input(probe._wsrc):
        return None
    return Probe(out, probe._wsrc, (*probe._wpath, ("affix", before, after)))


def _joining(func: Any) -> Any:
    """The ``join`` filter and jinja's ``~``: an iterator of tainted pieces joins into a Probe."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        spies = [_Spy(a) if hasattr(a, "__next__") else a for a in args]
        out = func(*spies, **kwargs)
        single = _single_piece(spies, out)
        if single is not None:
            return single
        source = _taint_in((*spies, *kwargs.values())) or next((a._source for a in spies if isinstance(a, _Spy)
                                                                 and a._source), None)  # fmt: skip
        if _is_input(source) and type(out) is str and len(args) == 1 and not kwargs:
            return _affixed(args[0], out) or _tainted_result(out, source)  # type: ignore[arg-type]
        return _tainted_result(out, source) if source and isinstance(out, str) else out

    if hasattr(func, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


def _measuring(func: Any) -> Any:
    """The ``length``/``count`` filter: the length of a Probe, ProbeBytes or TaintedList is a :class:`ProbeInt`."""

    def wrapped(value: Any, *args: Any, **kwargs: Any) -> Any:
        out = func(value, *args, **kwargs)
        if isinstance(value, dict) and id(value) in INPUT_PATHS and type(out) is int:  # an input dict's size
            return ProbeInt(out, f"{INPUT}count:at:{INPUT_PATHS[id(value)]}")
        if not (isinstance(value, SEQUENCES) and isinstance(out, int)):
            return out
        length = ProbeInt(out, value._wsrc)
        length._wshift = getattr(value, "_wshift", 0)  # a slice of an input list: its tests are of the input
        return length

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


def _sameas(value: Any, other: Any) -> bool:
    """``is sameas`` as the loader sees it: a tainted number is a fresh object only where a plain
    one would be (CPython shares the small ints), so lengths of short content are the same object.
    An identity test of content or a number derived from it with a string or number is recorded."""
    for a, b in ((value, other), (other, value)):
        if isinstance(a, TAINTED) and isinstance(b, (str, int, float)) and not isinstance(b, bool):
            _note(a._wsrc, "sameas", "an identity (is sameas) test")
            break
    value = value._plain() if isinstance(value, _Number) else value
    other = other._plain() if isinstance(other, _Number) else other
    return value is other


NUMBER_FILTERS = ("int", "float", "abs", "round", "wordcount")
PIECE_FILTERS = ("list", "batch", "slice", "reverse")  # the pieces of a tainted string, as many as its length


def _keep_taint(env: Any) -> None:
    """Taint survives ``~`` concatenation, macro and ``{% set %}`` block output (``concat``) and
    every filter; numbers survive the numeric filters; the length of content is a ProbeInt."""
    import jinja2.runtime

    jinja2.runtime.str_join = _joining(jinja2.runtime.str_join)  # the compiled code imports it
    jinja2.runtime.LoopContext = _counting_loop()  # type: ignore[misc, assignment]
    env.concat = _joining(env.concat)  # macro bodies, caller(), set blocks, filter blocks
    for name in list(env.filters):
        if name in ("length", "count"):
            env.filters[name] = _measuring(env.filters[name])
        elif name == "join":
            env.filters[name] = _joining(env.filters[name])
        else:
            env.filters[name] = _tainting(env.filters[name], name in NUMBER_FILTERS, name in PIECE_FILTERS, name)
    env.filters["replace"] = _replacing(env.filters["replace"])
    env.tests["sameas"] = _sameas
    for name in KIND_TESTS:
        env.tests[name] = _kind_test(name, env.tests[name])


KIND_TESTS = (
    "string",
    "mapping",
    "number",
    "integer",
    "float",
    "sequence",
    "iterable",
    "boolean",
    "none",
    "true",
    "false",
)  # fmt: skip  (what kind of value an input is: each kind is drawn once tested)


def _kind_test(name: str, test: Any) -> Any:
    """``x is <kind>`` on an input at a path (a string, number or dict labelled by where it is): a
    demand ``[input:at:<path>, kind, <kind>]`` for a value of that kind there, whatever it is now."""

    def wrapped(value: Any, *args: Any) -> bool:
        path = INPUT_PATHS.get(id(value)) if isinstance(value, dict) else None
        source = f"{INPUT}at:{path}" if path is not None else _taint(value)  # (never an Undefined's attribute)
        if isinstance(source, str) and source.startswith(f"{INPUT}at:"):
            _demand(source, "kind", name)
        return bool(test(value, *args))

    return wrapped


def _number_use(source: str, what: str) -> None:
    """A number derived from content sizes or picks template text (a repetition count, a slice
    bound, ``range()``): content-keyed output without a comparison."""
    _note(source, "number use", f"a number derived from it used as {what}")


def _after_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """What a sandboxed call made of tainted inputs: a str method of a constant string tested on
    content is recorded (``'abc'.startswith(content)``); a tainted number passed to ``range()``
    or a constant string's method is a number use; the result of a call with a tainted owner or
    argument stays tainted (``''.join([content])``, ``'{}'.format(content)``, ``content.ljust(0)``),
    a string when taint is anywhere in the arguments, a number or list only when the owner or an
    argument itself is tainted (``messages.index(message)`` is a position in the conversation)."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, dict) and args and getattr(func, "__name__", "") == "get":
        _lookup(owner, args[0])  # message.get('k'): a key asked for
    viewed = getattr(func, "__name__", "") in ("items", "keys")
    if viewed and isinstance(owner, dict) and id(owner) in INPUT_DICTS and len(INPUT_VIEWS) < 4096:
        INPUT_VIEWS[id(out)] = INPUT_DICTS[id(owner)]  # a loop over it yields the keys as Probes
        KEPT.append(out)  # alive for the render: its id names no other object meanwhile
    source = _stronger(_taint(owner), _taint_in(args) or _taint_in(kwargs.values()))
    if source is None:
        return out
    if isinstance(owner, str) and getattr(func, "__name__", "") == "join":
        single = _single_piece(args, out)
        if single is not None:
            return single
    if not isinstance(out, str):  # a number or list computed from a message dict is the shape, not content
        source = _taint(owner) or _taint_in((*args, *kwargs.values()), depth=1)
        if source is None:
            return out
    if _taint(owner) is None:
        name = str(getattr(func, "__name__", "a function"))
        numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, _Number)]
        if numbers and (name in ("range", "safe_range") or isinstance(owner, str)):
            _number_use(numbers[0]._wsrc, f"an argument of {name}()")
        if isinstance(out, bool) and isinstance(owner, str):
            _record(source, f"str.{name}", owner)
    return _tainted_result(out, source) if not isinstance(out, bool) else out


def _after_binop(operator: str, left: Any, right: Any, out: Any) -> Any:
    """``%`` formatting, ``*`` repetition and arithmetic keep the taint of their operands; a
    tainted number repeating a sequence is a number use."""
    source = _taint(left) or _taint(right)
    if source is None and operator == "%" and isinstance(right, (tuple, list, dict)):
        source = _taint_in((right,))
    if source is None:
        return out
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(n, _Number) and isinstance(seq, (str, list, tuple)):
                _number_use(n._wsrc, "a repetition count")
    return out if isinstance(out, bool) else _tainted_result(out, source)


DICT_ATTRIBUTES = frozenset(dir(dict))  # message.items, message.get: methods, not fields asked for


def _lookup(obj: Any, key: Any, attribute: bool = False) -> None:
    """A key looked up in a dict (``getattr``: ``attribute``): on an input dict (a message, a part,
    a tool, its parameters, a document), a key it lacks is a demand ``[input:key:<label>, key, name]``
    for a field so named (``message['meta' ~ 'data']``, ``message.get(k)``, ``k in message``);
    an input used as the key of another dict is a demand for each of its first 32 keys."""
    if not isinstance(obj, dict):
        return
    label = INPUT_DICTS.get(id(obj))
    if label is not None:
        if type(key) is str or isinstance(key, Probe):
            name = str.__str__(key)
            if not (attribute and name in DICT_ATTRIBUTES) and not dict.__contains__(obj, name):
                _demand(f"{INPUT}key:{label}", "key", name)
    elif isinstance(key, Probe) and _is_input(key._wsrc):
        for k in list(dict.keys(obj))[:32]:
            if type(k) is str or isinstance(k, Probe):
                _demand(key._wsrc, "==", str.__str__(k), key._wpath)


class _KeyLoop:
    """The iterator of a loop over an input dict or its ``items()``/``keys()``: the keys are
    Probes of source ``input:key:<label>`` (:func:`_input_keys`), the loop's length as the dict's."""

    def __init__(self, iterable: Any, label: str) -> None:
        self._inner, self._length, self._label = iter(iterable), len(iterable), label

    def __iter__(self) -> _KeyLoop:
        return self

    def __len__(self) -> int:
        return self._length

    def __next__(self) -> Any:
        return _input_keys([next(self._inner)], self._label)[0]


def _counted(items: list[Any], source: str) -> TaintedList:
    """``items`` (an input list: the messages, the tools, the documents, or a slice of one) as a
    TaintedList of ``source``: its length, and a loop's counters over it, count the input."""
    out = TaintedList(items)
    out._wsrc = source
    return out


def _index_use(obj: Any, key: Any) -> None:
    """A tainted number indexing or slicing template text or a list (not content itself) is a number use."""
    if isinstance(obj, Probe):
        return
    bounds = (key.start, key.stop, key.step) if isinstance(key, slice) else (key,)
    for bound in bounds:
        if isinstance(bound, _Number):
            _number_use(bound._wsrc, "an index or slice bound")
            return


LOADER = "transformers.utils.chat_template_utils"  # where the loader's globals live (their reprs name it)
LOADER_SCOPE = "_cached_compile_jinja_template.<locals>."


def _as_loader(obj: Any, name: str) -> Any:
    """``obj`` (a class or function) named as transformers names its template global ``name``; a
    class's methods too (``dict.fromkeys|string`` names the method by its qualified name)."""
    obj.__module__, obj.__name__, obj.__qualname__ = LOADER, name, LOADER_SCOPE + name
    for attr, value in vars(obj).items() if isinstance(obj, type) else ():
        if callable(value) and hasattr(value, "__qualname__"):
            value.__module__, value.__qualname__ = LOADER, f"{LOADER_SCOPE}{name}.{attr}"
    return obj


class _LoaderRepr(type):
    """The metaclass of the loader-parity globals: their string form is what transformers'
    shows, and it is a Probe of source ``environment`` (a template comparing it with a constant
    is telling the scanner from the loader)."""

    def __repr__(cls) -> str:
        return Probe(type.__repr__(cls), "environment")


class _Global:
    """A callable template global whose string form reads as transformers' function of that name."""

    def __init__(self, func: Any, name: str) -> None:
        self._func, self._name = func, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._func(*args, **kwargs)

    def __repr__(self) -> str:
        return Probe(f"<function {LOADER_SCOPE}{self._name} at 0x{id(self):x}>", "environment")


def _loader_globals() -> dict[str, Any]:
    """``dict`` and ``namespace`` as transformers 5 binds them (a callable ``TemplateDict``
    instance, a ``Namespace`` subclass refusing ``_`` names), with the same string forms."""
    import jinja2
    import jinja2.utils

    class TemplateDict(metaclass=_LoaderRepr):
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

        def __repr__(self) -> str:
            return Probe(f"<{LOADER}.{LOADER_SCOPE}TemplateDict object at 0x{id(self):x}>", "environment")

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
                f"{name!r}. Please rename the attribute."
            )

    class TemplateNamespace(jinja2.utils.Namespace, metaclass=_LoaderRepr):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, _loop_taint(value))

    namespace = _as_loader(TemplateNamespace, "TemplateNamespace")
    return {"dict": _as_loader(TemplateDict, "TemplateDict")(), "namespace": namespace}


LIVE_LOOPS: list[Any] = []  # the content loops running (a loop left by {% break %} stays until the render ends)


class _ContentLoop:
    """The iterator of a loop over content (its characters, pieces or bytes): while it runs, what
    the template stores in a namespace is tainted (``{% set ns.n = ns.n + 1 %}`` counts content),
    and ``loop.index``/``loop.length`` are tainted lengths (:class:`_CountingLoop`). Left by a
    ``break``, it stays live: a false positive at worst, never a miss."""

    def __init__(self, iterable: Any, source: str) -> None:
        self._inner, self._items, self._wsrc = iter(iterable), iterable, source

    def __iter__(self) -> _ContentLoop:
        return self

    def __len__(self) -> int:
        return len(self._items)

    def __next__(self) -> Any:
        if self not in LIVE_LOOPS:
            LIVE_LOOPS.append(self)
        try:
            return next(self._inner)
        except StopIteration:
            LIVE_LOOPS.remove(self)
            raise


def _loop_taint(value: Any) -> Any:
    """``value`` as a namespace stores it: tainted when a content loop is running."""
    if not LIVE_LOOPS or isinstance(value, (bool, *TAINTED)) or not isinstance(value, (str, bytes, int, float)):
        return value
    sources = [loop._wsrc for loop in LIVE_LOOPS]
    return _tainted_result(value, next((x for x in reversed(sources) if not _is_input(x)), sources[-1]))


def _counting_loop() -> type:
    """Jinja's ``LoopContext``, except that over a :class:`_ContentLoop` its counters are tainted lengths."""
    import jinja2.runtime

    base: Any = jinja2.runtime.LoopContext

    class CountingLoop(base):  # type: ignore[misc]
        def __next__(self) -> Any:
            out = super().__next__()
            if isinstance(self._iterable, _ContentLoop):
                self.index0 = self._counted(int(self.index0), 1)  # type: ignore[has-type]
            return out

        def _counted(self, n: int, below: int = 0) -> int:
            """``n`` as a tainted count; ``below``: the counter stays this far under the length
            (index0, revindex0: one), so a test of it bounds the input at the bound plus that."""
            if not isinstance(self._iterable, _ContentLoop):
                return n
            out = ProbeInt(int(n), self._iterable._wsrc)
            if below:
                out._wshift = below
            return out

        def cycle(self, *args: Any) -> Any:
            """``loop.cycle(a, b, ...)``: over an input, its i-th argument shows once the input is
            i items long, a demand for one as long as there are arguments."""
            if isinstance(self._iterable, _ContentLoop) and _is_input(self._iterable._wsrc) and len(args) > 1:
                _demand(self._iterable._wsrc, "length ge", str(len(args)))
            return super().cycle(*args)

        length = property(lambda self: self._counted(base.length.fget(self)))
        index = property(lambda self: self._counted(base.index.fget(self)))
        revindex = property(lambda self: self._counted(base.revindex.fget(self)))
        revindex0 = property(lambda self: self._counted(base.revindex0.fget(self), 1))

    return CountingLoop


BRANCHES: list[list[Any]] = []  # the compiled template's branches: [line, what, exempt] (index = number)
REACHED: set[int] = set()  # the numbers of the branches that ran in this request's renders
LAST_BRANCH = [-1]  # the branch whose body ran last (where a test now running sits)
TRUTHY: dict[str, set[str]] = {}  # an undefined name -> the places its truth was asked (per request)
MAX_TRUTHY_PLACES = 4
MAX_BRANCHES = 4096  # branches numbered per template; one past it is reported, never judged clean
LOADER_NAMES = frozenset({"strftime_now", "raise_exception", "range", "dict", "lipsum", "cycler", "joiner",
                          "namespace"})  # fmt: skip
"""Names whose value is fixed for one tokenizer under the loader (with every ``*_token``): a branch
they alone decide is taken the same way in every render, and one never taken is dead code."""


def _constant_tests(tests: list[Any], assigned: set[str]) -> bool:
    """Whether ``tests`` read nothing but loader constants (no input, kwarg or template variable)."""
    from jinja2 import nodes

    names = [t for test in tests for t in (test, *test.find_all(nodes.Name)) if isinstance(t, nodes.Name)]
    return all((n.name in LOADER_NAMES or n.name in LOADER_TOKENS) and n.name not in assigned for n in names)


STANDARD_TOKENS = frozenset(
    {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}
)
LOADER_TOKENS: set[str] = set(STANDARD_TOKENS)
"""The ``*_token`` names the loader fixes for this tokenizer (the standard ones, set or left
undefined, and the ones the request's context sets): another ``*_token`` name is a caller's
keyword argument, an input."""


SELECTING = frozenset({"split", "rsplit", "partition", "rpartition", "startswith", "endswith", "strip", "lstrip",
                       "rstrip", "find", "rfind", "index", "rindex", "count", "removeprefix", "removesuffix",
                       "replace", "get"})  # fmt: skip
"""Methods whose arguments select what to keep (``replace``: its first), never written."""
MAX_LITERALS = 8  # literal texts kept per branch (each cut to LITERAL_CHARS)
LITERAL_CHARS = 200


def _literals(body: list[Any]) -> list[str]:
    """The text a branch can write from its own literals: its template data and the string
    constants of its expressions, except keys, names and what tests compare (``m['role']``,
    ``role == 'tool'``): those select, they are not written."""
    from jinja2 import nodes

    skipped: set[int] = set()
    for node in body:
        for sub in (node, *node.find_all((nodes.Getitem, nodes.Compare, nodes.Test, nodes.Call, nodes.Filter))):
            if isinstance(sub, nodes.Getitem):
                skipped.add(id(sub.arg))
            elif isinstance(sub, (nodes.Compare, nodes.Test)):
                skipped.update(id(c) for c in sub.find_all(nodes.Const))
            elif isinstance(sub, nodes.Call) and isinstance(sub.node, nodes.Getattr) and sub.node.attr in SELECTING:
                skipped.update(id(a) for a in sub.args[: 1 if sub.node.attr == "replace" else None])
            elif isinstance(sub, nodes.Filter) and sub.name in ("replace", "trim", "indent"):
                skipped.update(id(a) for a in sub.args[:1])
    made = [c for node in body for c in (node, *node.find_all(nodes.Call)) if isinstance(c, nodes.Call)]
    out: list[str] = [  # dict(Say_X=1): the names of a dict made from keywords are its keys, text
        k.key for c in made if isinstance(c.node, nodes.Name) and c.node.name == "dict" for k in c.kwargs
    ][:MAX_LITERALS]
    for node in body:
        for sub in (node, *node.find_all((nodes.TemplateData, nodes.Const))):
            value = sub.data if isinstance(sub, nodes.TemplateData) else getattr(sub, "value", None)
            for text in _const_texts(value) if id(sub) not in skipped else ():
                if text.strip() and len(out) < MAX_LITERALS:
                    out.append(text.strip()[:LITERAL_CHARS])
    return out


def _const_texts(value: Any, depth: int = 0) -> list[str]:
    """The strings a constant can write: itself, or the items of a folded list and the values of
    a folded dict (``{true: 'text'}[test]``: jinja folds the literal before the code is written)."""
    if isinstance(value, str):
        return [value]
    if depth > 4 or not isinstance(value, (list, tuple, dict)):
        return []
    items = value.values() if isinstance(value, dict) else value
    return [t for item in list(items)[:MAX_LITERALS] for t in _const_texts(item, depth + 1)]


MARKUP_CONSTANT = re.compile(r"\s*(?:<[^<>\s]{1,48}>|\[/?[A-Z_]{2,24}\]|<\|[^|>\s]{0,48}\|>)+\s*\Z")
"""A constant that is tag markup only (``</think>``, ``<|im_end|>``, ``[TOOL_CALLS]``): what vendors
cut content at (the reasoning of earlier turns, a tool call)."""
MARKUP_METHODS = frozenset({"startswith", "endswith", "find", "rfind", "index", "split", "rsplit", "partition"})


def _markup_tests(tests: list[Any], taken: bool = False) -> bool:
    """Whether a branch's chain is decided by looks for tag markup (``'</think>' in content``,
    ``content.startswith('<tool_call>')``): every test is one, joined by and/or/not, or (``taken``:
    the branch runs when the last test holds) the last requires one among its ``and`` terms
    (Qwen3's reasoning cut from earlier turns). The
    branch is what the template does with markup in content, judged as the run-time taint judges
    those comparisons (not: a user writing markup is outside the conversations drawn)."""
    from jinja2 import nodes

    def markup(node: Any) -> bool:
        if isinstance(node, (nodes.And, nodes.Or)):
            return markup(node.left) and markup(node.right)
        if isinstance(node, nodes.Not):
            return markup(node.node)
        if isinstance(node, nodes.Compare) and len(node.ops) == 1 and node.ops[0].op in ("in", "notin"):
            sides: tuple[Any, ...] = (node.expr, node.ops[0].expr)
        elif isinstance(node, nodes.Compare):  # content.find('</think>') != -1
            return len(node.ops) == 1 and markup(node.expr)
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            sides = tuple(node.args[:1]) if node.node.attr in MARKUP_METHODS else ()
        else:
            return False
        return any(isinstance(c, nodes.Const) and isinstance(c.value, str) and MARKUP_CONSTANT.match(c.value)
                   for c in sides)  # fmt: skip

    def required(node: Any) -> bool:
        return markup(node) or (isinstance(node, nodes.And) and (required(node.left) or required(node.right)))

    return bool(tests) and (all(markup(t) for t in tests) or (taken and required(tests[-1])))


def _name_literals(tree: Any) -> dict[str, list[str]]:
    """Per variable, the literals the assignments to it hold (``{% set opener = '<|im_start|>system' %}``):
    a branch that writes the variable writes them."""
    from jinja2 import nodes

    out: dict[str, list[str]] = {}
    for assign in tree.find_all((nodes.Assign, nodes.AssignBlock)):
        target = assign.target
        value = [nodes.Output([assign.node])] if isinstance(assign, nodes.Assign) else assign.body
        if isinstance(target, nodes.Name) and len(out.setdefault(target.name, [])) < MAX_LITERALS:
            out[target.name] += _literals(value)[: MAX_LITERALS - len(out[target.name])]
    return out


def _raises_only(body: list[Any]) -> bool:
    """Whether a branch's body does nothing but call ``raise_exception`` (the render is refused)."""
    from jinja2 import nodes

    raised = False
    for stmt in body:
        for child in stmt.nodes if isinstance(stmt, nodes.Output) else [None]:
            if isinstance(child, nodes.TemplateData) and not child.data.strip():
                continue
            callee = child.node if isinstance(child, nodes.Call) else None
            if not (isinstance(callee, nodes.Name) and callee.name == "raise_exception"):
                return False
            raised = True
    return raised


def _slicing_generator() -> type:
    """Jinja's code generator, except that a slice (``x[a:b]``) not folded at compile time is
    taken by ``environment.sliced``, so a slice bound derived from content is seen (:func:`_index_use`),
    ``{{ x }}`` prints with ``environment.shown`` (``str`` that keeps the taint) instead of ``str``,
    and ``a in b`` is ``environment.contained(a, b)`` (content looked for in a constant is seen)."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, optimizeconst

    PREDICATES = (nodes.Compare, nodes.Test, nodes.Not)

    class SlicingGenerator(CodeGenerator):
        def _output_child_pre(self, node: Any, frame: Any, finalize: Any) -> None:
            if frame.eval_ctx.volatile or frame.eval_ctx.autoescape or finalize.src is not None:
                super()._output_child_pre(node, frame, finalize)
            else:  # {{ x }} inside a macro, a call or set block: its text stays tainted
                self.write("environment.shown(")

        def visit_Template(self, node: Any, frame: Any = None) -> None:
            BRANCHES.clear()  # numbered afresh for each template compiled
            self._assigned = {n.name for n in node.find_all(nodes.Name) if n.ctx in ("store", "param")}
            self._assigned |= {m.name for m in node.find_all(nodes.Macro)}  # a macro named raise_exception
            self._carrying = _name_literals(node)
            self._tests: set[int] = set()  # the predicates of branch tests (their branches are followed)
            self._statement: Any = None  # the output or assignment being written
            self._enclosing: dict[int, int] = {}  # id of a node -> the innermost branch it is in
            super().visit_Template(node, frame)

        def _branch(self, node: Any, what: str, exempt: bool, literals: list[str], inside: list[Any]) -> int:
            """The number of a new branch of ``node`` (``-1`` past :data:`MAX_BRANCHES`, counted
            as one more), holding the nodes ``inside``; its parent is the innermost branch ``node``
            is in (``-1``: none), so a branch in one that never ran is not judged twice."""
            if len(BRANCHES) > MAX_BRANCHES:
                return -1
            parent = self._enclosing.get(id(node), -1)
            BRANCHES.append([node.lineno, what, exempt, [] if exempt else literals, parent])
            number = len(BRANCHES) - 1
            for top in inside:
                for sub in (top, *top.find_all(nodes.Node)):
                    self._enclosing[id(sub)] = number
            return number

        def _written(self, body: list[Any]) -> list[str]:
            """The literals ``body`` writes, those of the variables it reads included."""
            read = {n.name for top in body for n in (top, *top.find_all(nodes.Name)) if isinstance(n, nodes.Name)}
            carried = (x for name in sorted(read) for x in self._carrying.get(name, ()))
            return [*_literals(body), *carried][:MAX_LITERALS]

        def _marked(self, body: list[Any], node: Any, what: str, exempt: bool) -> list[Any]:
            """``body`` with a first statement that records that it ran (see :data:`BRANCHES`)."""
            number = self._branch(node, what, exempt, self._written(body), body)
            reached = nodes.EnvironmentAttribute("reached").set_lineno(node.lineno)
            call = nodes.Call(reached, [nodes.Const(number)], [], None, None).set_lineno(node.lineno)
            return [nodes.ExprStmt(call).set_lineno(node.lineno), *body]

        def _guarded(self, body: list[Any], node: Any, what: str, tests: list[Any]) -> list[Any]:
            taken = what in ("if", "elif")  # runs when the last of ``tests`` holds (an else when none does)
            markup = _markup_tests(tests, taken)
            exempt = self._refuses(body) or _constant_tests(tests, self._assigned) or markup
            return self._marked(body, node, what, exempt)

        def _refuses(self, body: list[Any]) -> bool:
            """``body`` only calls the loader's ``raise_exception`` (not one the template defines)."""
            return _raises_only(body) and "raise_exception" not in self._assigned

        def visit_Macro(self, node: Any, frame: Any) -> None:
            body = self._marked(node.body, node, "macro body", True)  # never called: dead code, not judged
            node = copy.copy(node)
            node.body = body
            super().visit_Macro(node, frame)

        def visit_Call(self, node: Any, frame: Any, forward_caller: bool = False) -> None:
            if isinstance(node.node, nodes.EnvironmentAttribute) and node.node.name == "reached":
                self.write(f"environment.reached({node.args[0].value})")  # a marker: no sandboxed call
                return
            super().visit_Call(node, frame, forward_caller=forward_caller)

        def _followed(self, *tests: Any) -> None:
            for test in tests:
                if test is not None:
                    self._tests.update(id(x) for x in (test, *test.find_all(PREDICATES)))

        def _statement_visit(self, node: Any, frame: Any, visit: Any) -> None:
            outer, self._statement = self._statement, node
            try:
                visit(node, frame)
            finally:
                self._statement = outer

        def visit_Output(self, node: Any, frame: Any) -> None:
            self._statement_visit(node, frame, super().visit_Output)

        def visit_Assign(self, node: Any, frame: Any) -> None:
            self._statement_visit(node, frame, super().visit_Assign)

        def visit_AssignBlock(self, node: Any, frame: Any) -> None:
            self._statement_visit(node, frame, super().visit_AssignBlock)

        def _predicate(self, node: Any, frame: Any, visit: Any) -> None:
            """A test whose value is used as a value (``text * (n > 5)``, ``[a, b][x is y]``): both
            outcomes are branches of the statement it is in (its literals are what it can write)."""
            if id(node) in self._tests or self._statement is None or len(BRANCHES) > MAX_BRANCHES:
                visit(node, frame)
                return
            exempt, literals = _constant_tests([node], self._assigned), self._written([self._statement])
            true = self._branch(node, "test true", exempt, literals, [])
            false = self._branch(node, "test false", exempt, literals, [])
            self.write(f"environment.predicate({true}, {false}, ")
            visit(node, frame)
            self.write(")")

        def visit_Test(self, node: Any, frame: Any) -> None:
            self._predicate(node, frame, super().visit_Test)

        def visit_Not(self, node: Any, frame: Any) -> None:
            self._predicate(node, frame, super().visit_Not)

        def visit_If(self, node: Any, frame: Any) -> None:
            self._followed(node.test, *(e.test for e in node.elif_))
            tests = [node.test]
            bodies = [(node, "if", node.body, tests)]
            for elif_ in node.elif_:
                tests = [*tests, elif_.test]
                bodies.append((elif_, "elif", elif_.body, tests))
            marked = [self._guarded(body, node, what, t) for _n, what, body, t in bodies]
            marked.append(self._guarded(node.else_, node, "else" if node.else_ else "implicit else", tests))
            node = copy.copy(node)
            node.body, node.else_ = marked[0], marked[-1]
            node.elif_ = [copy.copy(e) for e in node.elif_]
            for elif_, body in zip(node.elif_, marked[1:-1], strict=True):
                elif_.body = body
            super().visit_If(node, frame)

        def visit_For(self, node: Any, frame: Any) -> None:
            self._followed(node.test)
            body = self._guarded(node.body, node, "loop body", [node.iter])
            else_ = self._guarded(node.else_, node, "loop else", [node.iter]) if node.else_ else node.else_
            node = copy.copy(node)  # the loop's iterable through environment.looped (a content loop is seen)
            node.body, node.else_ = body, else_
            looped = nodes.EnvironmentAttribute("looped").set_lineno(node.lineno)
            node.iter = nodes.Call(looped, [node.iter], [], None, None).set_lineno(node.lineno)
            super().visit_For(node, frame)

        def visit_CondExpr(self, node: Any, frame: Any) -> None:
            """As jinja writes it, with the test through ``environment.arms`` (which arm runs)."""
            self._followed(node.test)
            exempt = _constant_tests([node.test], self._assigned) or _markup_tests([node.test])
            arm, other_arm = [nodes.Output([node.expr1])], [nodes.Output([node.expr2])] if node.expr2 else []
            taken = exempt or self._refuses(arm) or _markup_tests([node.test], True)
            then = self._branch(node, "if-expression", taken, self._written(arm), [node.expr1])
            other = self._branch(
                node, "if-expression else", exempt, self._written(other_arm), [node.expr2] if node.expr2 else []
            )
            frame = frame.soft()
            self.write("(")
            self.visit(node.expr1, frame)
            self.write(f" if environment.arms({then}, {other}, ")
            self.visit(node.test, frame)
            self.write(") else ")
            if node.expr2 is not None:
                self.visit(node.expr2, frame)
            else:
                where = f"the inline if-expression on {self.position(node)}"
                self.write(f"cond_expr_undefined({where + ' evaluated to false and no else section was defined.'!r})")
            self.write(")")

        def _short_circuit(self, node: Any, frame: Any, op: str) -> None:
            """``left op right`` with the right side through ``environment.passed`` (that it ran)."""
            exempt = _constant_tests([node.left], self._assigned)
            number = self._branch(
                node, f"right side of {op}", exempt, self._written([nodes.Output([node.right])]), [node.right]
            )
            self.write("(")
            self.visit(node.left, frame)
            self.write(f" {op} environment.passed({number}, ")
            self.visit(node.right, frame)
            self.write("))")

        @optimizeconst
        def visit_And(self, node: Any, frame: Any) -> None:
            self._short_circuit(node, frame, "and")

        @optimizeconst
        def visit_Or(self, node: Any, frame: Any) -> None:
            self._short_circuit(node, frame, "or")

        @optimizeconst
        def visit_Compare(self, node: Any, frame: Any) -> None:
            self._predicate(node, frame, self._compare)

        def _compare(self, node: Any, frame: Any) -> None:
            if len(node.ops) != 1 or node.ops[0].op not in ("in", "notin"):
                return super().visit_Compare(node, frame)  # type: ignore[no-any-return]
            self.write("(not " if node.ops[0].op == "notin" else "(")
            self.write("environment.contained(")
            self.visit(node.expr, frame)
            self.write(", ")
            self.visit(node.ops[0].expr, frame)
            self.write("))")
            return None

        @optimizeconst
        def visit_Getitem(self, node: Any, frame: Any) -> None:
            if not isinstance(node.arg, nodes.Slice):
                return super().visit_Getitem(node, frame)  # type: ignore[no-any-return]
            self.write("environment.sliced(")
            self.visit(node.node, frame)
            self.write(", ")
            for i, part in enumerate((node.arg.start, node.arg.stop, node.arg.step)):
                self.write(", " if i else "")
                if part is None:
                    self.write("None")
                else:
                    self.visit(part, frame)
            self.write(")")
            return None

    return SlicingGenerator


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
            out = caller()  # what return_assistant_tokens_mask marks as the assistant's (trained on)
            if len(GENERATED) < MAX_GENERATED:
                GENERATED.append(str.__str__(out)[:GENERATED_CHARS])
            return out  # type: ignore[no-any-return]

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Recording(ImmutableSandboxedEnvironment):
        """Records private lookups; its calls, operators and subscripts keep the taint (:func:`_after_call`)."""

        intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            if attr.startswith("_") and len(PRIVATE) < 64:
                PRIVATE.append(attr[:80])
            return bool(super().is_safe_attribute(obj, attr, value))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            out = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
            return _after_call(__obj, args, kwargs, out)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            return _after_binop(operator, left, right, self.binop_table[operator](left, right))

        def getitem(self, obj: Any, argument: Any) -> Any:
            _index_use(obj, argument)
            _lookup(obj, argument)
            return super().getitem(obj, argument)

        def getattr(self, obj: Any, attribute: str) -> Any:
            _lookup(obj, attribute, attribute=True)
            return super().getattr(obj, attribute)

        def shown(self, value: Any) -> str:
            """``str(value)``, as jinja prints ``{{ value }}``, tainted when ``value`` was."""
            if type(value) is Probe:  # str() of an exact str is that very str in the loader
                return value
            source = _taint(value)
            return str(value) if source is None else _tainted_result(str(value), source)

        def looped(self, iterable: Any) -> Any:
            """A ``{% for %}`` loop's iterable: one over a tainted string or its pieces (or an
            input list: its counters count the input) is a :class:`_ContentLoop`; one over an
            input dict or its ``items()``/``keys()`` yields its keys as Probes (:func:`_input_keys`);
            anything else unchanged."""
            if isinstance(iterable, SEQUENCES):
                return _ContentLoop(iterable, iterable._wsrc)
            label = INPUT_VIEWS.get(id(iterable))
            if label is None and isinstance(iterable, dict):
                label = INPUT_DICTS.get(id(iterable))
            return _KeyLoop(iterable, label) if label else iterable

        def contained(self, needle: Any, haystack: Any) -> bool:
            """``needle in haystack``; a tainted needle looked for in a string is recorded with it
            (``content in 'constant'``: the other order is Probe.__contains__); a key looked for in
            an input dict, or an input looked for among a dict's keys, is a demand (:func:`_lookup`)."""
            if isinstance(needle, Probe) and isinstance(haystack, str):
                _record(needle._wsrc, "in a constant", haystack, needle._wpath)
            elif isinstance(haystack, dict):
                _lookup(haystack, needle)
            return needle in haystack

        def reached(self, number: int) -> str:
            """A branch's first statement: records that branch ``number`` ran."""
            REACHED.add(number)
            LAST_BRANCH[0] = number
            return ""

        def arms(self, then: int, other: int, test: Any) -> bool:
            """An if-expression's test: records which arm runs."""
            taken = bool(test)
            REACHED.add(then if taken else other)
            return taken

        def predicate(self, true: int, false: int, value: Any) -> Any:
            """A test used as a value: records which outcome it had."""
            REACHED.add(true if value else false)
            return value

        def passed(self, number: int, value: Any) -> Any:
            """The right side of ``and``/``or``: records that it was evaluated."""
            REACHED.add(number)
            return value

        def sliced(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
            """``obj[start:stop:step]`` as jinja's compiled code slices (errors raise); a slice of
            an input list still counts the input (``messages[1:]|length``)."""
            key = slice(start, stop, step)
            _index_use(obj, key)
            out = obj[key]
            if isinstance(obj, TaintedList) and _is_input(obj._wsrc) and type(out) is list:
                counted = _counted(out, obj._wsrc)
                counted._wshift = getattr(obj, "_wshift", 0) + len(obj) - len(out)
                return counted
            return out

    Recording.code_generator_class = _slicing_generator()

    PROBE_MARKUP[0] = _probe_markup()

    class Undefined(jinja2.Undefined):  # the loader's, named and shown as it is
        """jinja's default ``Undefined``, except that the truth of a top-level name the loader
        left undefined is a demand for a keyword argument of that name set true (Qwen2-VL's
        ``add_vision_id``, read only where an image is): the next round draws it so, in the shape
        of the render it was first read in at that place (line and branch)."""

        __slots__ = ()

        def __bool__(self) -> bool:
            name = self._undefined_name
            if self._undefined_obj is jinja2.utils.missing and isinstance(name, str) and len(name) <= 80:
                where = f"line {_template_line()} branch {LAST_BRANCH[0]}"  # per place: its own shape
                if len(TRUTHY.setdefault(name, set()) | {where}) <= MAX_TRUTHY_PLACES:
                    TRUTHY[name].add(where)
                    _demand(f"{INPUT}kwarg:{name}", "truthy", where)
            return False

    env = Recording(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols], undefined=Undefined
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _Global(raise_exception, "raise_exception")
    # As transformers: a naive datetime's strftime (so '%Z' and '%z' are '', '%f' is microseconds).
    env.globals["strftime_now"] = _Global(_strftime_now, "strftime_now")
    env.globals.update(_loader_globals())
    _keep_taint(env)
    return env


NOW = [1767225600.0]
CLOCK = [0, 0, 0]  # the render's first instant (µs since the epoch), time.monotonic_ns() then, the last reading


def _start_clock() -> None:
    """Starts the render's clock at NOW plus a sub-second part taken from the real clock (under half
    a second, so a date render reads the second it asks for): like transformers' ``datetime.now()``,
    readings have real microseconds and advance between calls."""
    base = round(NOW[0] * 1_000_000) + (time.time_ns() // 1000) % 500_000
    CLOCK[:] = [base, time.monotonic_ns(), base - 1]


def _strftime_now(fmt: Any) -> Probe:
    """The ``strftime_now`` global: the render's clock formatted, a Probe of source ``date``
    (no source text: two readings compared are a timing test, recorded)."""
    return Probe(_naive_now().strftime(str(fmt)), "date")


def _naive_now() -> datetime.datetime:
    """The render's clock (:func:`_start_clock`, from ``NOW``, set per request) as the naive datetime
    transformers' strftime_now formats; each reading later than the last by at least a microsecond."""
    micros = max(CLOCK[0] + (time.monotonic_ns() - CLOCK[1]) // 1000, CLOCK[2] + 1)
    CLOCK[2] = micros
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)


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
        _start_clock()
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


def _collect_sources(value: Any) -> None:
    """Adds every content Probe under ``value`` (a render's tainted messages and documents) to SOURCES."""
    if isinstance(value, Probe) and not _is_input(value._wsrc):
        SOURCES.update((str.__str__(value), str.strip(value)))  # a message's text, and trimmed
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_sources(item)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_sources(item)


def _label(value: Any, label: str, fields: dict[str, str]) -> Any:
    """``value`` (a dict of the render's inputs) registered as an input dict ``label`` (its missing
    keys asked for are demands), with each string under a key of ``fields`` a Probe of that source."""
    if not isinstance(value, dict):
        return value
    INPUT_DICTS[id(value)] = label
    for key, source in fields.items():
        if type(value.get(key)) is str:
            value[key] = Probe(value[key], INPUT + source)
    return value


def _at_step(path: str, key: str) -> str:
    return f"{path}/{'*' if path.rsplit('/', 1)[-1] in FREE_KEYED else key}"


def _label_tree(value: Any, path: str, depth: int = 0) -> Any:
    """``value`` (at ``path`` in the render) with every value under it an input labelled by where
    it is (the walk of ``demands.input_values``): a plain string a Probe of ``input:at:<path>``, a
    list a counted list of ``input:count:at:<path>`` (lists already counted keep their source),
    a dict an input dict (its label kept if it has one, else ``at:<path>``; its size counts
    ``input:count:at:<path>``). Labelled in place, the first MAX_LABELLED items of each, 8 levels."""
    if depth > 8:
        return value
    if type(value) is str:
        INPUT_TEXTS.add(value)
        return Probe(value, f"{INPUT}at:{path}")
    if type(value) is int and -(1 << 62) < value < (1 << 62):
        return ProbeInt(value, f"{INPUT}at:{path}", "number")
    if type(value) is float:
        return ProbeFloat(value, f"{INPUT}at:{path}")
    if isinstance(value, list):
        for i, item in enumerate(value[:MAX_LABELLED]):
            value[i] = _label_tree(item, path + "/*", depth + 1)
        return value if isinstance(value, TaintedList) else _counted(value, f"{INPUT}count:at:{path}")
    if isinstance(value, dict):
        INPUT_DICTS.setdefault(id(value), "at:" + path)
        INPUT_PATHS[id(value)] = path
        for key in list(value)[:MAX_LABELLED]:
            if type(key) is str:
                INPUT_TEXTS.add(key)
                value[key] = _label_tree(value[key], _at_step(path, key), depth + 1)
    return value


def _label_inputs(context: dict[str, Any], kwargs: list[str]) -> None:
    """The render's inputs as recording values (a generated render's: its request names its
    keyword arguments ``kwargs``): roles, content-block types, tool names, keyword arguments
    (strings, numbers, the texts of a list) are Probes or tainted numbers of source ``input:...``; messages, tools
    and documents are counted lists, each dict in them an input dict (:func:`_lookup`)."""
    for message in context["messages"]:
        if not isinstance(message, dict):
            continue
        _label(message, "message", {"role": "role"})
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            _label(part, "part", {"type": "type"})
        if type(content) is list:
            message["content"] = _counted(content, INPUT + "count:parts")
        for call in message.get("tool_calls") or ():
            _label(call, "call", {})
            _label(call.get("function") if isinstance(call, dict) else None, "call", {"name": "tool name"})
        if type(message.get("tool_calls")) is list:
            message["tool_calls"] = _counted(message["tool_calls"], INPUT + "count:tool_calls")
    context["messages"] = _counted(context["messages"], INPUT + "count:messages")
    if isinstance(context.get("tools"), list):
        tools = copy.deepcopy(context["tools"])
        for tool in tools:
            function = _label(tool, "tool", {}).get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict):
                parameters = _label(function, "function", {"name": "tool name"}).get("parameters")
                if isinstance(parameters, dict):
                    _label(_label(parameters, "parameters", {}).get("properties"), "param", {})
        context["tools"] = _counted(tools, INPUT + "count:tools")
    if isinstance(context.get("documents"), list):
        for document in context["documents"]:
            _label(document, "document", {})
        context["documents"] = _counted(context["documents"], INPUT + "count:documents")
    for root in ("messages", "tools", "documents"):  # every other value: labelled by where it is
        for item in context.get(root) or () if isinstance(context.get(root), list) else ():
            _label_tree(item, root + "/*")
    for name in kwargs[:64]:
        value, source = context.get(name), f"{INPUT}kwarg:{str(name)[:80]}"
        if type(value) is str:
            context[name] = Probe(value, source)
        elif type(value) is int and -(1 << 62) < value < (1 << 62):
            context[name] = ProbeInt(value, source, "number")
        elif type(value) is float:
            context[name] = ProbeFloat(value, source)
        elif type(value) is list:  # a list of texts (builtin_tools): its items inputs too, one source
            context[name] = [Probe(v, source + "/*") if type(v) is str else v for v in value[:MAX_LABELLED]]
            INPUT_TEXTS.update(v for v in value[:MAX_LABELLED] if type(v) is str)  # a name looked for in it: structure


GENERATED: list[str] = []  # the text of each {% generation %} block of the render in progress
MAX_GENERATED = 64
GENERATED_CHARS = 4096


def _battery_one(template: Any, render: dict[str, Any], cap: int) -> dict[str, Any]:
    out = _battery_render(template, render, cap)
    if GENERATED:
        out["generation"] = GENERATED[:]
    return out


def _battery_render(template: Any, render: dict[str, Any], cap: int) -> dict[str, Any]:
    from jinja2.sandbox import SecurityError

    del GENERATED[:]
    NOW[0] = float(render.get("now", NOW[0]))
    _start_clock()
    context = {**render["context"], "messages": _tainted(render["messages"])}
    if context.get("documents"):
        context["documents"] = _tainted(context["documents"])
    SOURCES.clear()
    INPUT_TEXTS.clear()
    del LIVE_LOOPS[:], KEPT[:]
    INPUT_DICTS.clear()
    INPUT_VIEWS.clear()
    INPUT_PATHS.clear()
    _collect_sources((context["messages"], context.get("documents")))
    if isinstance(render.get("inputs"), list):
        _label_inputs(context, [n for n in render["inputs"] if isinstance(n, str)])
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

    del TAINT[:], PRIVATE[:], DEMANDS[:]
    SEEN.clear()
    DEMAND_SEEN.clear()
    REACHED.clear()
    TRUTHY.clear()
    renders = request.get("renders") or [{}]
    context = renders[0].get("context") if isinstance(renders[0], dict) else None
    LOADER_TOKENS.clear()  # the branches' constants are judged against this request's loader names
    LOADER_TOKENS.update(STANDARD_TOKENS, (k for k in context or () if isinstance(k, str) and k.endswith("_token")))
    try:
        template = env.from_string(request["text"])
    except jinja2.TemplateSyntaxError as exc:
        return {"status": "syntax", "message": f"line {exc.lineno}: {exc.message}"}
    except RecursionError:
        return {"status": "too_large", "message": "the template nests too deeply to compile"}
    cap = int(request["max_output"])
    TEMPLATE[0] = template
    renders = []
    for index, render in enumerate(request["renders"]):
        RENDER[0] = index
        renders.append(_battery_one(template, render, cap))
    worst = next((r for r in renders if r["status"] in ("security", "memory", "too_large")), None)
    status = worst["status"] if worst else "ok"
    message = worst["message"] if worst else ""
    INPUT_DICTS.clear()
    INPUT_VIEWS.clear()
    INPUT_PATHS.clear()
    del KEPT[:]
    return {"status": status, "message": message, "renders": renders, "taint": TAINT[:], "private": PRIVATE[:],
            "demands": DEMANDS[:], "branches": BRANCHES[:MAX_BRANCHES], "reached": sorted(REACHED),
            "branches_over": len(BRANCHES) > MAX_BRANCHES}  # fmt: skip


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
