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


NO_WATCHDOG = """
import sys, os, tempfile
sys.modules["watchdog"] = None  # makes `import watchdog` fail
from warden import journal as events
d = tempfile.mkdtemp()
path = os.path.join(d, "events.jsonl")
events.EventWriter(path, "r").emit("run.started", {})
follower = events.JournalFollower(path, poll_seconds=0.05)
follower.wait()
print(follower.using_watchdog, [e.seq for e, _ in events.JournalReader(path).read_available()])
"""


def _top_level_imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:  # watchdog is imported lazily with a polling fallback
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_ground_floor_is_stdlib_only():
    """warden.journal stands on warden.safeio and warden.logs only; those on warden.errors (the exit codes
    and the one sanitiser) at most, and that on the standard library."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    first_party = {m for m in _top_level_imports(ROOT / "warden" / "journal.py") if m.split(".")[0] not in stdlib}
    assert first_party == {"warden.logs", "warden.safeio"}
    for name, allowed in (("logs", {"warden.errors"}), ("safeio", set()), ("errors", set())):
        imported = {m for m in _top_level_imports(ROOT / "warden" / f"{name}.py") if m.split(".")[0] not in stdlib}
        assert imported <= allowed, (name, imported - allowed)
    assert (ROOT / "trainer" / "__init__.py").read_text().strip() == ""
    result = subprocess.run([sys.executable, "-c", NO_WATCHDOG], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False [1]"


# -- layers (docs/design.md section 1): three rules, no exception list ------------------------------
# The composition layer wires units together and may name any of them: the CLI, `sidecar run`, the stack.
COMPOSITION = ("sidecars/cli.py", "sidecars/commands/", "sidecars/stack/")


def _unit_of_file(relative: str) -> str:
    """warden, trainer, sidecars (the runtime every sidecar shares) or sidecars.<name>."""
    parts = relative.split("/")
    return f"sidecars.{parts[1]}" if parts[0] == "sidecars" and len(parts) > 2 else parts[0]


def _unit_of_module(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "sidecars" and len(parts) > 1 and (ROOT / "sidecars" / parts[1]).is_dir():
        return f"sidecars.{parts[1]}"
    return parts[0]


def _first_party_imports(top: str):
    """(file, its unit, imported unit) for every import of warden, trainer or sidecars under ``top``."""
    for path in sorted((ROOT / top).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        for module in _imports(path):
            if module.split(".")[0] in {"warden", "trainer", "sidecars"}:
                yield relative, _unit_of_file(relative), _unit_of_module(module)


def test_warden_imports_neither_trainer_nor_sidecars():
    assert [i for i in _first_party_imports("warden") if i[2] != "warden"] == []


def test_trainer_and_each_sidecar_never_import_each_other():
    """Outside the composition layer a unit imports itself, warden and (a sidecar) the shared runtime."""
    crossings = [
        i
        for top in ("trainer", "sidecars")
        for i in _first_party_imports(top)
        if not i[0].startswith(COMPOSITION)
        and i[2] not in {i[1], "warden"}
        and not (i[1].startswith("sidecars.") and i[2] == "sidecars")
    ]
    assert crossings == []


def test_the_shared_runtime_names_no_sidecar_and_no_trainer():
    runtime = [i for i in _first_party_imports("sidecars") if i[1] == "sidecars" and not i[0].startswith(COMPOSITION)]
    assert [i for i in runtime if i[2] != "sidecars" and i[2] != "warden"] == []


# -- names read from storage are parsed as ASCII --------------------------------------------------
# Python's \d and str.isdigit() accept every Unicode digit ("step-٠٠٠٠٠٠٠٠٤" is step 4 to int()), so
# a name planted in a checkpoint root or an archive key could alias a real step. First-party code
# spells digits [0-9] and checks isascii() beside isdigit(). Two modules parse text that is not a
# name (a rendered chat template's dates, a model's answer, lock-file lines).
TEXT_PARSERS = {
    "warden/tokenscan/template_battery.py",
    "warden/tokenscan/conversations.py",  # rendered template text: Unicode letters vs digits, date words
    "trainer/rewards.py",
    "warden/deps/locks/requirements.py",  # a line-oriented comment pattern over lock-file lines
}


def test_digits_in_names_from_storage_are_ascii_only_and_patterns_end_at_the_end():
    offenders = []
    for top in ("warden", "trainer", "sidecars"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative in TEXT_PARSERS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                # ...and a pattern ends with \Z: "$" also matches before a trailing newline ("run\n")
                dollar_end = ('$")' in code or "$'" in code) and ("re." in code or "compile" in code)
                if "\\d" in code or (".isdigit()" in code and ".isascii()" not in code) or dollar_end:
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == []


# -- one I/O layer for the locations the storage writer can touch ----------------------------------
# The modules that open, write, rename or remove entries of checkpoint roots, watched roots, .sig
# files and file:// stores do so only through warden.safeio or descriptor-relative calls: no
# builtin open(), no os.<name> filesystem call without dir_fd, no shutil tree operations. (The
# operator's root itself is created with safeio.make_root.) Reading the sidecars' own state
# directories is not covered: the storage writer cannot write there.
STORAGE_FACING = (
    "trainer/checkpoint.py",
    "trainer/verified_load.py",
    "trainer/space.py",
    "warden/archive/store.py",
    "warden/signing/dsse.py",
    "warden/signing/hashing.py",
    "warden/signer/watch.py",
    "warden/signer/root_scanning.py",
    "warden/signer/operations.py",
    "warden/signer/announced_signing.py",
    "warden/signer/reverification.py",
    "warden/signer/resume_checking.py",
    "trainer/saver.py",
)
FS_CALLS = {"rename", "replace", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link", "symlink", "open"}


def _storage_io_offenders(relative: str):
    tree = ast.parse((ROOT / relative).read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        keywords = {k.arg for k in node.keywords}
        if isinstance(func, ast.Name) and func.id == "open":
            yield f"{relative}:{node.lineno}: open()"
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner, name = func.value.id, func.attr
            if owner == "os" and name in FS_CALLS and not keywords & {"dir_fd", "src_dir_fd"}:
                yield f"{relative}:{node.lineno}: os.{name} without a directory descriptor"
            if owner == "shutil" and name in {"rmtree", "move", "copytree", "copy", "copyfile"}:
                yield f"{relative}:{node.lineno}: shutil.{name}"


def test_storage_facing_modules_use_only_the_safe_io_layer():
    assert [o for path in STORAGE_FACING for o in _storage_io_offenders(path)] == []


def test_every_command_prints_through_the_one_escaping_echo():
    """Output goes through warden.cliutil.echo (escape_untrusted), so no report can carry a raw escape
    sequence from a name the storage writer chose (click strips ANSI only when not on a terminal)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("warden", "trainer", "sidecars")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "warden" / "cliutil.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "click.echo(" in line or "click.secho(" in line
    ]
    assert offenders == []
