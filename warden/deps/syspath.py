"""The target interpreter's import path (``sys.path``), computed by reading files, never by running it.

The auditor never executes anything the target controls: starting the target's interpreter runs
its stdlib (``site``, ``encodings``, a planted ``sitecustomize``), and with the auditor's
credentials that code could rewrite the baseline the audit compares against. Everything CPython's
path computation (``getpath``) and ``site`` use is a file that can be read instead:

- the venv: ``pyvenv.cfg`` beside the executable or one directory up (``home``, ``executable``,
  ``include-system-site-packages``, ``version``);
- the base prefix: the first directory up from the base executable holding the stdlib landmark
  ``<platlibdir>/pythonX.Y/os.py`` (``lib-dynload`` for the exec prefix);
- build data: ``_sysconfigdata_*.py`` of the stdlib, parsed as a literal (``ast.literal_eval``, so
  nothing in it runs): ``SOABI`` (the bytecode cache tag), ``PLATLIBDIR``; the full version from
  ``include/pythonX.Y/patchlevel.h`` or ``pyvenv.cfg``;
- a ``._pth`` file beside the executable as invoked or beside its resolved binary: it replaces the
  whole path (lines relative to its directory, which becomes the prefix) and turns ``site`` off
  unless it has an ``import site`` line (with it, the venv and the user site are handled as usual);
- ``site``: the venv's site directory, the user site (``<home>/.local/lib/pythonX.Y/site-packages``,
  when the interpreter would enable it: no venv, or a venv with system site-packages), then the base
  prefixes' site directories; each followed by its ``.pth`` files in name order: a path line adds
  an existing path, an ``import`` line runs (an editable install's finder: its ``MAPPING`` /
  ``NAMESPACES`` literals name the directories it imports from);
- environment files the deployment names (``KEY=VALUE`` lines): ``PYTHONPATH`` entries come first,
  ``PYTHONHOME`` replaces the prefix search.

An ``import`` line that raises makes ``site`` skip the rest of its file; the lines after it are
counted all the same (more is audited, never less).

What this cannot know is reported in ``notes``; a note starting with ``partial:`` means the path may
hold more than was computed (an unreadable ``.pth``, a finder whose targets are not literals): the
audit is then incomplete (exit 3), never silently narrower. Not computed at all: an ``import`` line
of a ``.pth`` other than a recognised finder (its effect is code; its file is a finding unless
allowed by digest, pth.py), and the script directory or ``''`` an invocation puts first. A
Debian-patched ``site`` (``dist-packages``) is recognised by the text of ``site.py``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from warden.deps.errors import TargetError
from warden.deps.walk import read_small

CONFIG_LIMIT = 1024 * 1024
PARTIAL = "partial: "  # a note saying the path may hold more than was computed (the audit is incomplete)
BUILD_DATA_LIMIT = 8 * 1024 * 1024
_PY_NAME = re.compile(r"python([0-9]+)\.([0-9]+)t?\Z")
_FINDER_LINE = re.compile(r"import (__editable___[A-Za-z0-9_]+_finder); \1\.install\(\)\s*\Z")
_PATCHLEVEL = re.compile(rb'#define\s+PY_VERSION\s+"([0-9]+\.[0-9]+\.[0-9]+[a-z0-9]*)"')


@dataclass(frozen=True)
class PathEntry:
    """One entry of the computed ``sys.path``: as the interpreter writes it, and why it is there."""

    path: str
    origin: str


@dataclass(frozen=True)
class Layout:
    """What the target interpreter would import from, computed by reading files (see the module doc)."""

    requested: str
    venv: str | None
    base_executable: str
    version: tuple[int, int]
    full_version: str
    prefix: str
    exec_prefix: str
    platlibdir: str
    stdlib: str | None
    platstdlib: str | None
    cache_tag: str | None
    sys_path: tuple[PathEntry, ...]
    site_dirs: tuple[str, ...]  # existing site directories, in the order site adds them
    base_site: tuple[str, ...]  # the base interpreter's site directories that exist
    user_site: str | None  # enabled and existing
    pth_config: tuple[str, ...]  # ._pth files beside the interpreter (the one in effect first)
    exec_lines: tuple[tuple[str, str], ...]  # (.pth file, import line)
    editable: tuple[tuple[str, str, str], ...]  # (module name, path it maps to, finder file)
    notes: tuple[str, ...] = field(default_factory=tuple)
    env_files: tuple[tuple[str, str], ...] = ()  # (env file, sha256 of its content): in the baseline
    env_problems: tuple[tuple[str, str], ...] = ()  # env_problems() of the env files


def pyvenv_cfg_lines(data: bytes) -> list[str]:
    """The lines of a pyvenv.cfg as CPython reads them: split at ``\\r\\n``, ``\\r`` and ``\\n`` only
    (getpath's reader and site's text file), never at the other breaks ``str.splitlines`` knows (pure)."""
    return re.split(r"\r\n|\r|\n", data.decode("utf-8", "replace"))


def parse_pyvenv_cfg(data: bytes) -> dict[str, str]:
    """``key = value`` lines of a pyvenv.cfg as CPython reads them (pure): keys and values stripped
    as site.py strips them (``str.strip``, so ``\\x0b`` too), keys lower-cased; ``home`` from the first
    line naming it (getpath stops there and so picks the prefix), every other key from the last (site.py)."""
    out: dict[str, str] = {}
    for line in pyvenv_cfg_lines(data):
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if sep and not (key == "home" and "home" in out):
            out[key] = value.strip()
    return out


PYVENV_KEYS = frozenset(
    {
        "home",
        "include-system-site-packages",
        "version",
        "version_info",
        "executable",
        "command",
        "implementation",
        "prompt",
        "virtualenv",
        "uv",
        "base-prefix",
        "base-exec-prefix",
        "base-executable",
    }
)


def pyvenv_cfg_problems(data: bytes) -> list[str]:
    """Lines of a pyvenv.cfg that are not a plain ``key = value`` of a known key, given once (pure):
    what CPython reads of any other line (a key with a control character stripped off, a second
    ``home``, a comment holding ``=``) may differ from what a reader expects, so each is a finding."""
    out: list[str] = []
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        out.append("not UTF-8 (site.py fails on it)")
    seen: set[str] = set()
    for number, line in enumerate(pyvenv_cfg_lines(data), 1):
        if not line:
            continue
        m = re.fullmatch(r"([a-z][a-z_-]*) = (.*)", line)
        value = m.group(2) if m else ""
        read_key = line.partition("=")[0].strip().lower()  # the key as CPython reads it
        plain = (
            m is not None
            and m.group(1) in PYVENV_KEYS
            and read_key not in seen
            and value == value.strip()
            and value.isprintable()
        )
        if not plain:
            out.append(f"line {number} {line[:200]!r} is not a plain 'key = value' line of a known key, given once")
        seen.add(read_key)
    return out


def parse_env_file(data: bytes) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` and quotes allowed, ``#`` comments) of an environment file (pure)."""
    out: dict[str, str] = {}
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith("export "):
            line = line[7:].strip()
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


# Environment variables: the ones syspath models, the ones known to change nothing that is imported,
# and what else changes the interpreter or the dynamic loader (each of those is a finding).
MODELLED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE")
INERT_ENV = frozenset(
    {
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONIOENCODING",
        "PYTHONHASHSEED",
        "PYTHONUTF8",
        "PYTHONFAULTHANDLER",
        "PYTHONSAFEPATH",
    }
)
_LOADING_ENV = re.compile(r"(PYTHON|LD_|DYLD_|__PYVENV_LAUNCHER__)|(GLIBC_TUNABLES|GCONV_PATH|LOCPATH|HOME)\Z")


def env_value(env: Mapping[str, str], name: str) -> str | None:
    """A ``PYTHON*`` variable as CPython reads it: set to the empty string is not set (getpath and
    the config read them through ``config_get_env``, site.py ``PYTHONUSERBASE`` with a truth test)."""
    return env.get(name) or None


def env_problems(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, why) for each variable of the env files that changes the interpreter or the dynamic
    loader and is neither modelled here nor inert (pure). An empty ``PYTHON*`` one is not set."""
    out = []
    for name, value in sorted(env.items()):
        if name in MODELLED_ENV or name in INERT_ENV or not _LOADING_ENV.match(name):
            continue
        if name.startswith("PYTHON") and not value:
            continue
        why = "moves bytecode caches outside the audited trees" if name == "PYTHONPYCACHEPREFIX" else ""
        out.append((name, why or "changes what the interpreter or the dynamic loader loads; not modelled"))
    return out


def pth_lines(data: bytes, version: tuple[int, int] = (3, 11)) -> tuple[list[str], list[str]]:
    """(path lines, import lines) of a ``.pth`` file as ``site.addpackage`` of Python ``version``
    reads it (pure): before 3.13 a text file in universal-newline mode (split at ``\\r\\n``, ``\\r``
    and ``\\n`` only, a ``\\x0b`` stays inside its line), from 3.13 on ``str.splitlines``."""
    text = data.decode("utf-8", "surrogateescape")
    lines = text.splitlines() if version >= (3, 13) else re.split(r"\r\n|\r|\n", text)
    paths: list[str] = []
    imports: list[str] = []
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith(("import ", "import\t")):
            imports.append(line)
        else:
            paths.append(line.rstrip())
    return paths, imports


def finder_targets(source: bytes) -> dict[str, list[str]] | None:
    """Module name -> paths of an editable finder module (setuptools' ``MAPPING`` and
    ``NAMESPACES`` literals), parsed, never run (pure). None if it has neither as a literal."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    out: dict[str, list[str]] = {}
    found = False
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or target.id not in ("MAPPING", "NAMESPACES") or value is None:
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if not isinstance(literal, dict):
            return None
        found = True
        for name, paths in literal.items():
            for p in [paths] if isinstance(paths, str) else list(paths or ()):
                if isinstance(name, str) and isinstance(p, str):
                    out.setdefault(name, []).append(p)
    return out if found else None


def build_vars(source: bytes) -> dict[str, object]:
    """``build_time_vars`` of a ``_sysconfigdata_*.py``, parsed as a literal (pure; {} if not one)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "build_time_vars"
        ):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def zip_entry(path: str) -> bool:
    """Whether the ``sys.path`` entry ``path`` is covered as a zip (stdlib.py: its digest and its
    start-up hooks): named ``*.zip`` and a regular file by type (links followed, as the path finder
    sees it), or absent (recorded absent: its appearance is found). A directory so named is walked like
    any directory; a regular file of another name is a closure file (closure.py hashes it)."""
    return path.endswith(".zip") and (_regular(path) or not os.path.lexists(path))


def read_config(path: str, limit: int = CONFIG_LIMIT) -> bytes:
    """A configuration file the interpreter would read (it follows links, so this does: the link is
    resolved first, the file itself opened without following, non-blocking and capped). Raises OSError."""
    return read_small(os.path.realpath(path), limit)


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _read_or_none(path: str, limit: int = CONFIG_LIMIT) -> bytes | None:
    try:
        return read_config(path, limit)
    except OSError:
        return None


def is_binary(path: str) -> bool:
    """Whether ``path`` starts like an executable binary (ELF, Mach-O), not like a script."""
    try:
        head = read_small(path, 4)
    except OSError:
        return False
    return head in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def venv_dir(executable: str) -> str | None:
    """The directory whose ``pyvenv.cfg`` the interpreter at ``executable`` (as invoked) reads."""
    bin_dir = os.path.dirname(executable)
    for candidate in (bin_dir, os.path.dirname(bin_dir)):
        if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
            return candidate
    return None


def _search_up(start: str, landmarks: Sequence[str]) -> str | None:
    current = start
    while True:
        if any(
            os.path.isfile(os.path.join(current, lm)) or os.path.isdir(os.path.join(current, lm)) for lm in landmarks
        ):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _version_of(base: str, cfg: Mapping[str, str], start: str) -> tuple[int, int] | None:
    for name in (os.path.basename(base), os.path.basename(os.path.realpath(base))):
        if m := _PY_NAME.match(name):
            return int(m.group(1)), int(m.group(2))
    for key in ("version_info", "version"):
        if m := re.match(r"([0-9]+)\.([0-9]+)", cfg.get(key, "")):
            return int(m.group(1)), int(m.group(2))
    current = start  # the only pythonX.Y stdlib found going up from the binary
    while True:
        for libdir in ("lib", "lib64"):
            try:
                names = os.listdir(os.path.join(current, libdir))
            except OSError:
                continue
            found = [
                n for n in names if _PY_NAME.match(n) and os.path.isfile(os.path.join(current, libdir, n, "os.py"))
            ]
            if len(found) == 1 and (m := _PY_NAME.match(found[0])):
                return int(m.group(1)), int(m.group(2))
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _build_data(stdlib: str, notes: list[str]) -> dict[str, object]:
    try:
        names = sorted(n for n in os.listdir(stdlib) if n.startswith("_sysconfigdata_") and n.endswith(".py"))
    except OSError:
        names = []
    if not names:
        notes.append(f"{stdlib}: no _sysconfigdata_*.py: the bytecode tag and platlibdir are assumed")
        return {}
    if len(names) > 1:
        notes.append(f"{stdlib}: several build data files {names}; {names[0]} read")
    data = _read_or_none(os.path.join(stdlib, names[0]), BUILD_DATA_LIMIT)
    return build_vars(data) if data is not None else {}


def _full_version(prefix: str, short: str, cfg: Mapping[str, str], notes: list[str]) -> str:
    header = _read_or_none(os.path.join(prefix, "include", f"python{short}", "patchlevel.h"), 256 * 1024)
    if header and (m := _PATCHLEVEL.search(header)):
        return m.group(1).decode()
    for key in ("version_info", "version"):
        if re.fullmatch(rf"{re.escape(short)}\.[0-9]+", cfg.get(key, "")):
            return cfg[key]
    notes.append(f"the patch level of Python {short} is not known from any file: {short}.0 assumed")
    return f"{short}.0"


def _pth_file(candidates: Iterable[str]) -> list[str]:
    out: list[str] = []
    for exe in candidates:
        path = exe + "._pth"
        if path not in out and os.path.isfile(path):
            out.append(path)
    return out


def _site_dirs(prefixes: Sequence[str], version: tuple[int, int], platlibdir: str, debian: bool) -> list[str]:
    short = f"{version[0]}.{version[1]}"
    out: list[str] = []
    for prefix in prefixes:
        if debian and not os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
            candidates = [
                os.path.join(prefix, "local", "lib", f"python{short}", "dist-packages"),
                os.path.join(prefix, "lib", f"python{version[0]}", "dist-packages"),
                os.path.join(prefix, "lib", f"python{short}", "dist-packages"),
            ]
        else:
            libdirs = [platlibdir] + (["lib"] if platlibdir != "lib" else [])
            candidates = [os.path.join(prefix, d, f"python{short}", "site-packages") for d in libdirs]
        out.extend(c for c in candidates if c not in out)
    return out


class _Path:
    """``sys.path`` as ``site`` builds it: no duplicates (by absolute, normalised path)."""

    def __init__(self) -> None:
        self.entries: list[PathEntry] = []
        self.known: set[str] = set()

    def add(self, path: str, origin: str) -> bool:
        key = os.path.normcase(os.path.abspath(path))
        if key in self.known:
            return False
        self.known.add(key)
        self.entries.append(PathEntry(os.path.abspath(path), origin))
        return True


def _add_site_dir(
    site_dir: str,
    path: _Path,
    exec_lines: list[tuple[str, str]],
    editable: list[tuple[str, str, str]],
    notes: list[str],
    version: tuple[int, int] = (3, 11),
) -> None:
    """``site.addsitedir``: the directory, then the path lines of its ``.pth`` files in name order."""
    path.add(site_dir, "site")
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth") and not n.startswith("."))
    except OSError as exc:
        notes.append(f"{PARTIAL}{site_dir}: cannot list its .pth files ({exc.strerror or exc})")
        return
    for name in names:
        pth = os.path.join(site_dir, name)
        data = _read_or_none(pth)
        if data is None and not _regular(pth):
            notes.append(f"{pth}: not a regular file, never read (a finding of its own: special_file)")
            continue
        if data is None:
            notes.append(f"{PARTIAL}{pth}: not readable: the paths it adds are not known")
            continue
        lines, imports = pth_lines(data, version)
        for line in lines:
            target = os.path.join(site_dir, line)
            if os.path.exists(target):
                path.add(target, f"pth:{pth}")
        for line in imports:
            exec_lines.append((pth, line))
            _import_line(site_dir, pth, line, editable, notes)


def _import_line(site_dir: str, pth: str, line: str, editable: list[tuple[str, str, str]], notes: list[str]) -> None:
    m = _FINDER_LINE.match(line.strip())
    if not m:
        return  # code: the .pth is allowed by its digest or is a finding (pth.py); exec_lines keeps it
    finder = os.path.join(site_dir, m.group(1) + ".py")
    data = _read_or_none(finder)
    targets = finder_targets(data) if data is not None else None
    if targets is None:
        notes.append(
            f"{PARTIAL}{finder}: editable finder without MAPPING/NAMESPACES literals: its targets are not known"
        )
        return
    for name, paths in sorted(targets.items()):
        for p in paths:
            editable.append((name, os.path.abspath(p), finder))


def site_dir_closure(
    site_dir: str,
) -> tuple[tuple[PathEntry, ...], tuple[tuple[str, str], ...], tuple[tuple[str, str, str], ...], tuple[str, ...]]:
    """(path entries, import lines, editable targets, notes) one site directory adds by itself."""
    path = _Path()
    exec_lines: list[tuple[str, str]] = []
    editable: list[tuple[str, str, str]] = []
    notes: list[str] = []
    _add_site_dir(site_dir, path, exec_lines, editable, notes)
    return tuple(path.entries), tuple(exec_lines), tuple(editable), tuple(notes)


def compute_layout(
    python: str, user_homes: Sequence[str] = (), env_files: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> Layout:
    """The import path of the interpreter at ``python`` (see the module doc). Raises TargetError."""
    requested = os.path.abspath(python)
    if not os.path.lexists(requested):
        raise TargetError(f"--python {python}: no such interpreter")
    if not os.path.exists(requested):
        raise TargetError(f"--python {python}: a link to nothing")
    notes: list[str] = []
    env = dict(environ or {})
    env_digests: list[tuple[str, str]] = []
    for env_file in env_files:
        data = _read_or_none(env_file)
        if data is None:
            notes.append(f"{PARTIAL}{env_file}: environment file not readable")
            continue
        env_digests.append((os.path.abspath(env_file), "sha256:" + hashlib.sha256(data).hexdigest()))
        env.update(parse_env_file(data))
    venv = venv_dir(requested)
    cfg: dict[str, str] = {}
    if venv:
        data = _read_or_none(os.path.join(venv, "pyvenv.cfg"))
        if data is None:
            raise TargetError(f"{venv}/pyvenv.cfg: not readable")
        cfg = parse_pyvenv_cfg(data)
    real = os.path.realpath(requested)
    if venv is None and not is_binary(real):
        raise TargetError(f"--python {python}: {real} is not an interpreter binary (a script is never run)")
    start = (
        os.path.dirname(cfg["home"].rstrip(os.sep))
        if venv and cfg.get("home")
        else os.path.dirname(os.path.dirname(real))
    )
    version = _version_of(real, cfg, start)
    if version is None:
        raise TargetError(f"--python {python}: its Python version cannot be told from its files (not run)")
    short = f"{version[0]}.{version[1]}"
    base = real
    if venv and cfg.get("executable") and os.path.isfile(cfg["executable"]):
        base = os.path.realpath(cfg["executable"])
    elif venv and cfg.get("home"):
        home_bin = cfg["home"]
        for name in [os.path.basename(requested), os.path.basename(real), f"python{short}", "python3", "python"]:
            if os.path.isfile(os.path.join(home_bin, name)):
                base = os.path.realpath(os.path.join(home_bin, name))
                break
    pth_config = _pth_file([requested, real, base])
    home = env_value(env, "PYTHONHOME")
    platlibdir = "lib"
    if pth_config:
        prefix = exec_prefix = os.path.dirname(pth_config[0])
    elif home:
        prefix, _, exec_prefix = home.partition(os.pathsep)
        exec_prefix = exec_prefix or prefix
    else:
        bin_dir = cfg["home"] if venv and cfg.get("home") else os.path.dirname(base)
        found = None
        for libdir in ("lib", "lib64"):
            found = _search_up(bin_dir, [f"{libdir}/python{short}/os.py", f"{libdir}/python{short}/os.pyc"])
            if found:
                platlibdir = libdir
                break
        if found is None:
            raise TargetError(f"--python {python}: no stdlib of Python {short} above {bin_dir}")
        prefix = found
        exec_prefix = _search_up(bin_dir, [f"{platlibdir}/python{short}/lib-dynload"]) or prefix
    stdlib = os.path.join(prefix, platlibdir, f"python{short}")
    platstdlib = os.path.join(exec_prefix, platlibdir, f"python{short}")  # sysconfig's platstdlib
    dynload = os.path.join(platstdlib, "lib-dynload")
    bvars = _build_data(stdlib, notes) if os.path.isdir(stdlib) else {}
    platlibdir = str(bvars.get("PLATLIBDIR") or platlibdir)
    soabi = str(bvars.get("SOABI") or "")
    cache_tag = "-".join(soabi.split("-")[:2]) if soabi.startswith("cpython-") else f"cpython-{version[0]}{version[1]}"
    full = _full_version(prefix, short, cfg, notes)
    path = _Path()
    exec_lines: list[tuple[str, str]] = []
    editable: list[tuple[str, str, str]] = []
    site_enabled = True
    user_enabled = True
    if pth_config:
        data = _read_or_none(pth_config[0])
        lines, imports = pth_lines(data or b"", version)
        site_enabled = any(i.strip() == "import site" for i in imports)
        # A ._pth sets isolated mode, yet CPython 3.11 still enables the user site once `import site`
        # runs (the coverage property test found it): it is not switched off here.
        pth_dir = os.path.dirname(pth_config[0])
        for line in lines:
            path.add(os.path.join(pth_dir, line), f"_pth:{pth_config[0]}")
    else:
        pythonpath = env_value(env, "PYTHONPATH")
        for entry in pythonpath.split(os.pathsep) if pythonpath else []:
            if os.path.isabs(entry):
                path.add(entry, "env:PYTHONPATH")
            else:  # CPython: abspath(entry), '' the working directory itself: the target's, not known here
                notes.append(
                    f"{PARTIAL}PYTHONPATH entry {entry!r} is relative to the target's working directory "
                    "(an empty one is that directory), which is not known here"
                )
        path.add(os.path.join(prefix, platlibdir, f"python{version[0]}{version[1]}.zip"), "stdlib-zip")
        path.add(stdlib, "stdlib")
        path.add(dynload, "lib-dynload")
    base_sites = _site_dirs([prefix, exec_prefix], version, platlibdir, _debian_site(stdlib))
    prefixes = [prefix, exec_prefix]
    if venv:
        system = cfg.get("include-system-site-packages", "false").lower() == "true"
        prefixes = [venv, *(prefixes if system else [])]
        user_enabled = user_enabled and system
    user_site = None
    site_dirs: list[str] = []
    if site_enabled:
        debian = _debian_site(stdlib)

        def add_sites(dirs: Iterable[str]) -> None:
            for site_dir in dirs:
                if os.path.isdir(site_dir) and site_dir not in site_dirs:
                    _add_site_dir(site_dir, path, exec_lines, editable, notes, version)
                    site_dirs.append(site_dir)

        if venv:  # site.venv() adds the venv's own site directories first, ahead of the user site
            add_sites(_site_dirs([venv], version, platlibdir, debian))
        if user_enabled and env_value(env, "PYTHONNOUSERSITE") is None:
            user_site = _user_site(user_homes, env, version)
            if user_site:
                add_sites([user_site])
        add_sites(_site_dirs(prefixes, version, platlibdir, debian))
    return Layout(
        requested=requested,
        venv=venv,
        base_executable=base,
        version=version,
        full_version=full,
        prefix=prefix,
        exec_prefix=exec_prefix,
        platlibdir=platlibdir,
        stdlib=stdlib if os.path.isdir(stdlib) else None,
        platstdlib=platstdlib if os.path.isdir(platstdlib) else None,
        cache_tag=cache_tag,
        sys_path=tuple(path.entries),
        site_dirs=tuple(site_dirs),
        base_site=tuple(d for d in base_sites if os.path.isdir(d)),
        user_site=user_site,
        pth_config=tuple(dict.fromkeys([*pth_config, *_pth_file(_sibling_pythons(requested, venv))])),
        exec_lines=tuple(exec_lines),
        editable=tuple(editable),
        notes=tuple(notes),
        env_files=tuple(env_digests),
        env_problems=tuple(env_problems(env)),
    )


def _sibling_pythons(requested: str, venv: str | None) -> list[str]:
    """Every ``python*`` beside the requested one (another name may be the one invoked)."""
    bin_dir = os.path.dirname(requested)
    try:
        names = sorted(os.listdir(bin_dir)) if venv else []
    except OSError:
        return []
    return [os.path.join(bin_dir, n) for n in names if re.fullmatch(r"python([0-9]+(\.[0-9]+)?t?)?", n)]


def _debian_site(stdlib: str) -> bool:
    data = _read_or_none(os.path.join(stdlib, "site.py"), 512 * 1024)
    return bool(data and b"dist-packages" in data)


def _user_site(user_homes: Sequence[str], env: Mapping[str, str], version: tuple[int, int]) -> str | None:
    """The first existing user site directory of the homes the interpreter may run under."""
    userbase = env_value(env, "PYTHONUSERBASE")
    bases = [userbase] if userbase else [os.path.join(h, ".local") for h in user_homes]
    for base in bases:
        candidate = os.path.join(base, "lib", f"python{version[0]}.{version[1]}", "site-packages")
        if os.path.isdir(candidate):
            return candidate
    return None
