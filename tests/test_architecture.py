"""Architecture rules of docs/design.md section 1, checked rather than trusted."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

IMPORT_ALL = """
import importlib, pkgutil, sys
import sidecars
names = [m.name for m in pkgutil.walk_packages(sidecars.__path__, "sidecars.")]
for name in names:
    importlib.import_module(name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers"})
print(len(names), heavy)
"""


def test_importing_every_sidecars_module_never_imports_torch():
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    count, heavy = result.stdout.strip().split(" ", 1)
    assert int(count) >= 10
    assert heavy == "[]", f"sidecars pulled in {heavy}"


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_sidecars_import_only_trainer_events_from_the_trainer():
    offenders = []
    for path in (ROOT / "sidecars").rglob("*.py"):
        for module in _imports(path):
            if module.split(".")[0] == "trainer" and module != "trainer.events":
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


NO_WATCHDOG = """
import sys, os, tempfile
sys.modules["watchdog"] = None  # makes `import watchdog` fail
from trainer import events
d = tempfile.mkdtemp()
path = os.path.join(d, "events.jsonl")
events.EventWriter(path, "r").emit("run.started", {})
follower = events.JournalFollower(path, poll_seconds=0.05)
follower.wait()
print(follower.using_watchdog, [e.seq for e, _ in events.JournalReader(path).read_available()])
"""


def test_events_module_is_stdlib_only():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    tree = ast.parse((ROOT / "trainer" / "events.py").read_text())
    top_level = set()
    for node in tree.body:  # watchdog is imported lazily with a polling fallback
        if isinstance(node, ast.Import):
            top_level |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    assert top_level <= allowed, top_level - allowed
    assert (ROOT / "trainer" / "__init__.py").read_text().strip() == ""
    result = subprocess.run([sys.executable, "-c", NO_WATCHDOG], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False [1]"


# -- layers: warden (neutral core) <- trainer, sidecars; no sidecar reaches into another ----------
FRAMEWORK = {"sidecars", "sidecars.runtime", "sidecars.runner", "sidecars.registry"}
# The composition layer wires sidecars together (the CLI, `sidecar run`, the local stack and demo).
COMPOSITION = {"cli", "commands", "stack"}


def _top(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def test_the_neutral_core_imports_neither_trainer_nor_sidecars():
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "warden").rglob("*.py")
        for module in _imports(path)
        if module.split(".")[0] == "sidecars" or (module.split(".")[0] == "trainer" and module != "trainer.events")
    ]
    assert offenders == []


def test_the_trainer_imports_no_sidecar():
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "trainer").rglob("*.py")
        for module in _imports(path)
        if module.split(".")[0] == "sidecars"
    ]
    assert offenders == []


def test_no_sidecar_imports_another_sidecars_internals():
    offenders = []
    for package in sorted(p for p in (ROOT / "sidecars").iterdir() if p.is_dir() and p.name not in COMPOSITION):
        own = f"sidecars.{package.name}"
        for path in package.rglob("*.py"):
            for module in _imports(path):
                if module.split(".")[0] == "sidecars" and module not in FRAMEWORK and _top(module, 2) != own:
                    offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []
