"""The project's own locks cover the environment `make` builds (issue 32: Warden failed its own audit).

The check is built from pyproject.toml and the Makefile, never from a list kept here: the base
dependencies and every requirement of each extra the Makefile installs (EXTRAS), self-references such
as ``warden[shadow,scan]`` followed recursively, must be pinned with sha256 hashes in the development
lock at a version the requirement accepts; so must everything those distributions need in turn (read
from the installed metadata of this interpreter, the environment under test). The runtime lock (the
sidecars' base dependencies, the Docker image) covers the base and agrees with the development lock,
and each lock's requirements and PEP 751 forms are one resolution. `make lock` regenerates them.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from warden.deps.locks import LockedPackage, load_lock

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "policies" / "locks"
# The platform the locks are for (their file names say so; policies/deps.yaml lock.platforms).
TARGET = {
    **default_environment(),
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@dataclass(frozen=True)
class Root:
    """A requirement the lock must satisfy; ``origin`` says where it came from, for messages."""

    requirement: Requirement
    origin: str
    walk: bool = True  # False: installed with --no-deps, its own requirements are not followed


@dataclass(frozen=True)
class MakeInstall:
    lock: Path
    runtime_lock: Path
    extras: tuple[str, ...]
    nodeps: Path | None


def make_variable(makefile: str, name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(\S+)\s*$", makefile, re.M)
    if not match:
        raise AssertionError(f"Makefile: no {name} := ... line")
    return match.group(1)


def make_install(makefile: str, repo: Path) -> MakeInstall:
    """What the Makefile's venv recipe installs: the lock (hash-checked) and the project's extras."""
    recipe = makefile[makefile.index("$(STAMP):") :].split("\n\n", 1)[0]
    assert "--require-hashes -r $(LOCK)" in recipe, "the venv is not installed from $(LOCK) with --require-hashes"
    assert "'.[$(EXTRAS)]'" in recipe, "the venv recipe does not install the project's $(EXTRAS)"
    nodeps = re.search(r"^LOCK_NODEPS\s*:?=\s*(\S+)", makefile, re.M)
    return MakeInstall(
        lock=repo / make_variable(makefile, "LOCK"),
        runtime_lock=repo / make_variable(makefile, "RUNTIME_LOCK"),
        extras=tuple(e.strip() for e in make_variable(makefile, "EXTRAS").split(",") if e.strip()),
        nodeps=repo / nodeps.group(1) if nodeps else None,
    )


def applies(req: Requirement, extras: Iterable[str], env: Mapping[str, str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (*extras, ""))


def project_roots(pyproject: Mapping, extras: Iterable[str], env: Mapping[str, str]) -> list[Root]:
    """The base dependencies and those of ``extras``, with ``<project>[x,y]`` followed recursively."""
    project = pyproject["project"]
    own = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    roots = [Root(Requirement(r), "[project].dependencies") for r in project.get("dependencies", [])]
    roots = [r for r in roots if applies(r.requirement, (), env)]
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in optional:
            raise AssertionError(f"pyproject.toml has no extra {extra!r} (the Makefile installs it)")
        for text in optional[extra]:
            req = Requirement(text)
            if not applies(req, (extra,), env):
                continue
            if canonicalize_name(req.name) == own:
                todo.extend(req.extras)
            else:
                roots.append(Root(req, f"extra {extra!r}"))
    return roots


def nodeps_roots(path: Path | None) -> list[Root]:
    if path is None:
        return []
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Root(Requirement(line), path.name, walk=False) for line in lines if line]


def pins(path: Path) -> dict[str, LockedPackage]:
    lock = load_lock(str(path))
    assert not lock.problems, f"{path.name}: {lock.problems}"
    return {p.canonical: p for p in lock.packages}


def unlocked(
    roots: Iterable[Root],
    locked: Mapping[str, LockedPackage],
    env: Mapping[str, str],
    requires: Callable[[str], list[str] | None] = lambda name: None,
) -> list[str]:
    """One line per requirement the lock does not satisfy, naming the distribution; empty when covered.

    ``requires(name)`` gives an installed distribution's own requirements (None: not installed, so
    not followed further); what they need is checked the same way, with the extras asked for."""
    problems: list[str] = []
    todo = [(r.requirement, r.origin, r.walk) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, origin, walk = todo.pop()
        name = canonicalize_name(req.name)
        pkg = locked.get(name)
        if pkg is None:
            problems.append(f"{name}: required by {origin} ({req}), not in the lock")
            continue
        if pkg.version is None or not pkg.hashes:
            problems.append(f"{name}: locked as {pkg.spec!r} at {pkg.where}, not an exact pin with hashes")
            continue
        if not req.specifier.contains(Version(pkg.version), prereleases=True):
            problems.append(f"{name}: {origin} needs {req}, the lock pins {pkg.version}")
        key = (name, frozenset(req.extras))
        if not walk or key in done:
            continue
        done.add(key)
        for text in requires(name) or []:
            sub = Requirement(text)
            if applies(sub, req.extras, env):
                todo.append((sub, f"{name} (<- {origin})", True))
    return sorted(set(problems))


def installed_requires(name: str) -> list[str] | None:
    try:
        return importlib.metadata.distribution(name).requires or []
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def make() -> MakeInstall:
    return make_install((REPO / "Makefile").read_text(encoding="utf-8"), REPO)


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def test_the_development_lock_covers_every_extra_make_installs(make, pyproject):
    roots = project_roots(pyproject, make.extras, TARGET) + nodeps_roots(make.nodeps)
    assert len(roots) > 20, roots  # the extras were found (a parse that finds nothing passes nothing)
    problems = unlocked(roots, pins(make.lock), TARGET)
    assert not problems, f"{make.lock.name} lacks (make lock):\n" + "\n".join(problems)


def test_what_those_distributions_need_in_turn_is_locked_too(make, pyproject):
    """The walk goes through this interpreter's installed metadata (CI: the venv `make` just built)."""
    roots = project_roots(pyproject, make.extras, TARGET) + nodeps_roots(make.nodeps)
    walked = [r for r in roots if installed_requires(r.requirement.name) is not None]
    assert walked, "none of the locked distributions is installed here: nothing to follow"
    problems = unlocked(roots, pins(make.lock), TARGET, installed_requires)
    assert not problems, f"{make.lock.name} lacks (make lock):\n" + "\n".join(problems)


def test_the_runtime_lock_covers_the_base_and_agrees_with_the_development_lock(make, pyproject):
    runtime, dev = pins(make.runtime_lock), pins(make.lock)
    assert unlocked(project_roots(pyproject, (), TARGET), runtime, TARGET) == []
    differ = {n: (p.version, dev[n].version if n in dev else None) for n, p in runtime.items()}
    assert {n: v for n, v in differ.items() if v[0] != v[1]} == {}


@pytest.mark.parametrize("name", ["runtime", "dev"])
def test_each_lock_in_both_forms_is_one_resolution(name):
    txt = pins(LOCKS / f"{name}-py311-linux-x86_64.txt")
    toml = pins(LOCKS / f"pylock.{name}.toml")
    assert {n: p.version for n, p in toml.items()} == {n: p.version for n, p in txt.items()}
    assert {n for n, p in toml.items() if not set(p.hashes) <= set(txt[n].hashes)} == set()
    assert all(p.sha256_complete for p in toml.values()), [n for n, p in toml.items() if not p.sha256_complete]


def test_ci_audits_the_environment_it_built(make):
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    prerequisites = re.search(r"^test:(.*)$", makefile, re.M)
    assert prerequisites and "audit-env" in prerequisites.group(1).split()
    audit = makefile[makefile.index("audit-env: $(STAMP)") :].split("\n\n", 1)[0]
    assert "warden deps audit" in audit and "--lock $(abspath $(LOCK))" in audit
    for check in ("lock", "drift", "integrity"):
        assert f"--check {check}" in audit


# ---- the check itself can fail ---------------------------------------------------------------


def _lock_file(tmp_path: Path, entries: dict[str, str]) -> dict[str, LockedPackage]:
    lines = [f"{name}=={version} \\\n    --hash=sha256:{'ab' * 32}" for name, version in entries.items()]
    path = tmp_path / "lock.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return pins(path)


SYNTHETIC = {
    "project": {
        "name": "warden",
        "dependencies": ["click>=8"],
        "optional-dependencies": {
            "shadow": ["scipy>=1.11", "matplotlib>=3.8", "pywin32; sys_platform == 'win32'"],
            "test": ["warden[shadow]", "pytest>=8"],
            "dev": ["warden[test]", "ruff"],
        },
    }
}


def test_a_distribution_missing_from_the_lock_is_named_through_nested_extras(tmp_path):
    roots = project_roots(SYNTHETIC, ("dev",), TARGET)
    assert {canonicalize_name(r.requirement.name) for r in roots} == {"click", "scipy", "matplotlib", "pytest", "ruff"}
    locked = _lock_file(tmp_path, {"click": "8.1", "scipy": "1.12", "pytest": "8.0", "ruff": "0.6"})
    assert unlocked(roots, locked, TARGET) == [
        "matplotlib: required by extra 'shadow' (matplotlib>=3.8), not in the lock"
    ]


def test_a_pin_the_requirement_refuses_and_an_unlocked_dependency_of_a_dependency_are_named(tmp_path):
    locked = _lock_file(tmp_path, {"click": "8.1", "scipy": "1.0", "matplotlib": "3.9", "pytest": "8.0", "ruff": "1"})
    metadata = {
        "matplotlib": ["kiwisolver>=1.3", "pyparsing>=3 ; extra == 'dev'", "pywin32 ; sys_platform == 'win32'"],
        "scipy": ["numpy>=1.23"],
    }
    problems = unlocked(project_roots(SYNTHETIC, ("dev",), TARGET), locked, TARGET, metadata.get)
    assert problems == [
        "kiwisolver: required by matplotlib (<- extra 'shadow') (kiwisolver>=1.3), not in the lock",
        "numpy: required by scipy (<- extra 'shadow') (numpy>=1.23), not in the lock",
        "scipy: extra 'shadow' needs scipy>=1.11, the lock pins 1.0",
    ]


def test_a_no_deps_entry_is_locked_but_its_own_requirements_are_not_followed(tmp_path):
    nodeps = tmp_path / "nodeps.in"
    nodeps.write_text("# comment\nverl==0.9.1\n", encoding="utf-8")
    roots = nodeps_roots(nodeps)
    assert unlocked(roots, _lock_file(tmp_path, {"other": "1"}), TARGET) == [
        "verl: required by nodeps.in (verl==0.9.1), not in the lock"
    ]
    locked = _lock_file(tmp_path, {"verl": "0.9.1"})
    assert unlocked(roots, locked, TARGET, {"verl": ["transformers<5.11"]}.get) == []
