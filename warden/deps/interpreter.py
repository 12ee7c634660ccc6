"""The interpreter around site-packages: venv files, startup hooks, the base interpreter.

Code can run at interpreter start-up without touching a distribution: ``sitecustomize`` /
``usercustomize`` anywhere on ``sys.path`` (the base stdlib included), a ``pyvenv.cfg``
whose ``home`` selects another interpreter (and so another stdlib), a ``bin/python`` that
is a wrapper setting ``PYTHONPATH``, an ``activate`` script exporting it. These checks
need no baseline (the approved baseline adds digests of the same files, baseline.py):

- ``startup_hook``: a ``sitecustomize``/``usercustomize`` module or package in a directory
  the interpreter imports from, unless its content digest is on ``integrity.startup_allow``.
- ``venv_config``: ``pyvenv.cfg`` names a ``home``/``executable`` that is not the
  interpreter ``bin/python`` runs, or cannot be read.
- ``interpreter_replaced``: a ``bin/python*`` that is neither a link to the base
  interpreter nor a byte-identical copy of it (a wrapper script, a rebuilt binary). Outside a
  venv, an interpreter that is not a binary is refused by discovery (syspath.py), never run.
- ``venv_script_changed``: an ``activate`` script that does not match the venv template of
  the base stdlib (only the venv's directory, name and prompt may vary).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence

from warden.deps.environment import Target
from warden.deps.model import Finding
from warden.deps.syspath import parse_pyvenv_cfg, pyvenv_cfg_problems, zip_entry
from warden.deps.walk import Budget, kind_of, read_small, sha256_hex
from warden.errors import quote_untrusted

ENV_KINDS = ("startup_hook", "venv_config", "interpreter_replaced", "venv_script_changed")
HOOK_NAMES = ("sitecustomize", "usercustomize")
VENV_SCRIPTS = {
    "activate": "common/activate",
    "Activate.ps1": "common/Activate.ps1",
    "activate.csh": "posix/activate.csh",
    "activate.fish": "posix/activate.fish",
}
# What a placeholder of the venv template may expand to: no quote, newline, `$`, backtick,
# backslash or `;`, so the varying part cannot add a shell command or a variable.
_PLACEHOLDER = r"[^\n\r\"'$`\\;]*"
_PLACEHOLDERS = re.compile(r"__VENV_(?:DIR|NAME|PROMPT|BIN_NAME|PYTHON)__")


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex matching ``template`` with each ``__VENV_*__`` placeholder replaced (pure)."""
    parts = _PLACEHOLDERS.split(template)
    return re.compile(_PLACEHOLDER.join(re.escape(p) for p in parts), re.DOTALL)


def _f(kind: str, path: str, message: str, **details: object) -> Finding:
    return Finding("integrity", kind, path, message, True, details)


def is_hook_name(name: str) -> bool:
    """Whether ``name`` (a directory entry) would be imported as a startup hook module."""
    stem = name.split(".", 1)[0]
    return stem in HOOK_NAMES and (name == stem or name.endswith((".py", ".pyc", ".so", ".pyd")))


def startup_hooks(
    dirs: Iterable[str], allow: Sequence[str], budget: Budget | None = None
) -> tuple[list[Finding], list[str]]:
    """(``startup_hook`` findings, unreadable paths) for hook modules in ``dirs``."""
    out: list[Finding] = []
    unreadable: list[str] = []
    seen: set[str] = set()
    for directory in dirs:
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        try:
            names = sorted(os.listdir(real))
        except OSError as exc:
            unreadable.append(f"{real}: cannot list directory ({exc.strerror or exc})")
            continue
        for name in names:
            if is_hook_name(name):
                out.extend(_hook_finding(os.path.join(real, name), allow, unreadable, budget))
    return out, unreadable


def _hook_finding(path: str, allow: Sequence[str], unreadable: list[str], budget: Budget | None) -> list[Finding]:
    if os.path.isdir(path) and not os.path.islink(path):
        path = os.path.join(path, "__init__.py")
    try:
        digest = sha256_hex(path, budget)
    except FileNotFoundError:
        digest = "absent"
    except OSError as exc:
        digest = f"unreadable ({exc.strerror or exc})"
    if digest in allow:
        return []
    message = f"{path}: startup hook, imported at every interpreter start-up (sha256 {digest}); not on startup_allow"
    return [_f("startup_hook", path, message, sha256=digest)]


def _interpreter_files(venv: str) -> list[str]:
    bin_dir = os.path.join(venv, "bin")
    try:
        names = sorted(os.listdir(bin_dir))
    except OSError:
        return []
    return [os.path.join(bin_dir, n) for n in names if re.fullmatch(r"python([0-9]+(\.[0-9]+)?t?)?", n)]


def base_interpreter(cfg: Mapping[str, str], pythons: Sequence[str]) -> str | None:
    """The base interpreter ``pyvenv.cfg`` names: ``executable``, else ``home`` + a python name."""
    if cfg.get("executable"):
        return os.path.realpath(cfg["executable"])
    home = cfg.get("home")
    if not home:
        return None
    for name in [*(os.path.basename(p) for p in pythons), "python3", "python"]:
        candidate = os.path.join(home, name)
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return None


def check_venv(target: Target, budget: Budget | None = None) -> tuple[list[Finding], list[str]]:
    """(findings, unreadable paths) of the venv's pyvenv.cfg and bin/python* (none without a venv:
    syspath.py refuses an interpreter outside one that is not a binary)."""
    venv = target.venv
    if not venv:
        return [], []
    cfg_path = os.path.join(venv, "pyvenv.cfg")
    try:
        data = read_small(cfg_path, 64 * 1024)
    except OSError as exc:
        return [_f("venv_config", cfg_path, f"{cfg_path}: not a readable regular file ({exc.strerror or exc})")], []
    cfg = parse_pyvenv_cfg(data)
    pythons = _interpreter_files(venv)
    base = base_interpreter(cfg, pythons)
    out = _config_findings(cfg_path, cfg, base)
    out.extend(_f("venv_config", cfg_path, f"{cfg_path}: {why}") for why in pyvenv_cfg_problems(data))
    out.extend(_python_findings(pythons, base, budget))
    return out, []


def _config_findings(cfg_path: str, cfg: Mapping[str, str], base: str | None) -> list[Finding]:
    home = cfg.get("home")
    if not home or base is None:
        message = f"{cfg_path}: home {quote_untrusted(home)!r} holds no Python interpreter"
        return [_f("venv_config", cfg_path, message, home=home)]
    if os.path.realpath(home) != os.path.dirname(base):
        message = (
            f"{cfg_path}: home {quote_untrusted(home)!r} is not the directory of the interpreter it names "
            f"({base}); the venv would load another interpreter's stdlib"
        )
        return [_f("venv_config", cfg_path, message, home=home, executable=base)]
    return []


def _python_findings(pythons: Sequence[str], base: str | None, budget: Budget | None) -> list[Finding]:
    out = []
    base_digest = None
    for path in pythons:
        if base is None:
            break
        if os.path.islink(path):
            if os.path.realpath(path) == base:
                continue
            why = f"links to {os.path.realpath(path)}, not to the base interpreter {base}"
        else:
            try:
                base_digest = base_digest or sha256_hex(base, budget)
                if sha256_hex(path, budget) == base_digest:
                    continue
                why = f"is not a copy of the base interpreter {base} (a wrapper or a rebuilt binary)"
            except OSError as exc:
                why = f"cannot be compared with the base interpreter ({exc.strerror or exc})"
        out.append(_f("interpreter_replaced", path, f"{path}: {why}", base=base))
    return out


def check_venv_scripts(target: Target, walked: Mapping[str, object]) -> tuple[list[Finding], list[str]]:
    """``venv_script_changed`` for activate scripts that differ from the base stdlib's venv templates."""
    if not target.venv or not target.stdlib:
        return [], []
    out: list[Finding] = []
    unreadable: list[str] = []
    for name, template_rel in VENV_SCRIPTS.items():
        path = os.path.join(target.venv, "bin", name)
        if path not in walked:
            continue
        template_path = os.path.join(target.stdlib, "venv", "scripts", *template_rel.split("/"))
        try:
            template = read_small(template_path, 1024 * 1024).decode("utf-8", "replace")
        except OSError:
            continue  # another tool made this venv: the approved baseline covers its scripts
        try:
            text = read_small(path, 1024 * 1024).decode("utf-8", "replace")
        except OSError as exc:
            kind = kind_of(os.lstat(path).st_mode) if os.path.lexists(path) else "missing"
            if kind != "file":
                out.append(_f("venv_script_changed", path, f"{path}: is a {kind}, not the venv's script"))
            else:
                unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        if not template_pattern(template).fullmatch(text):
            message = f"{path}: differs from the venv template {template_path} (more than the venv's path or prompt)"
            out.append(_f("venv_script_changed", path, message))
    return out, unreadable


def venv_made(venv: str, path: str) -> bool:
    """Whether ``path`` is a file ``python -m venv`` creates (owned by no RECORD; checked here and by the baseline)."""
    prefix = venv.rstrip(os.sep) + os.sep
    if not path.startswith(prefix):
        return False
    rel = os.path.normpath(path[len(prefix) :])
    if rel in ("pyvenv.cfg", "lib64", ".gitignore"):
        return True
    head, _, name = rel.partition(os.sep)
    return head == "bin" and (name in VENV_SCRIPTS or bool(re.fullmatch(r"python([0-9]+(\.[0-9]+)?t?)?", name)))


def hook_dirs(target: Target) -> list[str]:
    """Directories imported from at start-up: the target's computed sys.path (syspath.py: stdlib,
    user site, site dirs, .pth path lines, ._pth lines) and site dirs."""
    dirs = [p for p in target.sys_path if p and not zip_entry(p)]
    if target.stdlib:
        dirs.append(target.stdlib)
    return [*dirs, *target.site_packages]
