"""Coverage property of the import closure (issue 31), generated: random importable layouts in
throwaway venvs (``.pth`` path lines absolute, relative, missing, comments; editable finders; user
site on/off; a ``._pth`` beside the interpreter; a symlinked stdlib root). For each, the TEST runs
the venv's own Python (``python -c 'import sys; print(sys.path)'``, never the auditor) and asserts:

- the computed ``sys.path`` (syspath.py, read from files) resolves to exactly the existing entries
  the interpreter reports, in its order;
- every one of them, and every editable finder's target, lies below a root the audit walked.

Seeded (``derandomize``): a small sample in CI; ``WARDEN_DEPS_CLOSURE_EXAMPLES=N`` runs N examples.
The counts are printed (``-s``) and asserted non-zero.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.warden.deps.deps_helpers import PY_DIR, BaseEnv
from warden.deps.audit import run_audit
from warden.deps.environment import discover_python

EXAMPLES = int(os.environ.get("WARDEN_DEPS_CLOSURE_EXAMPLES", "6"))
COUNTS = {"examples": 0, "layouts": set(), "dirs_compared": 0, "editable_targets": 0}


@pytest.fixture(scope="session")
def bases(fake_base_template, tmp_path_factory):
    """The fake base as is, and a copy whose stdlib directory is a symlink to a directory elsewhere."""
    linked = tmp_path_factory.mktemp("linked-base") / "base"
    shutil.copytree(fake_base_template, linked, symlinks=True)
    real = linked.parent / "elsewhere" / PY_DIR
    real.parent.mkdir()
    shutil.move(str(linked / "lib" / PY_DIR), real)
    (linked / "lib" / PY_DIR).symlink_to(real)
    return {"plain": fake_base_template, "linked": linked}


PTH_LINE = st.sampled_from(["abs", "rel", "missing", "comment", "blank", "finder", "dup"])


@dataclass(frozen=True)
class Layout:
    base: str
    system_site: bool
    user_site: bool
    user_pth: bool
    pth_files: tuple[tuple[str, ...], ...]
    dot_pth: str  # "", "plain", "site" (with `import site`)

    def key(self) -> tuple:
        kinds = tuple(sorted({k for f in self.pth_files for k in f}))
        return (self.base, self.system_site, self.user_site, self.user_pth, len(self.pth_files), kinds, self.dot_pth)


LAYOUTS = st.builds(
    Layout,
    base=st.sampled_from(["plain", "linked"]),
    system_site=st.booleans(),
    user_site=st.booleans(),
    user_pth=st.booleans(),
    pth_files=st.lists(st.lists(PTH_LINE, min_size=1, max_size=4).map(tuple), max_size=3).map(tuple),
    dot_pth=st.sampled_from(["", "", "plain", "site"]),
)


def _write_pth(site: str, index: int, lines: tuple[str, ...], scratch: str, tag: str) -> list[str]:
    """Writes ``site``/``NN-tag.pth``; returns the editable targets its finder lines map."""
    out, targets = [], []
    for j, kind in enumerate(lines):
        name = f"{tag}{index}{j}"
        if kind == "abs":
            os.makedirs(os.path.join(scratch, name), exist_ok=True)
            out.append(os.path.join(scratch, name))
        elif kind == "rel":
            os.makedirs(os.path.join(site, "..", f"rel-{name}"), exist_ok=True)
            out.append(f"../rel-{name}")
        elif kind == "missing":
            out.append(os.path.join(scratch, "never", name))
        elif kind == "comment":
            out.append(f"# {name}")
        elif kind == "blank":
            out.append("")
        elif kind == "dup":
            out.append(site)
        else:
            target = os.path.join(scratch, f"ed-{name}")
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "__init__.py"), "w") as fh:
                fh.write("")
            module = f"__editable___{name}_finder"
            with open(os.path.join(site, module + ".py"), "w") as fh:
                fh.write(f"MAPPING = {{'pkg_{name}': {target!r}}}\nNAMESPACES = {{}}\n\n\ndef install():\n    pass\n")
            out.append(f"import {module}; {module}.install()")
            targets.append(target)
    with open(os.path.join(site, f"{index:02d}-{tag}.pth"), "w") as fh:
        fh.write("\n".join(out) + "\n")
    return targets


def _real_sys_path(python: str, home: str) -> list[str]:
    proc = subprocess.run(
        [python, "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": home},
    )
    assert proc.returncode == 0, proc.stderr
    return [os.path.realpath(p) for p in json.loads(proc.stdout.splitlines()[-1]) if p and os.path.exists(p)]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example builds a venv
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(layout=LAYOUTS)
def test_every_directory_the_interpreter_imports_from_is_audited(layout, bases, tmp_path):
    scratch = tempfile.mkdtemp(dir=tmp_path)
    base = bases[layout.base]
    venv = os.path.join(scratch, "venv")
    cmd = [str(base / "bin" / PY_DIR), "-m", "venv", "--without-pip", venv]
    subprocess.run(cmd + (["--system-site-packages"] if layout.system_site else []), check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    site = os.path.join(venv, "lib", PY_DIR, "site-packages")
    editable: list[str] = []
    for i, lines in enumerate(layout.pth_files):
        editable += _write_pth(site, i, lines, scratch, "v")
    home = os.path.join(scratch, "home")
    os.makedirs(home)
    if layout.user_site:
        user = os.path.join(home, ".local", "lib", PY_DIR, "site-packages")
        os.makedirs(user)
        if layout.user_pth:
            editable += _write_pth(user, 9, ("abs", "rel", "finder"), scratch, "u")
    if layout.dot_pth:
        stdlib = os.path.join(str(base), "lib", PY_DIR)
        extra = os.path.join(venv, "bin", "extra")
        os.makedirs(extra)
        lines = ["extra", stdlib, os.path.join(stdlib, "lib-dynload")]
        with open(os.path.join(venv, "bin", "python._pth"), "w") as fh:
            fh.write("\n".join(lines + (["import site"] if layout.dot_pth == "site" else [])) + "\n")
    real = _real_sys_path(python, home)

    target = discover_python(python, user_homes=[home])
    computed = [os.path.realpath(p) for p, _ in target.closure if p and os.path.exists(p)]
    assert computed == real, (layout, target.closure)
    state = os.path.join(scratch, "state")
    os.makedirs(state)
    env = BaseEnv(base, pathlib.Path(venv), pathlib.Path(state))
    report = run_audit(env.settings(baseline_path=None), target)
    entries = report.stats["closure"]["sys_path"]
    roots = [
        *(os.path.realpath(r) for r in (target.stdlib, target.platstdlib) if r),
        *target.site_packages,
        *([target.venv] if target.venv else []),
        *report.stats["closure"]["roots"],
    ]
    sources = {e[1]: e[3] for e in entries}
    for path in real:
        assert sources.get(path) not in (None, "absent"), (path, entries)
        if not path.endswith(".zip"):
            assert any(_inside(path, r) for r in roots), (path, roots)
    mapped = {os.path.realpath(p) for _, p, _ in target.editable}
    site_runs = layout.dot_pth != "plain"  # without `import site` no .pth is read, so no finder is installed
    user_runs = site_runs and not layout.dot_pth and layout.system_site and layout.user_site
    for t in editable:
        from_user = os.sep + "ed-u" in t
        if (from_user and user_runs) or (not from_user and site_runs):
            assert os.path.realpath(t) in mapped, (t, target.editable)
    for t in mapped:
        assert any(_inside(t, r) for r in roots), (t, roots)
    COUNTS["editable_targets"] += len(mapped)
    assert not any(f.kind == "shadowing" for f in report.findings), report.findings
    COUNTS["examples"] += 1
    COUNTS["layouts"].add(layout.key())
    COUNTS["dirs_compared"] += len(real)


@pytest.mark.slow
def test_property_counts_are_reported():
    """Runs after the property (file order): prints what it compared."""
    print(
        f"\nclosure property: {COUNTS['examples']} examples, {len(COUNTS['layouts'])} distinct layouts, "
        f"{COUNTS['dirs_compared']} sys.path dirs compared, {COUNTS['editable_targets']} editable targets"
    )
    assert COUNTS["examples"] > 0 and COUNTS["dirs_compared"] > 0
