"""What the sandbox saw a template test its inputs against, turned into inputs that pass the tests.

The sandbox child (``sandbox_child.py``) renders the generated conversations with every input
value labelled (a role, a content-block type, a tool name, a keyword argument, the keys of each
message, content block, tool, tool parameter list and document, and the lengths of the message,
tool and document lists) and records a *demand* ``[source, operation, constant, path]`` for each
test the template's control flow made of a value derived from one: ``source`` names the input
(``input:role``, ``input:key:message``, ``input:kwarg:<name>``, ``input:count:tools``...),
``operation`` the test (``==``, ``!=``, ``in``, ``in a constant``, ``startswith``, ``endswith``,
``find``..., ``key``: a key the template asked an input dict for and it lacked, ``length gt``
and the like: a length or number compared with a number), ``constant`` the other operand as the
sandbox saw it at run time (a computed key or bound arrives computed) and ``path`` the steps from
the input to the tested value (a slice, a case or trim filter).

:func:`probes` turns the demands into forced shape descriptions for
:func:`~.conversations.demanded`. It never evaluates template code: a demand is data, and the
value that satisfies it is made by the small, bounded string and integer operations below on the
recorded constant (at most :data:`MAX_VALUE` characters, integers at most :data:`COUNT_CAPS`).

Invariant (with the sandbox's recording): every input value the template's control flow is
observed to test, among the first :data:`MAX_TAKEN` demands, is drawn in a form that satisfies the
test at least once, unless a round-one input already did (:func:`observed`) or the value is past
its bound (a string over MAX_VALUE characters, a count over its cap); demanded inputs past the
scan's shape budget, and tests past what the sandbox records, are reported as not analysed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

INPUT = "input:"
MAX_TAKEN = 256  # demands read from one answer (the sandbox records at most 256 and an overflow one)
MAX_VALUE = 64  # characters of a demanded string value
MAX_LENGTH = 4096  # characters of a string drawn to pass a length test
AT = "at:"  # an input labelled by where it is in the render (:func:`input_values`): ``at:tools/*/type``
AT_COUNT_CAP = 64  # the longest list, or most keys of a dict, drawn at a path
FREE_KEYED = frozenset({"arguments", "properties"})  # dicts whose keys are names the caller picks: ``*`` in a path
MAX_DEPTH = 8  # levels of a render's values labelled by path
COUNT_CAPS = {"messages": 200, "tools": 64, "documents": 16, "parts": 16, "tool_calls": 16}  # the longest lists
MIN_COUNT = {"messages": 1, "tools": 1, "documents": 1, "parts": 1, "tool_calls": 1}
COUNT_FIELDS = {"messages": "messages", "tools": "tools", "documents": "docs", "parts": "parts_n",
                "tool_calls": "calls"}  # fmt: skip
KWARG_NUMBER = 1 << 31  # the largest keyword-argument number a demand may ask for
STRING_OPS = frozenset({"==", "!=", "in", "in a constant", "startswith", "endswith", "find", "rfind", "index",
                        "rindex", "count", "replace", "split", "rsplit", "partition", "rpartition", "removeprefix",
                        "removesuffix", "key", "__lt__", "__le__", "__gt__", "__ge__"})  # fmt: skip
ORDERING = {"__lt__": str.__lt__, "__le__": str.__le__, "__gt__": str.__gt__, "__ge__": str.__ge__}
STR_TESTS = {"isdigit": "7", "isdecimal": "7", "isnumeric": "7", "isupper": "UPPER", "islower": "lower",
             "istitle": "Title", "isalpha": "abc", "isalnum": "abc7", "isascii": "abc", "isidentifier": "abc",
             "isprintable": "abc"}  # fmt: skip
NUMBER_OPS = {"eq": 0, "ne": 0, "gt": 1, "ge": 0, "lt": -1, "le": 0}  # the value past the bound, per test
_INT_RE = re.compile(r"-?[0-9]{1,12}")
_DECIMAL_RE = re.compile(r"-?[0-9]{1,12}\.[0-9]{1,12}")
_KWARG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,79}")
RESERVED_KWARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
ITEMS = "/*"  # a keyword argument's source suffix for the items of its list (``input:kwarg:builtin_tools/*``)
STEP_METHODS = frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "casefold", "swapcase"})


def _apply(value: str, path: Iterable[Any]) -> str | None:
    """``value`` after the recorded steps (slices, case and trim methods), or None when a step is
    not one of those (its result is not known here)."""
    for step in path:
        if not isinstance(step, list) or not step:
            return None
        if step[0] == "slice" and len(step) == 4 and all(b is None or type(b) is int for b in step[1:]):
            if step[3] == 0:
                return None
            value = value[slice(*step[1:])]
        elif step[0] in STEP_METHODS and len(step) == 1:
            value = getattr(str, step[0])(value)
        elif step[0] == "affix" and len(step) == 3 and all(isinstance(a, str) for a in step[1:]):
            value = step[1] + value + step[2]
        else:
            return None
    return value


def _passes(value: str, operation: str, constant: str, path: list[Any]) -> bool:
    """Whether ``value`` (after ``path``) passes the string test ``operation`` with ``constant``
    in the sense that opens the branch an ordinary input does not: equal for ``==`` and ``!=``,
    contained for ``in``... (the other sense is what the draw gives)."""
    seen = _apply(value, path)
    if seen is None:
        return False
    if operation in ("==", "!=", "key"):
        return seen == constant
    if operation == "in a constant" or operation.startswith("str."):
        return bool(seen) and seen in constant
    if operation in ("startswith", "removeprefix"):
        return seen.startswith(constant)
    if operation in ("endswith", "removesuffix"):
        return seen.endswith(constant)
    if operation in ORDERING:  # the order the test asks for (the draw's values are ordered at random)
        return bool(seen) and bool(ORDERING[operation](seen, constant))
    if operation in STRING_OPS:  # in, find, index, count, split, replace...: the constant occurs in it
        return constant in seen
    if operation in STR_TESTS:
        return bool(getattr(str, operation)(seen))
    return False


def _inverted(constant: str, path: list[Any]) -> str | None:
    """A value whose path, undone step by step from the last (an affix cut off, a slice's start
    padded), gives ``constant``; None when an affix does not match (case and trim steps keep the
    constant: it usually is in that case already)."""
    value = constant
    for step in reversed(path):
        if not isinstance(step, list) or not step:
            return None
        if step[0] == "affix" and len(step) == 3 and all(isinstance(a, str) for a in step[1:]):
            before, after = step[1], step[2]
            if len(value) < len(before) + len(after) or not (value.startswith(before) and value.endswith(after)):
                return None
            value = value[len(before) : len(value) - len(after)]
        elif step[0] == "slice" and len(step) == 4 and type(step[1]) is int and 0 < step[1] <= MAX_VALUE:
            value = "x" * step[1] + value
    return value


def _string_value(operation: str, constant: str, path: list[Any]) -> str | None:
    """A string that passes the test (:func:`_passes`): the constant itself, padded before for a
    slice that starts past 0, or after for one that stops short of the end; the first that passes,
    else the constant (a path with steps not known here). None for a test no string answers."""
    if operation in STR_TESTS:
        return STR_TESTS[operation]
    if not (operation in STRING_OPS or operation.startswith("str.")) or not constant or len(constant) > MAX_VALUE:
        return None
    starts = [s[1] for s in path if isinstance(s, list) and s[:1] == ["slice"] and type(s[1]) is int]
    pads = sorted({abs(a) for a in starts if 0 < abs(a) <= MAX_VALUE})
    undone = _inverted(constant, path)
    candidates = [
        *([undone] if undone else []),
        constant,
        constant + "x",
        *([constant[:-1] + chr(ord(constant[-1]) - 1)] if ord(constant[-1]) > 0x21 else []),  # just before it
        constant[:-1],
        *("x" * a + constant for a in pads),
        *("x" * a + constant + "x" for a in pads),
    ]
    for candidate in candidates:
        if len(candidate) <= 2 * MAX_VALUE and _passes(candidate, operation, constant, path):
            return candidate
    return constant


def _target(operation: str, constant: str) -> int | None:
    """The number a length or number test (``length gt`` ``121``) asks for: just past the bound
    (``gt``: one more, ``lt``: one less, the bound itself for the others), or None."""
    kind, _, test = operation.partition(" ")
    if kind not in ("length", "number") or test not in NUMBER_OPS:
        return None
    if _INT_RE.fullmatch(constant):
        return int(constant) + NUMBER_OPS[test]
    if not _DECIMAL_RE.fullmatch(constant) or test in ("eq", "ne"):
        return None  # no integer equals a fraction
    bound = float(constant)  # a fractional bound: the first integer past it
    return {"gt": math.floor(bound) + 1, "ge": math.ceil(bound), "lt": math.ceil(bound) - 1,
            "le": math.floor(bound)}[test]  # fmt: skip


def _number_passes(value: int, operation: str, constant: str) -> bool:
    target = _target(operation, constant)
    if target is None:
        return False
    test = operation.partition(" ")[2]
    bound = float(constant)
    return {"eq": value == bound, "ne": value == bound, "gt": value > bound, "ge": value >= bound,
            "lt": value < bound, "le": value <= bound}[test]  # fmt: skip


def probe(demand: Any) -> dict[str, Any] | None:
    """The forced shape description (as :meth:`~.conversations.TemplateInputs.probes` gives)
    whose input passes ``demand``, or None when none can (or may) be drawn."""
    if not (isinstance(demand, list) and len(demand) >= 3 and all(isinstance(x, str) for x in demand[:3])):
        return None
    source, operation, constant = demand[:3]
    path = demand[3] if len(demand) > 3 and isinstance(demand[3], list) else []
    kind = source[len(INPUT) :] if source.startswith(INPUT) else ""
    if operation == "truthy":  # a keyword argument the loader left undefined, tested for truth: set it
        name = kind[len("kwarg:") :] if kind.startswith("kwarg:") else ""
        return {"kwargs": {name: True}} if _KWARG_RE.fullmatch(name) and name not in RESERVED_KWARGS else None
    if operation == "kind" and kind.startswith(AT) and constant in KIND_VALUES:  # a value of the kind tested
        at = kind[len(AT) :]
        return {"edits": [{"at": at, "kind": constant}], **_reaching(at)}
    if kind.startswith("count:" + AT):
        n = _target(operation, constant)
        at = kind[len("count:" + AT) :]
        return {"edits": [{"at": at, "count": n}], **_reaching(at)} if n is not None and 0 < n <= AT_COUNT_CAP else None
    if kind.startswith("count:"):
        return _count_probe(kind[len("count:") :], _target(operation, constant))
    target = _target(operation, constant)
    if target is not None and operation.startswith("length"):  # a string input's length
        value: Any = "k" * target if 0 < target <= MAX_LENGTH else None
    elif target is not None:  # a number: a keyword argument's, or one at a path
        numeric = kind.startswith(("kwarg:", AT))
        value = target if numeric and abs(target) <= KWARG_NUMBER else None
    else:
        value = _string_value(operation, constant, path)
    if value is None or value == "":
        return None
    if kind == "role":
        return {"role": value} if isinstance(value, str) else None
    if kind == "type":
        return {"part_type": value} if isinstance(value, str) else None
    if kind == "tool name":
        return {"tool_name": value, "tools": 1} if isinstance(value, str) else None
    if kind.startswith("key:" + AT) and isinstance(value, str):
        at = kind[len("key:" + AT) :]
        return {"edits": [{"at": at, "add_key": value}], **_reaching(at)}
    if kind.startswith("key:"):
        return {"key": value, "key_in": kind[len("key:") :]} if isinstance(value, str) else None
    if kind.startswith(AT) and isinstance(value, (str, int)):
        at = kind[len(AT) :]
        return {"edits": [{"at": at, "value": value}], **_reaching(at)}
    if kind.startswith("kwarg:"):
        name = kind[len("kwarg:") :]
        items = name.endswith(ITEMS)  # an item of a list argument: a list holding the value
        name = name[: -len(ITEMS)] if items else name
        ok = _KWARG_RE.fullmatch(name) and name not in RESERVED_KWARGS
        return {"kwargs": {name: [value] if items else value}} if ok else None
    return None


def _reaching(at: str) -> dict[str, Any]:
    """What a shape needs for the path ``at`` to exist in its renders: a tool and a document, a
    tool call when the path goes through one, content as parts when it goes through those."""
    need: dict[str, Any] = {"tools": 1, "docs": 1}
    if "/tool_calls" in at:
        need["calls"] = 1
    if at.startswith("messages/*/content/"):
        need["parts_n"] = 2
    return need


def past_bounds(demands: Any, seen: dict[str, set[Any]]) -> int:
    """How many of the first :data:`MAX_TAKEN` demands no draw may pass because the value they ask
    for is past its bound (a count over its cap, a string longer than :data:`MAX_LENGTH`) and no
    round-one input passed: the caller reports them as not analysed (never dropped silently)."""
    out = 0
    for demand in list(demands)[:MAX_TAKEN] if isinstance(demands, list) else ():
        if not (isinstance(demand, list) and len(demand) >= 3 and all(isinstance(x, str) for x in demand[:3])):
            continue
        target = _target(demand[1], demand[2])
        if target is None or probe(demand) is not None or satisfied(demand, seen):
            continue
        source = demand[0][len(INPUT) :] if demand[0].startswith(INPUT) else ""
        what = source[len("count:") :] if source.startswith("count:") else ""
        cap = AT_COUNT_CAP if what.startswith(AT) else COUNT_CAPS.get(what)
        if (cap is not None and target > cap) or (not what and demand[1].startswith("length") and target > MAX_LENGTH):
            out += 1
    return out


def _count_probe(what: str, target: int | None) -> dict[str, Any] | None:
    if target is None or what not in COUNT_CAPS or not MIN_COUNT[what] <= target <= COUNT_CAPS[what]:
        return None
    return {COUNT_FIELDS[what]: target}


def step(path: str, key: Any) -> str:
    """The path of the value under ``key`` of the dict at ``path`` (``*`` under a free-keyed dict)."""
    return f"{path}/{'*' if path.rsplit('/', 1)[-1] in FREE_KEYED else key}"


def input_values(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(source, value)`` for every value under ``value`` (at ``path``: ``messages/*``,
    ``tools/*``, ``documents/*``), by the sources the sandbox labels them with: each string and
    integer ``at:<path>``, each list's and dict's size ``count:at:<path>``, each dict key
    ``key:at:<path>``; list items at ``<path>/*``, dict values at :func:`step` (the sandbox's walk
    is the same one: a test checks they agree)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str) or (type(value) is int and -(1 << 62) < value < (1 << 62)):
        yield AT + path, value
    elif isinstance(value, list):
        yield "count:" + AT + path, len(value)
        for item in value[:AT_COUNT_CAP]:
            yield from input_values(item, path + "/*", depth + 1)
    elif isinstance(value, dict):
        yield "count:" + AT + path, len(value)
        for key, item in list(value.items())[:AT_COUNT_CAP]:
            if isinstance(key, str):
                yield "key:" + AT + path, key
                yield from input_values(item, step(path, key), depth + 1)


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def observed(renders: Iterable[dict[str, Any]]) -> dict[str, set[Any]]:
    """The values each input source had in ``renders`` (render requests: their messages, tools,
    documents and keyword arguments), by the demand sources' names: what round one drew."""
    out: dict[str, set[Any]] = {}

    def add(source: str, value: Any) -> None:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            out.setdefault(INPUT + source, set()).add(value)

    def keys(label: str, value: Any) -> None:
        for key in value if isinstance(value, dict) else ():
            add(f"key:{label}", key)

    for render in renders:
        messages, context = render.get("messages") or [], render.get("context") or {}
        add("count:messages", len(messages))
        for message in map(_mapping, messages):
            keys("message", message)
            add("role", message.get("role"))
            if isinstance(message.get("content"), list):
                add("count:parts", len(message["content"]))
            if isinstance(message.get("tool_calls"), list) and message["tool_calls"]:
                add("count:tool_calls", len(message["tool_calls"]))
            for part in _listed(message.get("content")):
                keys("part", part)
                add("type", part.get("type") if isinstance(part, dict) else None)
        for root, values in (("messages", messages), ("tools", context.get("tools")), ("documents",
                             context.get("documents"))):  # fmt: skip
            for item in values if isinstance(values, list) else ():
                for source, value in input_values(item, root + "/*"):
                    add(source, value)
        tools, documents = context.get("tools") or [], context.get("documents") or []
        add("count:tools", len(tools))
        add("count:documents", len(documents))
        # a demand round may have drawn any of these as another kind (a string where a dict was)
        calls = [c for m in messages for c in _listed(_mapping(m).get("tool_calls")) if isinstance(c, dict)]
        if calls and not tools:  # the first call names the first tool (a probe's name goes to both)
            add("tool name", _mapping(calls[0].get("function")).get("name"))
        for i, tool in enumerate(_listed(tools)):
            function = _mapping(_mapping(tool).get("function"))
            keys("tool", tool)
            keys("function", function)
            keys("param", _mapping(function.get("parameters")).get("properties"))
            if i == 0:  # where a tool-name probe puts its name: a later tool's name passes no test of tools[0]
                add("tool name", function.get("name"))
        for document in documents:
            keys("document", document)
        for name in render.get("inputs") or ():
            add(f"kwarg:{name}", context.get(name))
            for item in _listed(context.get(name)):
                add(f"kwarg:{name}{ITEMS}", item)
    return out


def satisfied(demand: list[Any], seen: dict[str, set[Any]]) -> bool:
    """Whether some value round one drew for the demand's source already passes it (a kind test:
    never, the draw holds one kind per path)."""
    source, operation, constant = demand[:3]
    if operation == "kind":
        return False
    path = demand[3] if len(demand) > 3 and isinstance(demand[3], list) else []
    values = seen.get(source, set())
    if operation == "truthy":  # drawn true in a render before: the test's render kept its own shape
        return False
    if _target(operation, constant) is not None:  # a count's ints; a string's length; a number's ints
        counted = source.startswith(INPUT + "count:") or operation.startswith("number")
        numbers = (
            {v for v in values if isinstance(v, int)} if counted else {len(v) for v in values if isinstance(v, str)}
        )
        return any(_number_passes(v, operation, constant) for v in numbers)
    return any(isinstance(v, str) and _passes(v, operation, constant, path) for v in values)


def probes(
    demands: Any, seen: dict[str, set[Any]], carried: Callable[[list[Any]], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The distinct probes (:func:`probe`) of the first :data:`MAX_TAKEN` demands that round one
    did not satisfy (:func:`satisfied`), in the order recorded (the caller draws as many as its
    shape budget allows and reports the rest). ``carried``: the edits each demand's probe keeps
    (those of the render it was seen in, for the rounds after the second)."""
    out: list[dict[str, Any]] = []
    for demand in list(demands)[:MAX_TAKEN] if isinstance(demands, list) else ():
        made = probe(demand)
        if made is None or satisfied(demand, seen):
            continue
        kept = carried(demand) if carried is not None else {}
        for form in _forms(made):
            if kept:  # what the render the test was seen in was drawn with: the tested value exists only there
                form = _joined(kept, form)
            if form not in out:
                out.append(form)
    return _by_form(out)


REACHING = frozenset({"tools", "docs", "calls", "parts_n"})  # what :func:`_reaching` asks of a shape


def _by_form(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``found`` with the probes that only add a field somewhere joined into one per kind of value
    (fields at different paths do not interfere: one shape draws them all, so a template that asks
    for many optional schema fields costs a shape per kind, not one per field and kind)."""
    joined: dict[str, dict[str, Any]] = {}
    rest = []
    for made in found:
        edits = made.get("edits") or []
        if edits and "add_key" in edits[-1] and set(made) <= REACHING | {"edits"}:
            into = joined.setdefault(str(edits[-1].get("form")), {"edits": []})
            into["edits"] += [e for e in edits if e not in into["edits"]]
            for key in REACHING & set(made):
                into[key] = max(into.get(key, 0), made[key])
        else:
            rest.append(made)
    return [*joined.values(), *rest]


KIND_VALUES = frozenset(
    {"string", "mapping", "number", "integer", "float", "sequence", "iterable", "boolean", "none", "true", "false"}
)  # fmt: skip  (the kinds a value at a path is drawn as once tested)
NAMED_PATHS = {"message": "messages/*", "part": "messages/*/content/*", "tool": "tools/*",
               "function": "tools/*/function", "parameters": "tools/*/function/parameters",
               "document": "documents/*"}  # fmt: skip
"""Where each named input dict is (the labels of :func:`observed`), as :func:`input_values` names it."""
KEY_FORMS = ("text", "true", "false", "null", "number", "list", "mapping")  # what a field asked for is drawn holding


SHAPE_KEYS = frozenset({"first", "turns", "plain", "parts"})  # the layout a probe shape is given, not drawn


def _joined(kept: dict[str, Any], form: dict[str, Any]) -> dict[str, Any]:
    """The probe ``form`` on top of ``kept`` (a render's forced description): both sets of edits,
    both keyword arguments, every other key of ``form`` over ``kept``'s."""
    out = {k: v for k, v in kept.items() if k not in SHAPE_KEYS and v is not None}
    out.update({k: v for k, v in form.items() if k not in ("edits", "kwargs")})
    edits = [*(kept.get("edits") or []), *(form.get("edits") or [])]
    kwargs = {**(kept.get("kwargs") or {}), **(form.get("kwargs") or {})}
    return out | ({"edits": edits} if edits else {}) | ({"kwargs": kwargs} if kwargs else {})


def _forms(made: dict[str, Any]) -> list[dict[str, Any]]:
    """``made``, and for a field asked of a dict at a path, the same with the field holding each
    of :data:`KEY_FORMS` (a test of its value then sees each kind: ``is true``, membership, a length)."""
    if "key" in made:  # a named dict's field: the text form as before, the others added at its path
        at = NAMED_PATHS.get(str(made.get("key_in")))
        return [made, *({"edits": [{"at": at, "add_key": made["key"], "form": form}], **_reaching(at)}
                        for form in KEY_FORMS[1:] if at)]  # fmt: skip
    edits = made.get("edits") or []
    if len(edits) != 1 or "add_key" not in edits[0]:
        return [made]
    return [{**made, "edits": [{**edits[0], "form": form}]} for form in KEY_FORMS]


def overflowed(demands: Any) -> int:
    """1 when the sandbox stopped recording demands (its ``overflow`` demand) or more than
    :data:`MAX_TAKEN` came, else 0: tests past those were not seen, so not drawn."""
    if not isinstance(demands, list):
        return 0
    return int(len(demands) > MAX_TAKEN or any(isinstance(d, list) and d[1:2] == ["overflow"] for d in demands))
