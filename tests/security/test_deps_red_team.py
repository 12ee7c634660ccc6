"""Red team of the dependency auditor (issue 31: import closure, D1-D4 of docs/threat-model.md).

Each attack plants a payload in a throwaway venv made here with ``python -m venv`` (never the
repository's .venv), first shows that the payload runs in the target's own interpreter (a marker
file it writes), then audits the target against a baseline approved before the attack.

- an attack the auditor stops is a plain regression test (a blocking finding, or a clean refusal);
- an attack that passes is ``xfail(strict=True)`` with the finding in its reason: it turns into a
  failure (XPASS) the day the mechanism closes it, and the marker is then removed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import py_compile
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.warden.deps.deps_helpers import fake_base_template
from warden.deps.audit import AuditReport, AuditSettings, run_audit
from warden.deps.environment import discover_python
from warden.deps.policy import DepsPolicy, IntegrityRules

SHORT = f"{sys.version_info.major}.{sys.version_info.minor}"
TAG = sys.implementation.cache_tag
AUDIT_DEADLINE = 60.0


class Target:
    """A throwaway venv, its auditor state, and the files the deployment runs it with."""

    def __init__(self, root: Path, base: Path | None = None) -> None:
        """``base``: a base interpreter the test owns (then the venv sees its system site-packages)."""
        self.root = root
        self.venv = root / "venv"
        creator = str(base / "bin" / f"python{SHORT}") if base else sys.executable
        flags = ["--system-site-packages"] if base else []
        subprocess.run([creator, "-m", "venv", "--without-pip", *flags, str(self.venv)], check=True, timeout=120)
        self.python = str(self.venv / "bin" / "python")
        self.site = self.venv / "lib" / f"python{SHORT}" / "site-packages"
        self.state = root / "state"
        self.state.mkdir()
        self.home = root / "home"
        self.home.mkdir()
        self.work = root / "work"  # the deployment's working directory
        self.work.mkdir()
        self.env_file = root / "python.env"
        self.env_file.write_text("# the deployment's environment\nPYTHONDONTWRITEBYTECODE=1\n")
        self.marker = root / "marker"

    def environ(self) -> dict[str, str]:
        """The environment the deployment starts the target with: its env file over a bare one."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        for line in self.env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                env[key.strip()] = value.strip()
        return env

    def run_target(self, code: str = "pass", timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The target's own interpreter, as the deployment runs it (run by the test, never by the auditor)."""
        return subprocess.run(
            [self.python, "-c", code],
            env=self.environ(),
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def assert_payload_runs(self, code: str = "pass") -> None:
        if self.marker.exists():
            self.marker.unlink()
        proc = self.run_target(code)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert self.marker.exists(), f"the payload did not run in the target: {proc.stderr[-2000:]}"
        self.marker.unlink()

    def target_stdlib_file(self, module: str) -> str:
        """Where the target imports ``module`` from (asked of the target by the test)."""
        proc = subprocess.run(
            [self.python, "-I", "-c", f"import {module}; print({module}.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return proc.stdout.strip()

    def audit(self, approve: bool = False) -> AuditReport:
        settings = AuditSettings(
            policy=DepsPolicy(integrity=IntegrityRules(workers=2)),
            lock_path=None,
            osv_db=None,
            state_dir=str(self.state),
            baseline_path=str(self.state / "baseline.json"),
            pip_audit=False,
            approve=approve,
        )
        target = discover_python(self.python, user_homes=(str(self.home),), env_files=(str(self.env_file),))
        return run_audit(settings, target)

    def approve(self) -> None:
        report = self.audit(approve=True)
        assert report.exit_code == 0, (blocking(report), report.incomplete)
        assert any("baseline approved" in n for n in report.notes), report.notes
        clean = self.audit()
        assert clean.exit_code == 0, (blocking(clean), clean.incomplete)


def refused_approval(t: Target, fixes: set[str]) -> None:
    """An attack planted before approval: the approval is refused (caught as assert_caught says), no baseline."""
    assert_caught(t.audit(approve=True), fixes)
    assert not (t.state / "baseline.json").exists(), "a baseline was approved over the attack"


def blocking(report: AuditReport) -> list[tuple[str, str]]:
    return sorted((f.kind, f.subject) for f in report.findings if f.blocking)


def assert_found(report: AuditReport, *kinds: str) -> None:
    """The attack ends in each of ``kinds`` as a blocking finding, the audit complete (exit 1)."""
    found = {k for k, _ in blocking(report)}
    assert not set(kinds) - found, f"expected {sorted(kinds)}; got {blocking(report)} / {report.incomplete}"
    assert report.exit_code == 1, report.incomplete


def assert_caught(report: AuditReport, fixes: set[str]) -> None:
    """For the xfail attacks (they pass today): the audit must not be clean, and the finding must be
    one a fix of the mechanism named in the reason would give (the kind is the fixer's choice)."""
    found = {k for k, _ in blocking(report)}
    assert report.exit_code in (1, 3), "the audit passed"
    assert found & fixes or report.incomplete, f"not stopped by the mechanism: {blocking(report)}"


def record_row(site: Path, rel: str) -> str:
    data = (site / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def install_dist(site: Path, name: str = "rtmod", source: str = "VALUE = 1\n") -> None:
    """A minimal installed distribution (one module, a RECORD as pip writes it: pycs without hashes)."""
    (site / f"{name}.py").write_text(source)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    rows = [record_row(site, r) for r in (f"{name}.py", f"{info.name}/METADATA", f"{info.name}/INSTALLER")]
    rows += [f"__pycache__/{name}.{TAG}.pyc,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def unchecked_pyc(source_text: str, cfile: str, scratch: Path) -> None:
    """Bytecode of ``source_text`` at ``cfile``, unchecked-hash: Python loads it whatever the source says."""
    src = scratch / f"payload-{hashlib.sha256(cfile.encode()).hexdigest()[:8]}.py"
    src.write_text(source_text)
    os.makedirs(os.path.dirname(cfile), exist_ok=True)
    py_compile.compile(
        str(src), cfile=cfile, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )


def marker_code(marker: Path) -> str:
    """Writes the marker using only a builtin module (runs even before ``open`` exists at start-up)."""
    return f"\n__import__('posix').close(__import__('posix').open({str(marker)!r}, 0o101, 0o644))\n"


def audit_within(t: Target, deadline: float = AUDIT_DEADLINE) -> AuditReport:
    """The audit, waited on with a deadline (a hang is a failure, not a stuck test run)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["report"] = t.audit()
        except BaseException as exc:  # reported below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"the audit did not finish within {deadline:.0f}s"
    assert "error" not in box, f"the audit raised {box.get('error')!r}"
    report = box["report"]
    assert isinstance(report, AuditReport)
    return report


@pytest.fixture
def target(tmp_path: Path) -> Target:
    return Target(tmp_path)


@pytest.fixture
def system_site_target(tmp_path: Path, fake_base_template: Path) -> Target:
    """A venv with system site-packages of a base the test owns (deps_helpers.fake_base_template:
    an empty base site-packages, so the host's own .pth files are not part of the target)."""
    base = tmp_path / "base"
    shutil.copytree(fake_base_template, base, symlinks=True)
    return Target(tmp_path, base)


__all__ = ["fake_base_template"]  # the session fixture, shared with tests/warden/deps


# --- environment files: what the auditor reads of them is PYTHONPATH/PYTHONHOME/PYTHONUSERBASE/PYTHONNOUSERSITE


def test_env_file_pycache_prefix_runs_planted_stdlib_bytecode(target: Target) -> None:
    target.approve()
    encodings = target.target_stdlib_file("encodings")
    prefix = target.root / "pycache"
    cfile = str(prefix) + os.path.dirname(encodings) + os.sep + f"__init__.{TAG}.pyc"
    original = Path(encodings).read_text()
    unchecked_pyc(original + marker_code(target.marker), cfile, target.root)
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPYCACHEPREFIX={prefix}\n")
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"syspath_changed", "environment_changed", "closure_added", "pyc_mismatch"})


def test_env_file_empty_pythonpath_component_adds_working_directory(target: Target) -> None:
    target.approve()
    (target.work / "sitecustomize.py").write_text(marker_code(target.marker))
    with target.env_file.open("a") as fh:
        fh.write("PYTHONPATH=:\n")
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"syspath_changed", "startup_hook", "shadowing", "closure_added"})


def test_env_file_ld_preload_runs_native_code(target: Target) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here to build the preloaded library")
    target.approve()
    src = target.root / "preload.c"
    src.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'  int fd = open("{target.marker}", O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd);\n'
        "}\n"
    )
    lib = target.root / "libplanted.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    with target.env_file.open("a") as fh:
        fh.write(f"LD_PRELOAD={lib}\n")
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"environment_changed", "syspath_changed"})


def test_env_file_pythonpath_directory_is_walked(target: Target) -> None:
    """Control for the two above: a non-empty PYTHONPATH entry is followed (a hook there is found)."""
    target.approve()
    extra = target.root / "extra"
    extra.mkdir()
    (extra / "sitecustomize.py").write_text(marker_code(target.marker))
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPATH={extra}\n")
    target.assert_payload_runs()
    assert_found(audit_within(target), "syspath_changed", "startup_hook")


# --- pyvenv.cfg parsed differently by the auditor and by site.venv()


def test_pyvenv_cfg_vertical_tab_enables_system_site_and_user_site(target: Target) -> None:
    """``str.splitlines`` splits at \\x0b, site.venv() does not and strips it off the key: the
    auditor reads no include-system-site-packages, the target reads true (and enables the user site)."""
    target.approve()
    user_site = target.home / ".local" / "lib" / f"python{SHORT}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(marker_code(target.marker))
    cfg = target.venv / "pyvenv.cfg"
    text = cfg.read_text().replace("include-system-site-packages = false", "include-system-site-packages\x0b= true")
    assert text != cfg.read_text()
    cfg.write_text(text)
    target.assert_payload_runs()
    assert_found(audit_within(target), "environment_changed")


# --- .pth files


def test_dot_named_pth_runs_on_this_python_and_is_found(target: Target) -> None:
    """CPython 3.11's site reads ``.name.pth`` too (the skip of dot-files came later); syspath.py skips
    such names when computing the path, the .pth check must not."""
    target.approve()
    (target.site / ".hidden.pth").write_text(f"import posix; posix.close(posix.open({str(target.marker)!r}, 0o101))\n")
    if sys.version_info >= (3, 13):
        pytest.skip("site skips dot-named .pth files from 3.13 on")
    target.assert_payload_runs()
    assert_found(audit_within(target), "pth_not_allowed")


def test_pth_with_bom_crlf_and_semicolon_import_is_found(target: Target) -> None:
    target.approve()
    (target.site / "0000.pth").write_bytes(
        b"# comment\r\n\r\nimport os;import posix; posix.close(posix.open(%r, 0o101))\r\n" % str(target.marker).encode()
    )
    (target.site / "0001.pth").write_bytes(b"\xef\xbb\xbf" + str(target.root).encode() + b"\r\n")
    target.assert_payload_runs()
    assert_found(audit_within(target), "pth_not_allowed")


def test_fifo_pth_hangs_the_target_not_the_audit(target: Target) -> None:
    """A FIFO named ``.pth``: site.py blocks on it at every start (shown: the target does not start);
    the audit must finish with a finding, never open it."""
    target.approve()
    os.mkfifo(target.site / "aaa.pth")
    with pytest.raises(subprocess.TimeoutExpired):
        target.run_target(timeout=3)
    assert_found(audit_within(target), "special_file")


# --- bytecode in site-packages


def test_unchecked_hash_pyc_of_an_installed_module_is_a_mismatch(target: Target) -> None:
    install_dist(target.site)
    target.approve()
    cfile = str(target.site / "__pycache__" / f"rtmod.{TAG}.pyc")
    unchecked_pyc("VALUE = 1\n" + marker_code(target.marker), cfile, target.root)
    target.assert_payload_runs("import rtmod")
    assert_found(audit_within(target), "pyc_mismatch")


def test_sourceless_package_shadows_an_installed_module(target: Target) -> None:
    """``rtmod/__init__.pyc`` (a directory wins over ``rtmod.py`` in the path finder)."""
    install_dist(target.site)
    target.approve()
    pkg = target.site / "rtmod"
    unchecked_pyc("VALUE = 1\n" + marker_code(target.marker), str(pkg / "__init__.pyc"), target.root)
    target.assert_payload_runs("import rtmod")
    assert_found(audit_within(target), "unowned")


def test_env_file_pycache_prefix_runs_planted_dependency_bytecode(target: Target) -> None:
    install_dist(target.site)
    target.approve()
    prefix = target.root / "pycache"
    cfile = str(prefix) + str(target.site) + os.sep + f"rtmod.{TAG}.pyc"
    unchecked_pyc("VALUE = 1\n" + marker_code(target.marker), cfile, target.root)
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPYCACHEPREFIX={prefix}\n")
    target.assert_payload_runs("import rtmod")
    assert_caught(audit_within(target), {"syspath_changed", "environment_changed", "pyc_mismatch", "closure_added"})


# --- more environment-file semantics the auditor reads differently from CPython


def test_env_file_relative_pythonpath_resolved_against_the_auditors_cwd(target: Target) -> None:
    """Fixed: a relative entry (CPython resolves it against the target's working directory, not known to
    the auditor) makes the audit incomplete, so the approval itself is refused."""
    rel = "rt-relative-src-7f3a"
    assert not os.path.lexists(rel), "the auditor's cwd must not hold the entry"
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPATH={rel}\n")  # approved so: a relative entry, as images write 'PYTHONPATH=src'
    refused_approval(target, {"syspath_changed", "startup_hook", "closure_added", "shadowing"})
    (target.work / rel).mkdir()
    (target.work / rel / "sitecustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"syspath_changed", "startup_hook", "closure_added", "shadowing"})


def test_env_file_empty_pythonnousersite_leaves_user_site_on(system_site_target: Target) -> None:
    target = system_site_target
    with target.env_file.open("a") as fh:
        fh.write("PYTHONNOUSERSITE=\n")
    target.approve()
    user_site = target.home / ".local" / "lib" / f"python{SHORT}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"syspath_changed", "startup_hook", "closure_added"})


def test_user_site_appearing_in_a_system_site_venv_is_found(system_site_target: Target) -> None:
    """Control for the above: without the variable, the user site appearing is a path change."""
    target = system_site_target
    target.approve()
    user_site = target.home / ".local" / "lib" / f"python{SHORT}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_found(audit_within(target), "syspath_changed", "startup_hook")


# --- sys.path entries whose name ends in .zip


def test_directory_named_zip_on_sys_path_is_never_walked(target: Target) -> None:
    vendored = target.root / "vendor.zip"
    vendored.mkdir()
    (vendored / "helper.py").write_text("X = 1\n")
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPATH={vendored}\n")
    target.approve()
    (vendored / "sitecustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"startup_hook", "stdlib_added", "stdlib_changed", "closure_added"})


def test_zip_on_sys_path_appearing_with_a_hook_is_found(target: Target) -> None:
    import zipfile

    archive = target.root / "deps.zip"
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPATH={archive}\n")
    target.approve()  # absent at approval
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("sitecustomize.py", marker_code(target.marker))
    target.assert_payload_runs()
    assert_found(audit_within(target), "startup_hook", "stdlib_added")


def test_zip_without_zip_suffix_on_sys_path_is_found(target: Target) -> None:
    """zipimport takes any file name: an approved-absent entry 'deps.bundle' becomes a zip with a hook."""
    import zipfile

    archive = target.root / "deps.bundle"
    with target.env_file.open("a") as fh:
        fh.write(f"PYTHONPATH={archive}\n")
    target.approve()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("sitecustomize.py", marker_code(target.marker))
    target.assert_payload_runs()
    assert_found(audit_within(target), "closure_added")


# --- unbounded work


def test_sparse_huge_files_and_symlink_loops_end_in_findings_within_the_deadline(target: Target) -> None:
    """An owned module replaced by a 4 TiB sparse file, an unowned one beside it, link
    loops: the hook planted beside them is still reported, within the deadline."""
    install_dist(target.site)
    target.approve()
    owned = target.site / "rtmod.py"
    with owned.open("r+b") as fh:
        fh.truncate(4 << 40)  # 4 TiB, sparse
    with (target.site / "zz_huge.py").open("wb") as fh:
        fh.truncate(4 << 40)
    os.symlink("loop_b", target.site / "loop_a")
    os.symlink("loop_a", target.site / "loop_b")
    os.symlink(".", target.site / "loop_dir")
    (target.site / "sitecustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    report = audit_within(target)
    assert_found(report, "startup_hook", "tampered", "unowned")
    assert ("tampered", str(owned)) in blocking(report)  # its size is not RECORD's: never read
    assert {("unowned", str(target.site / n)) for n in ("loop_a", "loop_b", "loop_dir")} <= set(blocking(report))


def test_pyvenv_cfg_vertical_tab_approved_then_user_site_appears(system_site_target: Target) -> None:
    """Fixed: pyvenv.cfg is read as site.py reads it (the system and user site are on), and a line that
    is not a plain 'key = value' is venv_config, so the approval itself is refused."""
    target = system_site_target
    cfg = target.venv / "pyvenv.cfg"
    text = cfg.read_text().replace("include-system-site-packages = true", "include-system-site-packages\x0b= true")
    assert text != cfg.read_text()
    cfg.write_text(text)
    refused_approval(target, {"syspath_changed", "startup_hook", "venv_config"})
    user_site = target.home / ".local" / "lib" / f"python{SHORT}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"syspath_changed", "startup_hook", "venv_config"})


# --- the base interpreter's stdlib (a base the test owns)


def test_stdlib_sitecustomize_is_found(system_site_target: Target) -> None:
    target = system_site_target
    target.approve()
    stdlib = Path(target.target_stdlib_file("json")).parent.parent
    (stdlib / "sitecustomize.py").write_text(marker_code(target.marker))
    target.assert_payload_runs()
    assert_found(audit_within(target), "stdlib_added", "startup_hook")


def test_stdlib_unchecked_hash_pyc_is_a_mismatch_and_a_purge_is_not(system_site_target: Target) -> None:
    target = system_site_target
    json_init = Path(target.target_stdlib_file("json"))
    cache = json_init.parent / "__pycache__"
    shutil.rmtree(cache, ignore_errors=True)  # benign: an image purging __pycache__ before approval...
    target.approve()
    cache.mkdir(exist_ok=True)  # ...and Python writing it back on first import is benign too
    proc = subprocess.run([target.python, "-c", "import json"], capture_output=True, text=True, timeout=60, env={})
    assert proc.returncode == 0 and (cache / f"__init__.{TAG}.pyc").exists(), proc.stderr
    regenerated = target.audit()
    assert regenerated.exit_code == 0, (blocking(regenerated), regenerated.incomplete)
    unchecked_pyc(json_init.read_text() + marker_code(target.marker), str(cache / f"__init__.{TAG}.pyc"), target.root)
    target.assert_payload_runs("import json")
    assert_found(audit_within(target), "pyc_mismatch")


def test_pyvenv_cfg_vertical_tab_first_home_swaps_the_stdlib(system_site_target: Target) -> None:
    """Fixed: the first home is taken as getpath takes it (the other base's stdlib, its hook found), and a
    line that is not a plain 'key = value' is venv_config, so the approval itself is refused."""
    target = system_site_target
    other = target.root / "other-base"
    shutil.copytree(target.root / "base", other, symlinks=True)
    (other / "lib" / f"python{SHORT}" / "sitecustomize.py").write_text(marker_code(target.marker))
    cfg = target.venv / "pyvenv.cfg"
    cfg.write_text(f"home\x0b= {other / 'bin'}\n" + cfg.read_text())
    refused_approval(target, {"venv_config", "syspath_changed", "startup_hook"})
    target.assert_payload_runs()
    assert_caught(audit_within(target), {"venv_config", "syspath_changed", "startup_hook"})
