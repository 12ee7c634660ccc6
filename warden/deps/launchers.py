"""What an installer may write outside site-packages for a wheel (pure): where each install
scheme lands, which shebang a ``#!python`` script may get, and what a console-script launcher
may contain.

Why this exists: a rebuilt wheel of the locked version can only pass the locked-wheel
comparison (wheels.py) through the files an installer writes itself, so those are checked by
content, not by name: a launcher is accepted only when it is the usual generated stub that
imports the entry point named in the locked wheel's ``entry_points.txt`` and calls it, and a
rewritten shebang only when it names the environment's own interpreter.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass

_SITE = re.compile(r"^(?P<prefix>/.*)/lib(?:64)?/python[0-9]+\.[0-9]+t?/site-packages\Z")
_PYTHON = re.compile(r"python(?:[0-9]+(?:\.[0-9]+)?t?)?")
_SAFE_NAMES = frozenset({"sys", "re"})
_SAFE_ATTRS = frozenset({"argv", "sub", "endswith", "removesuffix"})


@dataclass(frozen=True)
class InstallLayout:
    """The install schemes of a POSIX environment, relative to its site-packages (RECORD's form)."""

    site_packages: str
    scripts: str  # e.g. ../../../bin
    data: str  # the prefix, e.g. ../../..
    headers: str  # e.g. ../../../include

    @property
    def scripts_dir(self) -> str:
        """The absolute directory scripts and launchers are installed into."""
        return posixpath.normpath(posixpath.join(self.site_packages, self.scripts))


def install_layout(site_packages: str) -> InstallLayout | None:
    """The layout of ``<prefix>/lib/pythonX.Y/site-packages``; None for any other shape (a bare
    directory): then relocated files are matched by their path's tail only."""
    match = _SITE.match(posixpath.normpath(site_packages))
    if match is None:
        return None
    prefix = match.group("prefix")

    def rel(path: str) -> str:
        return posixpath.relpath(path, site_packages)

    return InstallLayout(site_packages, rel(f"{prefix}/bin"), rel(prefix), rel(f"{prefix}/include"))


def allowed_shebang(
    line: bytes, layout: InstallLayout | None, same_interpreter: Callable[[str], bool] | None = None
) -> bool:
    """Whether ``line`` (a script's first line, without its newline) is what an installer writes
    for ``#!python``: ``#!`` and the absolute path of a ``python*`` with no arguments, in the
    environment's scripts directory when the layout is known, or one that ``same_interpreter``
    says is the environment's interpreter (a copied venv keeps its template's path).
    ``env -S ...`` tricks, arguments and relative paths are refused. Pure but for the callback."""
    text = line.rstrip(b"\r").decode("utf-8", "replace")
    if not text.startswith("#!/") or any(ch.isspace() for ch in text):
        return False
    path = text[2:]
    directory, name = posixpath.split(path)
    if not _PYTHON.fullmatch(name) or posixpath.normpath(path) != path:
        return False
    if layout is None or directory == layout.scripts_dir:
        return True
    return same_interpreter is not None and same_interpreter(path)


def _entry_target(spec: str) -> tuple[str, list[str]] | None:
    """``module:attr.sub [extra]`` -> (module, [attr, sub]); None when malformed."""
    module, sep, attrs = spec.split("[", 1)[0].strip().partition(":")
    parts = attrs.strip().split(".") if sep else []
    if not module.strip() or not parts or not all(p.isidentifier() for p in parts):
        return None
    return module.strip(), parts


def _is_call_path(node: ast.expr, parts: list[str]) -> bool:
    """``node`` is ``parts[0].parts[1]...`` (the entry point's callable)."""
    for name in reversed(parts[1:]):
        if not (isinstance(node, ast.Attribute) and node.attr == name):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == parts[0]


def _safe_expr(node: ast.expr) -> bool:
    """Only ``sys``/``re``, the attributes a launcher uses on ``sys.argv[0]``, constants and calls of those."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in _SAFE_NAMES:
            return False
        if isinstance(sub, ast.Attribute) and sub.attr not in _SAFE_ATTRS:
            return False
        if isinstance(sub, ast.Call) and not isinstance(sub.func, ast.Attribute):
            return False
        if not isinstance(
            sub,
            ast.Name
            | ast.Attribute
            | ast.Call
            | ast.Subscript
            | ast.Constant
            | ast.Slice
            | ast.UnaryOp
            | ast.Load
            | ast.USub
            | ast.keyword
            | ast.BoolOp
            | ast.Or
            | ast.And,
        ):
            return False
    return True


def _is_argv0(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == 0
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "argv"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "sys"
    )


def _main_body_ok(body: list[ast.stmt], parts: list[str], exits: list[int]) -> bool:
    """The ``if __name__ == '__main__':`` block: argv[0] clean-ups, then ``sys.exit(entry())``."""
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1 or not _is_argv0(stmt.targets[0]) or not _safe_expr(stmt.value):
                return False
        elif isinstance(stmt, ast.If):
            if not _safe_expr(stmt.test) or not _main_body_ok(stmt.body, parts, exits):
                return False
            if not _main_body_ok(stmt.orelse, parts, exits):
                return False
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr == "exit" and isinstance(func.value, ast.Name)):
                return False
            inner = call.args[0] if len(call.args) == 1 and not call.keywords else None
            if func.value.id != "sys" or not isinstance(inner, ast.Call) or inner.args or inner.keywords:
                return False
            if not _is_call_path(inner.func, parts):
                return False
            exits.append(1)
        else:
            return False
    return True


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def is_entry_point_launcher(
    content: bytes, spec: str, layout: InstallLayout | None, same_interpreter: Callable[[str], bool] | None = None
) -> bool:
    """Whether ``content`` is a generated launcher of entry point ``spec`` (``module:attr``) and
    nothing else: an allowed shebang, then only ``import re``/``import sys``, ``from module import
    attr`` and a ``__main__`` block that tidies ``sys.argv[0]`` and calls ``sys.exit(attr())``
    (pip's and uv's templates). Pure; False for anything it cannot parse."""
    target = _entry_target(spec)
    first, _, rest = content.partition(b"\n")
    if target is None or not allowed_shebang(first, layout, same_interpreter):
        return False
    module, parts = target
    try:
        tree = ast.parse(rest.decode("utf-8"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    imported, exits = False, list[int]()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            if any(a.name not in _SAFE_NAMES or a.asname for a in stmt.names):
                return False
        elif isinstance(stmt, ast.ImportFrom):
            names = [(a.name, a.asname) for a in stmt.names]
            if imported or stmt.level or stmt.module != module or names != [(parts[0], None)]:
                return False
            imported = True
        elif isinstance(stmt, ast.If) and _is_main_guard(stmt.test) and not stmt.orelse:
            if not _main_body_ok(stmt.body, parts, exits):
                return False
        else:
            return False
    return imported and len(exits) >= 1
