"""The environment to audit (the target), discovered without importing anything from it.

- ``--python PATH``: runs that interpreter as ``PATH -I -S -B -c REPORT_SCRIPT`` (isolated,
  no ``site``, so none of its ``.pth`` files or packages run, and no bytecode written); the
  stdlib-only script prints its site-packages, version, pyc tag and marker environment.
- ``--site-packages DIR``: a directory only read (e.g. the trainer's site-packages mounted
  read-only into the sidecar's container). The Python version comes from the path
  (``lib/python3.11/site-packages``) or the ``.pyc`` tags found; other markers from the policy.
- default: the auditor's own interpreter, asked the same way as ``--python``.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.markers import default_environment

from warden.deps.errors import TargetError

REPORT_SENTINEL = "WARDEN-DEPS-REPORT "
REPORT_SCRIPT = (
    f"SENTINEL = {REPORT_SENTINEL!r}\n"
    + r"""
import importlib.util, json, os, platform, site, sys, sysconfig
# -S skips site.main(), which is what makes a venv's prefix current; do its venv step by
# hand, without site.addsitepackages (that would run the target's .pth files).
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
venv = os.path.dirname(exe_dir)
confs = [c for c in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(venv, "pyvenv.cfg")) if os.path.isfile(c)]
prefixes = [sys.prefix, sys.exec_prefix]
base_prefix = sys.prefix
config = {}
if confs:
    system_site = "true"
    with open(confs[0], encoding="utf-8") as fh:
        for line in fh:
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() == "include-system-site-packages":
                system_site = value.strip().lower()
    base = [sys.prefix, sys.exec_prefix]
    sys.prefix = sys.exec_prefix = venv
    prefixes = [venv] + (base if system_site == "true" else [])
    config = {"base": venv, "platbase": venv}
paths = sysconfig.get_paths(vars=config)
# The base interpreter's own directories (before the venv step changed sys.prefix/exec_prefix).
base_paths = sysconfig.get_paths(vars={"platbase": sys.base_exec_prefix, "installed_platbase": sys.base_exec_prefix})
base_site = [p for p in site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]) if os.path.isdir(p)]
found = []
for p in [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages(prefixes)]:
    if p and os.path.isdir(p) and os.path.realpath(p) not in [os.path.realpath(f) for f in found]:
        found.append(p)
def fmt(info):
    v = "%d.%d.%d" % (info.major, info.minor, info.micro)
    if info.releaselevel != "final":
        v += info.releaselevel[0] + str(info.serial)
    return v
impl = sys.implementation
markers = {
    "implementation_name": impl.name,
    "implementation_version": fmt(impl.version),
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}
print(SENTINEL + json.dumps({
    "venv": venv if confs else None, "base_prefix": base_prefix, "stdlib": base_paths.get("stdlib"),
    "platstdlib": base_paths.get("platstdlib"), "base_site": base_site,
    "markers": markers, "site_packages": found, "sys_path": sys.path, "prefix": sys.prefix,
    "executable": sys.executable, "cache_tag": impl.cache_tag,
    "magic": importlib.util.MAGIC_NUMBER.hex(), "version": sys.version,
}))
"""
)

_PY_DIR = re.compile(r"python([0-9]+)\.([0-9]+)t?\Z")
_PYC_TAG = re.compile(r"\.([a-z]+-[0-9]+)(?:\.opt-[0-9])?\.pyc\Z")


@dataclass(frozen=True)
class Target:
    """What is audited. ``markers`` is a complete marker environment for the target;
    ``magic``/``cache_tag`` are its bytecode format (None when unknown)."""

    kind: str
    description: str
    site_packages: tuple[str, ...]
    markers: Mapping[str, str]
    cache_tag: str | None
    magic: str | None
    executable: str | None = None
    sys_path: tuple[str, ...] = field(default_factory=tuple)
    venv: str | None = None
    requested: str | None = None
    stdlib: str | None = None
    platstdlib: str | None = None
    base_site: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "description": self.description,
            "site_packages": list(self.site_packages),
            "python_version": self.markers.get("python_full_version") or self.markers.get("python_version"),
            "platform": f"{self.markers.get('sys_platform')}/{self.markers.get('platform_machine')}",
            "cache_tag": self.cache_tag,
            "executable": self.executable,
            "venv": self.venv,
        }


def auditor_magic() -> str:
    return importlib.util.MAGIC_NUMBER.hex()


def discover_python(python: str, timeout: float = 30.0, kind: str = "python") -> Target:
    """Asks the interpreter at ``python`` about itself. Raises TargetError."""
    try:
        proc = subprocess.run(
            [python, "-I", "-S", "-B", "-c", REPORT_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
        )
    except FileNotFoundError:
        raise TargetError(f"--python {python}: no such interpreter") from None
    except PermissionError:
        raise TargetError(f"--python {python}: not executable") from None
    except subprocess.TimeoutExpired:
        raise TargetError(f"--python {python}: did not report within {timeout:.0f}s") from None
    except OSError as exc:
        raise TargetError(f"--python {python}: cannot run it: {exc.strerror or exc}") from None
    try:
        info = json.loads(report_line(proc.stdout))
        markers = {str(k): str(v) for k, v in info["markers"].items()}
        site_packages = tuple(os.path.realpath(p) for p in info["site_packages"])
    except (ValueError, KeyError, TypeError, AttributeError):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TargetError(f"--python {python}: is not a working Python 3 interpreter ({detail})") from None
    if not site_packages:
        raise TargetError(f"--python {python}: reports no site-packages directory")
    requested = os.path.abspath(python)
    return Target(
        kind=kind,
        description=f"{info.get('executable') or python} (Python {markers['python_full_version']})",
        site_packages=site_packages,
        markers=markers,
        cache_tag=str(info.get("cache_tag") or "") or None,
        magic=str(info.get("magic") or "") or None,
        executable=str(info.get("executable") or python),
        sys_path=tuple(map(str, info.get("sys_path") or ())),
        # The venv is the one the path given lies in, not the one the interpreter reports:
        # a wrapper script at bin/python runs (and reports) another interpreter.
        venv=venv_of(requested) or _realpath_or_none(info.get("venv")),
        requested=requested,
        stdlib=_realpath_or_none(info.get("stdlib")),
        platstdlib=_realpath_or_none(info.get("platstdlib")),
        base_site=tuple(os.path.realpath(str(p)) for p in info.get("base_site") or ()),
    )


def report_line(stdout: str) -> str:
    """The report in the interpreter's output (pure): the last sentinel line. The target's own
    stdlib runs before the report is printed and may print too (an edited module the report
    imports); what it prints is not the report. Raises ValueError when there is none."""
    lines = [line for line in stdout.splitlines() if line.startswith(REPORT_SENTINEL)]
    if not lines:
        raise ValueError("no report line")
    return lines[-1][len(REPORT_SENTINEL) :]


def _realpath_or_none(path: object) -> str | None:
    return os.path.realpath(str(path)) if path else None


def venv_of(executable: str) -> str | None:
    """The venv directory ``executable`` (an absolute path, not resolved) lies in, if any."""
    bin_dir = os.path.dirname(executable)
    for candidate in (os.path.dirname(bin_dir), bin_dir):
        if os.path.lexists(os.path.join(candidate, "pyvenv.cfg")):
            return os.path.realpath(candidate)
    return None


def discover_self() -> Target:
    """The auditor's own environment, asked like any other interpreter."""
    return discover_python(sys.executable, kind="self")


def _guess_version(directory: str) -> tuple[int, int] | None:
    for part in reversed(os.path.realpath(directory).split(os.sep)):
        m = _PY_DIR.match(part)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _guess_cache_tag(directory: str, limit: int = 400) -> str | None:
    """The most common ``.pyc`` tag in the first ``limit`` ``__pycache__`` files found."""
    tags: collections.Counter[str] = collections.Counter()
    for root, dirs, files in os.walk(directory):
        if os.path.basename(root) == "__pycache__":
            tags.update(m.group(1) for f in files if (m := _PYC_TAG.search(f)))
            if sum(tags.values()) >= limit:
                break
        dirs.sort()
    return tags.most_common(1)[0][0] if tags else None


def discover_site_packages(directory: str, policy_markers: Mapping[str, str] | None = None) -> Target:
    """A site-packages directory that is only read. Raises TargetError if it is not a directory."""
    if not os.path.isdir(directory):
        raise TargetError(f"--site-packages {directory}: not a directory")
    try:
        os.listdir(directory)
    except OSError as exc:
        raise TargetError(f"--site-packages {directory}: cannot list it: {exc.strerror}") from None
    markers: dict[str, str] = {str(k): str(v) for k, v in {**default_environment(), **(policy_markers or {})}.items()}
    tag = _guess_cache_tag(directory)
    version = _guess_version(directory)
    if version is None and tag and (m := re.match(r"cpython-([0-9])([0-9]+)\Z", tag)):
        version = int(m.group(1)), int(m.group(2))
    if version is not None:
        short = f"{version[0]}.{version[1]}"
        if not markers.get("python_full_version", "").startswith(short + "."):
            markers["python_full_version"] = f"{short}.0"
        markers["python_version"] = short
    own_tag = sys.implementation.cache_tag
    real = os.path.realpath(directory)
    parts = real.split(os.sep)
    venv = os.sep.join(parts[:-3]) if len(parts) > 3 and parts[-3] == "lib" else None
    return Target(
        kind="site-packages",
        description=f"{directory} (read-only, Python {markers['python_version']})",
        site_packages=(os.path.realpath(directory),),
        markers=markers,
        cache_tag=tag,
        magic=auditor_magic() if tag == own_tag else None,
        venv=venv if venv and os.path.lexists(os.path.join(venv, "pyvenv.cfg")) else None,
    )
