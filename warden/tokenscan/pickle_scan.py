"""Static analysis of pickle bytes with :mod:`pickletools`: the pickle is never loaded.

:func:`scan_pickles` walks the opcodes of one or more concatenated pickles (the legacy
``torch.save`` format writes several) and collects every global the pickle would import:
``GLOBAL``/``INST`` arguments, and ``STACK_GLOBAL`` operands traced through a small stack
and memo emulation. An operand that cannot be traced is reported as unresolved (a
legitimate pickler never hides its imports). :func:`classify` sorts an import into
dangerous / unknown / safe against the policy's safe list.
"""

from __future__ import annotations

import _compat_pickle
import fnmatch
import io
import pickletools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

PICKLE_OPCODES = frozenset(op.code.encode("latin-1") for op in pickletools.opcodes)
MAX_PICKLES_PER_FILE = 16
MAX_OPS = 1_000_000
DEADLINE_CHECK_OPS = 4096

DANGEROUS_MODULES = (
    "os", "posix", "nt", "subprocess", "_posixsubprocess", "sys", "socket", "_socket", "ssl", "select",
    "runpy", "importlib", "imp", "pkgutil", "zipimport", "shutil", "pty", "commands", "webbrowser",
    "ctypes", "_ctypes", "code", "codeop", "pdb", "bdb", "marshal", "pickle", "_pickle", "cPickle", "dill",
    "joblib", "shelve", "multiprocessing", "asyncio", "threading", "_thread", "signal", "http", "urllib",
    "urllib2", "urllib3", "requests", "httplib", "httpx", "ftplib", "smtplib", "telnetlib", "tempfile",
    "pip", "setuptools", "distutils", "timeit", "profile", "cProfile", "trace", "doctest", "types", "inspect",
    "operator", "functools", "io", "_io", "fileinput", "linecache", "glob", "pathlib", "code", "venv",
    "torch.hub", "torch.jit", "torch.ops", "torch.classes", "torch._dynamo", "torch.utils.cpp_extension",
    "torch.serialization.load", "numpy.f2py", "numpy.testing", "numpy.distutils", "_osx_support",
)  # fmt: skip
DANGEROUS_NAMES = (
    "builtins.eval", "builtins.exec", "builtins.compile", "builtins.open", "builtins.__import__",
    "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.globals", "builtins.locals",
    "builtins.vars", "builtins.breakpoint", "builtins.input", "builtins.help", "builtins.exit",
    "builtins.quit", "builtins.memoryview", "builtins.type", "builtins.object", "builtins.super",
    "builtins.apply", "builtins.execfile", "builtins.file", "builtins.reload", "torch.load",
    "numpy.load", "numpy.fromfile", "numpy.save", "copyreg._reconstructor", "copy_reg._reconstructor",
)  # fmt: skip

_STRING_OPS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_CALL_OPS = frozenset({"REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD"})
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_MARK = object()


@dataclass(frozen=True)
class PickleReport:
    """What one pickle stream imports. ``error`` is set when parsing stopped early (truncated,
    malformed, over the op limit); ``unresolved`` counts STACK_GLOBALs whose operands were hidden."""

    imports: tuple[str, ...]
    unresolved: int = 0
    ops: int = 0
    protocol: int | None = None
    error: str | None = None
    extensions: int = 0
    calls: int = 0
    incomplete: str | None = None


@dataclass
class _Emulator:
    stack: list[Any] = field(default_factory=list)
    memo: dict[int, Any] = field(default_factory=dict)
    imports: list[str] = field(default_factory=list)
    unresolved: int = 0
    extensions: int = 0
    calls: int = 0
    protocol: int | None = None

    def _import(self, module: str, name: str) -> None:
        if _IDENT_RE.match(module) and _IDENT_RE.match(name):
            self.imports.append(normalize(module, name, self.protocol))
        else:
            self.unresolved += 1

    def pop_to_mark(self) -> None:
        while self.stack:
            if self.stack.pop() is _MARK:
                return

    def step(self, op: pickletools.OpcodeInfo, arg: Any) -> None:
        name = op.name
        self.calls += name in _CALL_OPS
        if name == "PROTO":
            self.protocol = int(arg)
        if name in _STRING_OPS:
            self.stack.append(arg if isinstance(arg, str) else None)
        elif name == "MARK":
            self.stack.append(_MARK)
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.stack[-1] if self.stack else None
        elif name in _PUT_OPS:
            self.memo[int(arg)] = self.stack[-1] if self.stack else None
        elif name in _GET_OPS:
            self.stack.append(self.memo.get(int(arg)))
        elif name == "DUP":
            self.stack.append(self.stack[-1] if self.stack else None)
        elif name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            self._import(module, attr)
            self._generic(op)
        elif name == "STACK_GLOBAL":
            top = self.stack.pop() if self.stack else None
            below = self.stack.pop() if self.stack else None
            if isinstance(below, str) and isinstance(top, str):
                self._import(below, top)
            else:
                self.unresolved += 1
            self.stack.append(None)
        elif name.startswith("EXT"):
            self.extensions += 1
            self.stack.append(None)
        else:
            self._generic(op)

    def _generic(self, op: pickletools.OpcodeInfo) -> None:
        before = list(op.stack_before)
        if pickletools.markobject in before:
            self.pop_to_mark()
            before = before[: before.index(pickletools.markobject)]
        for _ in before:
            if self.stack:
                self.stack.pop()
        for item in op.stack_after:
            self.stack.append(_MARK if item is pickletools.markobject else None)


def normalize(module: str, name: str, protocol: int | None) -> str:
    """``module.name`` with Python 2 names mapped as the unpickler maps them (``__builtin__`` -> builtins)."""
    if protocol is None or protocol < 3:
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


class _Limited:
    """Reads at most ``limit`` bytes of ``inner``, with ``tell`` and ``peek`` for genops and the
    multi-pickle loop (so a huge file cannot make parsing unbounded)."""

    def __init__(self, inner: BinaryIO, limit: int) -> None:
        self.inner, self.left, self.pos = inner, limit, 0
        self._ahead = b""
        self._at = 0  # read position inside _ahead (no copying per small read)

    def _buffered(self) -> int:
        return len(self._ahead) - self._at

    def read(self, n: int = -1) -> bytes:
        n = self.left + self._buffered() if n is None or n < 0 else n
        take = min(n, self._buffered())
        data = self._ahead[self._at : self._at + take]
        self._at += take
        want = min(n - len(data), self.left)
        if want > 0:
            more = self.inner.read(want)
            self.left -= len(more)
            data += more
        self.pos += len(data)
        return data

    def readline(self) -> bytes:
        """One line, however long (a protocol 0 string can be megabytes; the byte limit bounds it)."""
        out = bytearray()
        while True:
            chunk = self.peek(4096)
            if not chunk:
                return bytes(out)
            cut = chunk.find(b"\n")
            out += self.read(cut + 1 if cut >= 0 else len(chunk))
            if cut >= 0:
                return bytes(out)

    def peek(self, n: int) -> bytes:
        if self._buffered() < n:
            more = self.inner.read(min(n - self._buffered(), self.left))
            self.left -= len(more)
            self._ahead = self._ahead[self._at :] + more
            self._at = 0
        return self._ahead[self._at : self._at + n]

    def tell(self) -> int:
        return self.pos


def scan_one(stream: BinaryIO, max_ops: int = MAX_OPS, deadline: float = float("inf")) -> PickleReport:
    """Walks one pickle from the stream's position to its STOP opcode. Stopping early (the op
    limit, the deadline) sets ``incomplete``: what was not analysed is never called safe."""
    emu = _Emulator()
    ops = 0
    error = incomplete = None
    try:
        for op, arg, _pos in pickletools.genops(stream):
            ops += 1
            if ops > max_ops:
                error = incomplete = f"more than {max_ops} opcodes; analysis stopped"
                break
            if ops % DEADLINE_CHECK_OPS == 0 and time.monotonic() > deadline:
                error = incomplete = f"time budget spent after {ops} opcodes; analysis stopped"
                break
            emu.step(op, arg)
    except Exception as exc:  # malformed pickles raise ValueError, struct.error, UnicodeDecodeError...
        error = f"{type(exc).__name__}: {exc}"[:200]
    return PickleReport(
        tuple(emu.imports), emu.unresolved, ops, emu.protocol, error, emu.extensions, emu.calls, incomplete
    )


def scan_pickles(
    stream: BinaryIO, limit: int, max_pickles: int = MAX_PICKLES_PER_FILE, deadline: float = float("inf")
) -> list[PickleReport]:
    """Every pickle at the start of ``stream`` (several back to back, as legacy torch.save writes).
    More streams than ``max_pickles`` marks the last report incomplete."""
    limited = _Limited(stream, limit)
    reports: list[PickleReport] = []
    while True:
        report = scan_one(limited, deadline=deadline)  # type: ignore[arg-type]
        if report.error and not report.incomplete and limited.left == 0 and limited.inner.read(1):
            report = replace(report, incomplete=f"pickle larger than the {limit}-byte analysis cap")
        reports.append(report)
        nxt = limited.peek(2)
        if report.error or len(nxt) < 2 or nxt[0] != 0x80 or nxt[1] > 5:
            break
        if len(reports) >= max_pickles:
            reports[-1] = replace(report, incomplete=f"more than {max_pickles} pickle streams; the rest not analysed")
            break
    return reports


def scan_pickle_bytes(data: bytes, max_pickles: int = MAX_PICKLES_PER_FILE) -> list[PickleReport]:
    return scan_pickles(io.BytesIO(data), len(data), max_pickles)


def looks_like_pickle(head: bytes) -> bool:
    """Cheap gate: a protocol 2-5 header, or a first byte that is a protocol 0/1 opcode."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    return bool(head) and head[:1] in PICKLE_OPCODES


def is_confirmed_pickle(report: PickleReport, head: bytes) -> bool:
    """Whether parsing confirmed a pickle: a protocol 2-5 header, a clean parse of a few
    opcodes, or (protocol 0/1 broken off later, as a payload followed by junk would be) a
    well-formed import that a call opcode used before the stream broke off."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    if report.error is None:
        return report.ops >= 3
    return bool(report.imports) and report.calls > 0


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def classify(name: str, safe: Iterable[str]) -> str:
    """``dangerous`` (known code execution), ``unknown`` (outside the safe list) or ``safe``."""
    module = name.rsplit(".", 1)[0]
    if name in DANGEROUS_NAMES or any(module == m or module.startswith(m + ".") for m in DANGEROUS_MODULES):
        return "dangerous"
    if any(name == m or name.startswith(m + ".") for m in DANGEROUS_MODULES):
        return "dangerous"
    return "safe" if _matches(name, safe) else "unknown"
