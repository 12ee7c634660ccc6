"""The import closure (issue 31): discovery by reading files, never by running the target; every
directory the interpreter imports from audited; bounded work; benign image operations clean.

Each attack first shows that the planted code runs in the target's Python (the TEST runs it; the
auditor never does), then that the audit names it with the exact finding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from tests.warden.deps.deps_helpers import PY_DIR, kinds
from warden.deps.audit import run_audit
from warden.deps.environment import discover_python
from warden.deps.policy import DepsPolicy, IntegrityRules, VulnRules
from warden.deps.pth import PthRule
from warden.deps.syspath import compute_layout, finder_targets, parse_env_file, pth_lines

MARK = "PLANTED-BY-TEST"
TAG = sys.implementation.cache_tag


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _site(venv) -> str:
    return str(venv / "lib" / PY_DIR / "site-packages")


def _run(python, code: str = "", env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, env=env or {})
    return proc.stdout + proc.stderr


def _policy(check_pyc: bool = False, **integrity) -> DepsPolicy:
    return DepsPolicy(
        integrity=IntegrityRules(workers=2, check_pyc=check_pyc, **integrity), vulnerabilities=VulnRules()
    )


# ---- the target is read, never run ----------------------------------------------------------------


def test_discovery_never_runs_the_target(base_env, tmp_path):
    """Planted code in the stdlib's start-up path and a bin/python that is a script: each writes a
    marker when run. The audit reads, approves and compares without either marker appearing."""
    marker = tmp_path / "ran"
    hook = base_env.stdlib / "sitecustomize.py"
    hook.write_text(f"open({str(marker)!r}, 'a').write('hook')\n")
    _run(base_env.python)
    assert marker.read_text() == "hook"  # the planted code does run in the target's Python
    marker.unlink()
    python = base_env.venv / "bin" / "python"
    real = os.path.realpath(python)
    python.unlink()
    python.write_text(f'#!/bin/sh\necho wrapper >> {marker}\nexec {real} "$@"\n')
    python.chmod(0o755)
    report = base_env.audit(approve=True)
    assert not marker.exists()
    assert {("startup_hook", str(hook)), ("interpreter_replaced", str(python))} <= kinds(report, "integrity")
    assert report.exit_code == 1
    assert not (base_env.state_dir / "baseline.json").exists()  # not clean: nothing approved


def test_baseline_is_read_first_and_a_rewrite_during_the_audit_is_refused(base_env, monkeypatch):
    """Stand-in for any writer racing the audit (target code no longer runs in it): the baseline is
    rewritten while integrity runs; the audit compares with what it read first and does not approve."""
    assert base_env.audit(approve=True).exit_code == 0
    path = base_env.state_dir / "baseline.json"
    import warden.deps.audit as audit_mod

    real = audit_mod.check_integrity

    def racing(*args, **kwargs):
        doc = json.loads(path.read_text())
        doc["stdlib"]["files"] = {}
        path.write_text(json.dumps(doc))
        return real(*args, **kwargs)

    monkeypatch.setattr(audit_mod, "check_integrity", racing)
    approve = base_env.audit(approve=True)
    assert any("the baseline changed during the audit" in r for r in approve.incomplete), approve.incomplete
    assert approve.exit_code == 3


# ---- every directory on the path -------------------------------------------------------------------


def test_pth_path_line_directory_is_walked_and_baselined(base_env, tmp_path):
    """An editable src-layout install allowed by digest: its directory is on sys.path and walked."""
    src = tmp_path / "project" / "src"
    (src / "proj").mkdir(parents=True)
    (src / "proj" / "__init__.py").write_text("VALUE = 1\n")
    pth = base_env.venv / "lib" / PY_DIR / "site-packages" / "__editable__.proj-1.0.pth"
    pth.write_text(f"{src}\n")
    rules = (PthRule("editable proj", _sha(pth)),)
    settings = base_env.settings(policy=_policy(pth_allow=rules, unowned_allow=("__editable__*",)))
    approved = run_audit(replace(settings, approve=True), discover_python(base_env.python))
    assert approved.exit_code == 0, approved.findings
    assert str(src) in approved.stats["closure"]["roots"]
    hook = src / "sitecustomize.py"
    hook.write_text(f"print({MARK!r})\n")
    assert MARK in _run(base_env.python)
    report = run_audit(settings, discover_python(base_env.python))
    assert {("startup_hook", str(hook)), ("closure_added", str(hook))} <= kinds(report, "integrity")
    assert report.exit_code == 1


def test_editable_finder_targets_are_walked(base_env, tmp_path):
    target = tmp_path / "proj"
    target.mkdir()
    (target / "__init__.py").write_text("X = 1\n")
    site = base_env.venv / "lib" / PY_DIR / "site-packages"
    finder = site / "__editable___proj_1_0_finder.py"
    finder.write_text(f"MAPPING: dict[str, str] = {{'proj': {str(target)!r}}}\nNAMESPACES = {{}}\n")
    pth = site / "__editable__.proj-1.0.pth"
    pth.write_text("import __editable___proj_1_0_finder; __editable___proj_1_0_finder.install()")
    target_obj = discover_python(base_env.python)
    assert target_obj.editable == (("proj", str(target), str(finder)),)
    settings = base_env.settings(
        policy=_policy(pth_allow=(PthRule("proj", _sha(pth)),), unowned_allow=("__editable__*",))
    )
    approved = run_audit(replace(settings, approve=True), target_obj)
    assert approved.exit_code == 0, approved.findings
    assert str(target) in approved.stats["closure"]["roots"]
    (target / "__init__.py").write_text("X = 2\n")
    report = run_audit(settings, discover_python(base_env.python))
    assert ("closure_changed", str(target / "__init__.py")) in kinds(report, "integrity")


def test_user_site_is_on_the_path_and_walked(fake_base_template, tmp_path):
    """A venv with system site-packages enables the user site: after the venv's site-packages
    (site.venv adds those first), ahead of the base interpreter's."""
    base = tmp_path / "base"
    shutil.copytree(fake_base_template, base, symlinks=True)
    venv = tmp_path / "venv"
    subprocess.run(
        [str(base / "bin" / PY_DIR), "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    home = tmp_path / "home"
    user = home / ".local" / "lib" / PY_DIR / "site-packages"
    user.mkdir(parents=True)
    evil = user / "sitecustomize.py"
    evil.write_text(f"print({MARK!r})\n")
    assert MARK in _run(venv / "bin" / "python", env={"HOME": str(home)})
    target = discover_python(str(venv / "bin" / "python"), user_homes=[str(home)])
    venv_site = str(venv / "lib" / PY_DIR / "site-packages")
    assert target.user_site == str(user) and target.site_packages[:2] == (venv_site, str(user))
    order = [p for p, _ in target.closure]
    assert order.index(str(user)) == order.index(venv_site) + 1
    state = tmp_path / "state"
    state.mkdir()
    from tests.warden.deps.deps_helpers import BaseEnv

    env = BaseEnv(base, venv, state)
    report = run_audit(env.settings(), target)
    assert ("startup_hook", str(evil)) in kinds(report, "integrity")
    assert ("unowned", str(evil)) in kinds(report, "integrity")
    without = discover_python(str(venv / "bin" / "python"), user_homes=[str(tmp_path / "nobody")])
    assert without.user_site is None


@pytest.mark.parametrize("where", ["venv", "base"])
def test_pth_file_beside_the_interpreter(base_env, where):
    """A ._pth beside the invoked executable (venv/bin/python._pth) or beside the binary it resolves
    to (base/bin/python3.X._pth) replaces the whole path (CPython getpath)."""
    bin_dir = base_env.venv / "bin" if where == "venv" else base_env.base / "bin"
    extra = bin_dir / "extra"
    extra.mkdir()
    (extra / "sitecustomize.py").write_text(f"print({MARK!r})\n")
    pth = bin_dir / ("python._pth" if where == "venv" else f"{PY_DIR}._pth")
    pth.write_text(f"extra\n{base_env.stdlib}\n{base_env.stdlib}/lib-dynload\nimport site\n")
    assert MARK in _run(base_env.python)
    target = discover_python(base_env.python)
    assert [p for p, _ in target.closure][:1] == [str(extra)]
    report = base_env.audit(baseline_path=None)
    found = kinds(report, "integrity")
    assert ("path_config", str(pth)) in found and ("startup_hook", str(extra / "sitecustomize.py")) in found


def test_a_relinked_stdlib_root_changes_the_approved_sys_path(base_env, tmp_path):
    """lib-dynload is a link in the fake base: pointing it elsewhere keeps every string of sys.path
    but not what it resolves to."""
    assert base_env.audit(approve=True).exit_code == 0
    dynload = base_env.stdlib / "lib-dynload"
    copy = tmp_path / "dynload-copy"
    shutil.copytree(os.path.realpath(dynload), copy, symlinks=True)
    dynload.unlink()
    dynload.symlink_to(copy)
    report = base_env.audit()
    assert ("syspath_changed", str(dynload)) in kinds(report, "integrity"), kinds(report)
    assert report.exit_code == 1


def test_env_file_pythonpath_is_on_the_path(base_env, tmp_path):
    extra = tmp_path / "pp"
    extra.mkdir()
    (extra / "json.py").write_text("")
    envfile = tmp_path / "trainer.env"
    envfile.write_text(f"export PYTHONPATH='{extra}'\n")
    target = discover_python(base_env.python, env_files=[str(envfile)])
    assert target.closure[0] == (str(extra), "env:PYTHONPATH")
    report = run_audit(base_env.settings(baseline_path=None), target)
    assert ("shadowing", str(extra / "json.py")) in kinds(report, "integrity")


# ---- budgets ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_sparse_multi_tib_file_is_a_finding_within_the_budget(base_env):
    big = base_env.stdlib / "huge_module.py"
    with open(big, "wb") as fh:
        fh.truncate(4 * 1024**4)  # 4 TiB, sparse
    hook = base_env.stdlib / "sitecustomize.py"
    hook.write_text(f"print({MARK!r})\n")
    started = time.monotonic()
    report = base_env.audit(baseline_path=None)
    assert time.monotonic() - started < 60
    assert {("oversized", str(big)), ("startup_hook", str(hook))} <= kinds(report, "integrity")
    assert report.exit_code == 1


def test_a_spent_budget_is_incomplete_and_keeps_what_was_found(base_env):
    hook = base_env.stdlib / "sitecustomize.py"
    hook.write_text(f"print({MARK!r})\n")
    settings = base_env.settings(policy=_policy(max_audit_bytes=1), baseline_path=None)
    report = run_audit(settings, discover_python(base_env.python))
    assert report.exit_code == 3
    assert any("byte budget" in r for r in report.incomplete), report.incomplete[:3]
    assert ("startup_hook", str(hook)) in kinds(report, "integrity")


# ---- benign image operations -----------------------------------------------------------------------


def _purge_pycache(root) -> int:
    count = 0
    for d, dirs, _ in os.walk(root):
        if "__pycache__" in dirs:
            shutil.rmtree(os.path.join(d, "__pycache__"))
            count += 1
    return count


BENIGN_SITE = {
    "purge_pycache": lambda env: _purge_pycache(env.site) or None,
    "compileall": lambda env: subprocess.run([env.python, "-m", "compileall", "-q", "-f", str(env.site)], check=True),
    "optimized_O": lambda env: subprocess.run([env.python, "-O", "-c", "import six, idna"], check=True),
    "optimized_OO": lambda env: subprocess.run([env.python, "-OO", "-c", "import six, idna"], check=True),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BENIGN_SITE))
def test_benign_site_packages_operation_stays_clean(name, test_env):
    assert test_env.audit(approve=True).exit_code == 0
    BENIGN_SITE[name](test_env)
    report = test_env.audit(full_pass=True)
    assert report.findings == [] and report.exit_code == 0, report.findings


@pytest.mark.timeout(300)
def test_read_only_venv_stays_clean(test_env):
    assert test_env.audit(approve=True).exit_code == 0
    subprocess.run(["chmod", "-R", "a-w", str(test_env.venv)], check=True)
    try:
        report = test_env.audit(full_pass=True)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(test_env.venv)], check=True)
    assert report.findings == [] and report.exit_code == 0, report.findings


@pytest.mark.timeout(300)
def test_first_import_of_a_pyc_less_stdlib_stays_clean_and_a_planted_pyc_does_not(base_env):
    shutil.rmtree(base_env.stdlib / "json" / "__pycache__")
    settings = base_env.settings(policy=_policy(check_pyc=True))
    assert run_audit(replace(settings, approve=True), discover_python(base_env.python)).exit_code == 0
    _run(base_env.python, "import json.decoder")  # Python writes json/__pycache__/*.pyc
    written = sorted(os.listdir(base_env.stdlib / "json" / "__pycache__"))
    assert f"decoder.{TAG}.pyc" in written
    report = run_audit(settings, discover_python(base_env.python))
    assert report.findings == [] and report.exit_code == 0, report.findings
    assert report.stats["integrity"]["pyc_checked"] + report.stats["integrity"]["pyc_verdict_cached"] >= len(written)
    import importlib._bootstrap_external as bx

    source = base_env.stdlib / "json" / "decoder.py"
    st = source.stat()
    code = compile(source.read_text() + f"\nprint({MARK!r})\n", str(source), "exec")
    pyc = base_env.stdlib / "json" / "__pycache__" / f"decoder.{TAG}.pyc"
    pyc.write_bytes(bytes(bx._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    assert MARK in _run(base_env.python, "import json.decoder")
    report = run_audit(settings, discover_python(base_env.python))
    assert ("pyc_mismatch", str(pyc)) in kinds(report, "integrity")


# ---- pure parsers ----------------------------------------------------------------------------------


def test_parsers_never_run_what_they_read(tmp_path):
    flag = tmp_path / "ran"
    evil = f"MAPPING = {{'a': __import__('os').system('touch {flag}')}}\n".encode()
    assert finder_targets(evil) is None and not flag.exists()
    assert finder_targets(b"MAPPING = {'a': '/x'}\nNAMESPACES = {'a.b': ['/y']}\n") == {"a": ["/x"], "a.b": ["/y"]}
    assert pth_lines(b"# c\n\n/x \nimport os\nimport\tsys\n") == (["/x"], ["import os", "import\tsys"])
    assert parse_env_file(b"export A='1'\nB=\"2\"\n# C=3\nbad line\n") == {"A": "1", "B": "2"}


def test_an_unknown_interpreter_is_refused_not_run(tmp_path):
    from warden.deps.errors import TargetError

    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    flag = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\ntouch {flag}\n")
    script.chmod(0o755)
    with pytest.raises(TargetError):
        compute_layout(str(script))
    assert not flag.exists()


def test_a_finder_whose_targets_are_code_makes_the_audit_incomplete(base_env):
    site = base_env.venv / "lib" / PY_DIR / "site-packages"
    (site / "__editable___proj_1_0_finder.py").write_text("import os\nMAPPING = {'proj': os.environ['HOME']}\n")
    pth = site / "__editable__.proj-1.0.pth"
    pth.write_text("import __editable___proj_1_0_finder; __editable___proj_1_0_finder.install()")
    report = base_env.audit(baseline_path=None)
    assert any(r.startswith("discovery partial: ") and "editable finder" in r for r in report.incomplete)
    assert ("pth_not_allowed", str(pth)) in kinds(report, "integrity")
    assert report.exit_code == 3
