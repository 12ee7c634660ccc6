"""The whole interpreter: the base interpreter's stdlib, its site directories' start-up files and
the zips on sys.path, against the approved baseline (warden/deps/stdlib.py).

Every case runs on a base interpreter the test owns (``fake_base_template``: the real binary with
a stdlib directory of its own, so nothing of the machine's stdlib is written) and a venv of it.
Each attack first shows that the planted code runs in the venv's Python, then that the audit
names it with the exact finding.
"""

from __future__ import annotations

import importlib._bootstrap_external as bx
import json
import os
import sys
import zipfile

import pytest

from tests.warden.deps.deps_helpers import PY_ZIP, kinds, record_hash
from warden.deps.stdlib import ABSENT, compare_stdlib

MARK = "PLANTED-BY-TEST"
TAG = sys.implementation.cache_tag


def edited_stdlib_module(env):
    """The edit, and the .pyc the venv's Python then rewrites from it (the base is writable here)."""
    init = env.stdlib / "json" / "__init__.py"
    init.write_text(init.read_text() + f"\nprint({MARK!r})\n")
    pyc = env.stdlib / "json" / "__pycache__" / f"__init__.{TAG}.pyc"
    return "import json", {("stdlib_changed", str(init)), ("stdlib_changed", str(pyc))}


def replaced_stdlib_pyc(env):
    """The .pyc Python loads for json.decoder, rebuilt from an edited source (header kept valid)."""
    source = env.stdlib / "json" / "decoder.py"
    pyc = env.stdlib / "json" / "__pycache__" / f"decoder.{TAG}.pyc"
    st = source.stat()
    evil = env.base / "evil_decoder.py"
    evil.write_text(source.read_text() + f"\nprint({MARK!r})\n")
    code = compile(evil.read_text(), str(source), "exec")
    pyc.write_bytes(bytes(bx._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    evil.unlink()
    return "import json", {("stdlib_changed", str(pyc))}


def sitecustomize_in_stdlib(env):
    hook = env.stdlib / "sitecustomize.py"
    hook.write_text(f"print({MARK!r})\n")
    return "", {("stdlib_added", str(hook)), ("startup_hook", str(hook))}


def sitecustomize_in_sys_path_zip(env):
    """python3X.zip is on the default sys.path before the stdlib directory; it does not exist until planted."""
    path = env.base / "lib" / PY_ZIP
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sitecustomize.py", f"print({MARK!r})\n")
    return "", {("stdlib_added", str(path)), ("startup_hook", f"{path}/sitecustomize.py")}


def stdlib_module_removed(env):
    tool = env.stdlib / "json" / "tool.py"
    tool.unlink()
    return None, {("stdlib_removed", str(tool))}


def pth_in_base_site_dir(env):
    """A .pth at the top of the base interpreter's site-packages (runs for every venv of it made
    with --system-site-packages, and for the base interpreter itself)."""
    pth = env.stdlib / "site-packages" / "zzz-evil.pth"
    pth.write_text(f"import sys; print({MARK!r})\n")
    return None, {("stdlib_added", str(pth))}


ATTACKS = {
    "edited_stdlib_module": edited_stdlib_module,
    "replaced_stdlib_pyc": replaced_stdlib_pyc,
    "sitecustomize_in_stdlib": sitecustomize_in_stdlib,
    "sitecustomize_in_sys_path_zip": sitecustomize_in_sys_path_zip,
    "stdlib_module_removed": stdlib_module_removed,
    "pth_in_base_site_dir": pth_in_base_site_dir,
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_stdlib_attack_is_caught(name, base_env):
    approved = base_env.audit(approve=True)
    assert approved.exit_code == 0, approved.findings
    assert MARK not in base_env.run_python("import json")
    code, expected = ATTACKS[name](base_env)
    if code is not None:
        assert MARK in base_env.run_python(code)
    report = base_env.audit()
    assert kinds(report, "integrity") == expected
    assert report.exit_code == 1


def test_zip_hook_is_a_finding_without_a_baseline(base_env):
    path = base_env.base / "lib" / PY_ZIP
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("usercustomize/__init__.py", "import os\n")
        zf.writestr("planted/__init__.py", "import os\n")
    report = base_env.audit(baseline_path=None)
    assert kinds(report, "integrity") == {("startup_hook", f"{path}/usercustomize/__init__.py")}


def test_unchanged_base_is_clean_and_incremental(base_env):
    """Approval hashes the stdlib once; an unchanged audit only stats it; one edited file is
    the one file hashed again; a full pass hashes all again and stays clean."""
    first = base_env.audit(approve=True)
    stats = first.stats["integrity"]
    walked = stats["stdlib_files"] - 1  # the absent python3X.zip is recorded, not hashed
    assert (first.exit_code, stats["stdlib_hashed"], stats["stdlib_cached"]) == (0, walked, 0)
    again = base_env.audit()
    assert again.findings == [] and again.exit_code == 0, again.findings
    assert (again.stats["integrity"]["stdlib_hashed"], again.stats["integrity"]["stdlib_cached"]) == (0, walked)
    init = base_env.stdlib / "json" / "__init__.py"
    data = init.read_bytes()
    init.write_bytes(data)  # same bytes, new stat identity: hashed again, still clean
    touched = base_env.audit()
    assert touched.findings == [] and touched.exit_code == 0, touched.findings
    assert touched.stats["integrity"]["stdlib_hashed"] == 1
    full = base_env.audit(full_pass=True)
    assert full.findings == [] and full.exit_code == 0, full.findings
    assert full.stats["integrity"]["stdlib_hashed"] == walked


def test_stdlib_walk_stays_out_of_site_dirs_and_the_venv(base_env):
    base_env.audit(approve=True)
    doc = json.loads((base_env.state_dir / "baseline.json").read_text())
    files = doc["stdlib"]["files"]
    site = str(base_env.stdlib / "site-packages") + os.sep
    assert [p for p in files if p.startswith(site) or p.startswith(str(base_env.venv) + os.sep)] == []
    assert files[str(base_env.base / "lib" / PY_ZIP)] == ABSENT
    link = base_env.stdlib / "os.py"  # a link is hashed as its target string, never followed
    assert files[str(link)] == record_hash(os.readlink(link).encode())
    assert doc["stdlib"]["roots"] == [str(base_env.stdlib)]


def test_a_baseline_without_the_stdlib_makes_the_audit_incomplete(base_env):
    base_env.audit(approve=True)
    path = base_env.state_dir / "baseline.json"
    doc = json.loads(path.read_text())
    doc["version"] = 2
    del doc["stdlib"]
    path.write_text(json.dumps(doc))
    report = base_env.audit()
    assert report.incomplete == [
        f"{path}: approved before the base interpreter's stdlib was covered; re-approve with --approve",
        f"{path}: approved before the import closure (sys.path) was covered; re-approve with --approve",
    ]
    assert report.exit_code == 3


def test_another_interpreter_is_one_finding_not_one_per_file():
    approved = {"roots": ["/a/lib/python3.11"], "python": "cpython 3.11.7 cpython-311", "files": {"/a/x": "1"}}
    now = {"roots": ["/b/lib/python3.11"], "python": "cpython 3.11.7 cpython-311", "files": {"/b/x": "1"}}
    found = compare_stdlib(approved, now)
    assert [(f.kind, f.subject) for f in found] == [("stdlib_changed", "/b/lib/python3.11")]
    upgraded = {**approved, "python": "cpython 3.11.9 cpython-311", "files": {"/a/x": "2"}}
    assert [(f.kind, f.subject) for f in compare_stdlib(approved, upgraded)] == [
        ("stdlib_changed", "/a/lib/python3.11")
    ]
