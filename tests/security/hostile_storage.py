"""The hostile-storage harness: every filesystem access an operation makes under a location the
storage writer can write, and at each one, every kind of hostile entry put there just before it.

How it works: :class:`Interposer` wraps the ``os`` functions (and ``builtins.open``) that reach
the filesystem and records each call as an access point: which entry it names, resolved through
``dir_fd`` to a full path. A dry run of the operation lists its access points; then, for each
(access point, substitution), a fresh setup runs the operation again with the substitution armed:
just before that call the entry is replaced by the hostile kind (a link to a file the process may
write, a link loop, a FIFO, a link to an endless device, a hard link, a deep tree, an oversized
sparse file, a directory swapped by rename, the entry deleted, an entry appearing where there was
none). Only entries the threat model's storage writer can touch are substituted: those whose
parent directory is writable by others (the test makes the attacked roots 0o777; a directory the
trainer creates 0700 is out of the attacker's reach, as it would be on a real host).

The operation runs in a thread under a deadline; the outcome is ``ok`` (it returned), ``refused``
(it raised one of the contract's errors: a WardenError subclass or an OSError, which the CLI maps to
exit 3 with one line), ``crash`` (anything else: a traceback) or ``hang``. The caller's invariant
check runs after each combination; the sensitive files outside the attacked roots are hashed
before and after (nothing may be written through a planted name).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import random
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from warden.errors import WardenError

SUBSTITUTIONS = (
    "symlink_to_victim",
    "symlink_loop",
    "fifo",
    "endless_device",
    "hardlink_to_victim",
    "deep_tree",
    "oversized",
    "dir_swapped",
    "deleted",
    "appearing",
)
DEADLINE_SECONDS = 20.0
DEEP = 200

# (function name in os, index of the path argument, keyword holding the directory descriptor)
WRAPPED = (
    ("open", 0, "dir_fd"),
    ("stat", 0, "dir_fd"),
    ("lstat", 0, "dir_fd"),
    ("rename", 0, "src_dir_fd"),
    ("replace", 0, "src_dir_fd"),
    ("unlink", 0, "dir_fd"),
    ("remove", 0, "dir_fd"),
    ("rmdir", 0, "dir_fd"),
    ("mkdir", 0, "dir_fd"),
    ("listdir", 0, None),
    ("scandir", 0, None),
    ("readlink", 0, "dir_fd"),
)


@dataclass(frozen=True)
class Access:
    """One filesystem call: the function and the full path of the entry it names."""

    function: str
    path: str


def _resolve(target: Any, dir_fd: int | None) -> str | None:
    if isinstance(target, int) or target is None:
        return None
    name = os.fsdecode(target)
    if dir_fd is not None and not os.path.isabs(name):
        try:
            base = _REAL["readlink"](f"/proc/self/fd/{dir_fd}")
        except OSError:
            return None
        return os.path.normpath(os.path.join(base, name))
    return os.path.abspath(name)


_REAL: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name, _, _ in WRAPPED}
_REAL_OPEN = builtins.open


class Interposer:
    """Records the accesses under ``roots`` and, when armed, substitutes one entry before one access."""

    def __init__(self, roots: list[str], victim: str) -> None:
        self.roots = [os.path.abspath(r) + os.sep for r in roots]
        self.victim = victim
        self.accesses: list[Access] = []
        self.armed: tuple[int, str] | None = None
        self.fired: str | None = None
        self._lock = threading.RLock()
        self._busy = threading.local()

    def _attackable(self, path: str) -> bool:
        if not any(path.startswith(r) for r in self.roots):
            return False
        try:
            parent = _REAL["stat"](os.path.dirname(path))
        except OSError:
            return False
        return bool(parent.st_mode & stat.S_IWOTH)

    def before(self, function: str, path: str | None) -> None:
        if path is None or getattr(self._busy, "on", False) or not self._attackable(path):
            return
        with self._lock:
            index = len(self.accesses)
            self.accesses.append(Access(function, path))
            if self.armed is not None and self.armed[0] == index:
                self._busy.on = True
                try:
                    substitute(path, self.armed[1], self.victim)
                    self.fired = f"{function} {path}"
                finally:
                    self._busy.on = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interposer]:
        originals = {}
        for name, position, fd_key in WRAPPED:
            originals[name] = getattr(os, name)
            setattr(os, name, self._wrap(name, position, fd_key))
        builtins.open = self._wrap_open()  # type: ignore[assignment]
        try:
            yield self
        finally:
            for name, real in originals.items():
                setattr(os, name, real)
            builtins.open = _REAL_OPEN

    def _wrap(self, name: str, position: int, fd_key: str | None) -> Callable[..., Any]:
        real = _REAL[name]

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            target = args[position] if len(args) > position else kwargs.get("path", ".")
            self.before(name, _resolve(target, kwargs.get(fd_key) if fd_key else None))
            return real(*args, **kwargs)

        return wrapped

    def _wrap_open(self) -> Callable[..., Any]:
        def wrapped(file: Any, *args: Any, **kwargs: Any) -> Any:
            self.before("builtins.open", _resolve(file, None))
            return _REAL_OPEN(file, *args, **kwargs)

        return wrapped


def _clear(path: str) -> None:
    try:
        info = _REAL["lstat"](path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        _REAL["unlink"](path)


def substitute(path: str, kind: str, victim: str) -> None:
    """Puts the hostile ``kind`` at ``path`` (what was there is moved away or removed)."""
    if kind == "dir_swapped":
        with contextlib.suppress(OSError):
            _REAL["rename"](path, f"{path}.moved-{random.randrange(1 << 30)}")
        _clear(path)
        _REAL["mkdir"](path)
        with _REAL_OPEN(os.path.join(path, "planted.safetensors"), "wb") as fh:
            fh.write(b"attacker bytes")
        return
    _clear(path)
    if kind == "symlink_to_victim":
        os.symlink(victim, path)
    elif kind == "symlink_loop":
        os.symlink(os.path.basename(path), path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "endless_device":
        os.symlink("/dev/zero", path)
    elif kind == "hardlink_to_victim":
        os.link(victim, path)
    elif kind == "deep_tree":
        current = path
        for _ in range(DEEP):
            _REAL["mkdir"](current)
            current = os.path.join(current, "d")
    elif kind == "oversized":
        with _REAL_OPEN(path, "wb") as fh:
            fh.truncate(64 << 30)  # sparse: 64 GiB that take no disk
    elif kind == "appearing":
        with _REAL_OPEN(path, "wb") as fh:
            fh.write(b"attacker bytes")
    elif kind != "deleted":
        raise ValueError(kind)


def tree_digest(paths: list[str]) -> dict[str, str]:
    """SHA-256 of every regular file under ``paths`` (links not followed): what must not change."""
    out = {}
    for top in paths:
        for base, _dirs, files in os.walk(top):
            for name in files:
                full = os.path.join(base, name)
                if stat.S_ISREG(_REAL["lstat"](full).st_mode):
                    with _REAL_OPEN(full, "rb") as fh:
                        out[full] = hashlib.sha256(fh.read()).hexdigest()
    return out


@dataclass
class Outcome:
    kind: str  # ok, refused, crash, hang
    detail: str = ""
    value: Any = None


def run_bounded(operation: Callable[[], Any], deadline: float = DEADLINE_SECONDS) -> Outcome:
    """Runs ``operation`` in a thread; a FIFO left blocking it is opened for writing to let it go."""
    box: dict[str, Outcome] = {}

    def body() -> None:
        try:
            box["o"] = Outcome("ok", value=operation())
        except (WardenError, OSError) as exc:
            box["o"] = Outcome("refused", f"{type(exc).__name__}: {exc}"[:300])
        except BaseException as exc:
            box["o"] = Outcome("crash", f"{type(exc).__name__}: {exc}"[:300])

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        return Outcome("hang", f"still running after {deadline:.0f}s")
    return box["o"]


@dataclass
class Report:
    """Combinations tried and their outcomes, per operation."""

    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, operation: str, outcome: str) -> None:
        row = self.rows.setdefault(operation, {})
        row[outcome] = row.get(outcome, 0) + 1

    def total(self) -> int:
        return sum(sum(r.values()) for r in self.rows.values())

    def describe(self) -> str:
        lines = [f"{self.total()} (operation, access point, substitution) combinations"]
        for op, row in sorted(self.rows.items()):
            lines.append(f"  {op}: " + ", ".join(f"{k} {v}" for k, v in sorted(row.items())))
        return "\n".join(lines)


@dataclass
class Operation:
    """One operation under attack: ``setup(scratch)`` builds a fresh world and returns a context;
    ``run(context)`` performs the operation; ``check(context, outcome)`` returns the violated
    invariants (empty when they hold). ``roots(context)`` are the attacker-writable roots and
    ``protected(context)`` the places nothing may be written to."""

    name: str
    setup: Callable[[str], Any]
    run: Callable[[Any], Any]
    check: Callable[[Any, Outcome], list[str]]
    roots: Callable[[Any], list[str]]
    protected: Callable[[Any], list[str]]
    victim: Callable[[Any], str]


def attack(operation: Operation, scratch_factory: Callable[[], str], report: Report, sample: float, seed: int) -> None:
    """Every (access point, substitution) of ``operation``, or a seeded ``sample`` fraction of them."""
    dry = operation.setup(scratch_factory())
    recorder = Interposer(operation.roots(dry), operation.victim(dry))
    with recorder.installed():
        baseline = run_bounded(lambda: operation.run(dry))
    if baseline.kind != "ok":
        report.failures.append(f"{operation.name}: fails without any attack: {baseline.detail}")
        return
    combos = [(i, kind) for i in range(len(recorder.accesses)) for kind in SUBSTITUTIONS]
    rng = random.Random(seed)
    chosen = combos if sample >= 1 else rng.sample(combos, max(1, int(len(combos) * sample)))
    for index, kind in chosen:
        context = operation.setup(scratch_factory())
        protected = tree_digest(operation.protected(context))
        interposer = Interposer(operation.roots(context), operation.victim(context))
        interposer.armed = (index, kind)
        with interposer.installed():
            outcome = run_bounded(lambda context=context: operation.run(context))
        if outcome.kind == "hang":
            _unblock(operation.roots(context))
        where = f"{operation.name} #{index} {kind} ({interposer.fired or 'not reached'})"
        problems = []
        if outcome.kind in ("crash", "hang"):
            problems.append(f"{outcome.kind}: {outcome.detail}")
        if tree_digest(operation.protected(context)) != protected:
            problems.append("a protected file changed")
        problems += operation.check(context, outcome)
        report.add(operation.name, outcome.kind if not problems else "VIOLATED")
        report.failures += [f"{where}: {p}" for p in problems]


def _unblock(roots: list[str]) -> None:
    """Opens every FIFO under ``roots`` for writing, so a reader blocked on one returns."""
    for top in roots:
        for base, _dirs, files in os.walk(top):
            for name in files:
                full = os.path.join(base, name)
                with contextlib.suppress(OSError):
                    if stat.S_ISFIFO(_REAL["lstat"](full).st_mode):
                        fd = _REAL["open"](full, os.O_WRONLY | os.O_NONBLOCK)
                        os.close(fd)


def errno_name(exc: BaseException) -> str:
    return errno.errorcode.get(getattr(exc, "errno", 0) or 0, "")
