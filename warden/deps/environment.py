"""The environment to audit (the target), discovered without running anything of it.

- ``--python PATH``: that interpreter's files are read, never run (syspath.py: ``pyvenv.cfg``, the
  stdlib landmark, the build data, ``._pth`` and ``.pth`` files): its import path, site-packages,
  version and bytecode tag. Markers other than the Python version and implementation are the
  auditor's host's (the sidecar runs on the trainer's node).
- ``--site-packages DIR``: a directory only read (e.g. the trainer's site-packages mounted
  read-only into the sidecar's container). The Python version comes from the path
  (``lib/python3.11/site-packages``) or the ``.pyc`` tags found; other markers from the policy.
- default: the auditor's own interpreter, read the same way as ``--python``.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from packaging.markers import default_environment

from warden.deps.errors import TargetError
from warden.deps.syspath import Layout, compute_layout, site_dir_closure

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
    # The import closure (syspath.py): sys.path as (path, origin), editable finders' targets as
    # (module, path, finder), ._pth files, .pth import lines, what discovery could not know.
    closure: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    editable: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)
    pth_config: tuple[str, ...] = field(default_factory=tuple)
    exec_lines: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    user_site: str | None = None
    discovery_notes: tuple[str, ...] = field(default_factory=tuple)
    env_files: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (env file, digest)
    env_problems: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (variable, why)

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
            "sys_path": [p for p, _ in self.closure] or list(self.sys_path),
            "user_site": self.user_site,
        }


def auditor_magic() -> str:
    return importlib.util.MAGIC_NUMBER.hex()


def discover_python(
    python: str, kind: str = "python", user_homes: Sequence[str] = (), env_files: Sequence[str] = ()
) -> Target:
    """The environment of the interpreter at ``python``, by reading its files (syspath.py); nothing
    of it runs. ``user_homes``: home directories it may run under (its user site); default the
    auditor's. ``env_files``: files of ``KEY=VALUE`` lines its environment is made of. Raises TargetError."""
    homes = tuple(user_homes) or (os.path.expanduser("~"),)
    layout = compute_layout(python, homes, env_files)
    return target_of(layout, kind, policy_markers=None)


def target_of(layout: Layout, kind: str, policy_markers: Mapping[str, str] | None) -> Target:
    """The Target of a computed layout (pure but for realpath)."""
    short = f"{layout.version[0]}.{layout.version[1]}"
    markers: dict[str, str] = {str(k): str(v) for k, v in {**default_environment(), **(policy_markers or {})}.items()}
    impl = "cpython" if (layout.cache_tag or "").startswith("cpython-") else markers.get("implementation_name", "")
    markers.update(
        python_version=short,
        python_full_version=layout.full_version,
        implementation_name=impl,
        implementation_version=layout.full_version,
        platform_python_implementation="CPython" if impl == "cpython" else markers["platform_python_implementation"],
    )
    site_packages = tuple(dict.fromkeys(os.path.realpath(p) for p in layout.site_dirs))
    if not site_packages and not layout.pth_config:  # a ._pth without `import site` has none, by design
        raise TargetError(f"--python {layout.requested}: has no site-packages directory")
    own_tag = sys.implementation.cache_tag
    closure = tuple((e.path, e.origin) for e in layout.sys_path)
    return Target(
        kind=kind,
        description=f"{layout.requested} (Python {layout.full_version}, read, not run)",
        site_packages=site_packages,
        markers=markers,
        cache_tag=layout.cache_tag,
        magic=auditor_magic() if layout.cache_tag == own_tag and layout.full_version.startswith(short) else None,
        executable=layout.requested,
        sys_path=tuple(p for p, _ in closure),
        venv=os.path.realpath(layout.venv) if layout.venv else None,
        requested=layout.requested,
        stdlib=_realpath_or_none(layout.stdlib),
        platstdlib=_realpath_or_none(layout.platstdlib),
        base_site=tuple(os.path.realpath(p) for p in layout.base_site),
        closure=closure,
        editable=layout.editable,
        pth_config=layout.pth_config,
        exec_lines=layout.exec_lines,
        user_site=os.path.realpath(layout.user_site) if layout.user_site else None,
        discovery_notes=layout.notes,
        env_files=layout.env_files,
        env_problems=layout.env_problems,
    )


def _realpath_or_none(path: object) -> str | None:
    return os.path.realpath(str(path)) if path else None


def discover_self(user_homes: Sequence[str] = (), env_files: Sequence[str] = ()) -> Target:
    """The auditor's own environment, read like any other interpreter's."""
    return discover_python(sys.executable, "self", user_homes, env_files)


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
    entries, exec_lines, editable, notes = site_dir_closure(os.path.realpath(directory))
    return Target(
        kind="site-packages",
        description=f"{directory} (read-only, Python {markers['python_version']})",
        closure=tuple((e.path, e.origin) for e in entries),
        sys_path=tuple(e.path for e in entries),
        exec_lines=exec_lines,
        editable=editable,
        discovery_notes=(
            *notes,
            "a bare site-packages: the interpreter's own path (stdlib, ._pth, user site) is not known",
        ),
        site_packages=(os.path.realpath(directory),),
        markers=markers,
        cache_tag=tag,
        magic=auditor_magic() if tag == own_tag else None,
        venv=venv if venv and os.path.lexists(os.path.join(venv, "pyvenv.cfg")) else None,
    )
