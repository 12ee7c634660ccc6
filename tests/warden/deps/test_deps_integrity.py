"""A real venv (pip, setuptools, six, idna from PyPI wheels), attacked seven ways; each is caught."""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
from dataclasses import replace

from tests.warden.deps.deps_helpers import kinds, record_hash
from warden.deps.audit import run_audit
from warden.deps.environment import discover_site_packages
from warden.deps.policy import DriftRules, IntegrityRules


def test_clean_venv_audits_clean_with_pip_and_setuptools(test_env):
    report = test_env.audit(approve=True)
    assert report.findings == [] and report.exit_code == 0, report.findings
    names = {d.canonical for d in report.dists}
    assert {"pip", "setuptools", "six", "idna"} <= names  # pip freeze would hide pip and setuptools
    stats = report.stats["integrity"]
    assert stats["files_hashed"] > 500 and stats["pyc_checked"] >= 6 and stats["full_pass"]
    assert os.path.exists(test_env.state_dir / "baseline.json")
    again = test_env.audit()
    assert again.exit_code == 0
    assert again.stats["integrity"]["files_hashed"] == 0 and again.stats["integrity"]["files_cached"] > 500


def test_edited_py_is_tampered_even_with_size_and_mtime_kept(test_env):
    test_env.audit()  # fills the cache: the next audit is incremental
    six = test_env.site / "six.py"
    before = os.stat(six)
    data = six.read_bytes()
    six.write_bytes(data.replace(b"PY2 = sys.version_info[0] == 2", b"PY2 = sys.version_info[0] == 3"))
    os.utime(six, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -d`: only ctime tells
    assert os.stat(six).st_size == before.st_size
    report = test_env.audit()
    assert ("tampered", str(six)) in kinds(report, "integrity")
    assert report.exit_code == 1


def test_rewritten_record_is_caught_by_the_approved_baseline(test_env):
    test_env.audit(approve=True)
    target = test_env.site / "idna" / "core.py"
    new = target.read_bytes() + b"\nimport os  # injected\n"
    target.write_bytes(new)
    record = next(test_env.site.glob("idna-*.dist-info")) / "RECORD"
    rows = []
    for row in record.read_text().splitlines():
        if row.startswith("idna/core.py,"):
            row = f"idna/core.py,{record_hash(new)},{len(new)}"
        rows.append(row)
    record.write_text("\n".join(rows) + "\n")
    without_baseline = test_env.audit(baseline_path=None, wheel_dirs=())
    assert not [f for f in without_baseline.findings if f.check == "integrity"]  # RECORD alone is fooled
    with_wheels = test_env.audit(baseline_path=None)  # the locked wheel's RECORD is not fooled either
    assert kinds(with_wheels, "integrity") == {("record_mismatch", "idna")}
    report = test_env.audit()
    assert ("record_changed", str(target)) in kinds(report, "integrity")
    assert report.exit_code == 1


def test_swapped_pyc_is_caught(test_env):
    source = test_env.site / "six.py"
    pyc = (
        test_env.site
        / "__pycache__"
        / f"six.{importlib.util.MAGIC_NUMBER and __import__('sys').implementation.cache_tag}.pyc"
    )
    assert pyc.exists()
    st = os.stat(source)
    evil = compile("import os\nos.system('true')\n", str(source), "exec")
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc.write_bytes(header + marshal.dumps(evil))
    report = test_env.audit()
    assert ("pyc_mismatch", str(pyc)) in kinds(report, "integrity")
    # A stale pyc (header does not match the source) is never loaded, so it is not a finding.
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(evil))
    stale = test_env.audit()
    assert not [f for f in stale.findings if f.kind == "pyc_mismatch"]
    assert stale.stats["integrity"]["pyc_stale"] == 1


def test_unowned_module_and_pth_files_are_caught(test_env):
    hook = test_env.site / "sitecustomize.py"
    hook.write_text("import os\n")
    (test_env.site / "zz_evil.pth").write_text("import os; os.environ['X'] = '1'\n")
    allowed = test_env.site / "distutils-precedence.pth"  # allowed by its content digest only
    allowed.write_text("import os\n")
    report = test_env.audit()
    found = kinds(report, "integrity")
    assert ("unowned", str(hook)) in found and ("startup_hook", str(hook)) in found
    assert ("pth_not_allowed", str(test_env.site / "zz_evil.pth")) in found
    assert ("pth_not_allowed", str(allowed)) in found  # same name, other content
    assert ("tampered", str(allowed)) in found  # and setuptools' RECORD still vouches for content
    pth = next(f for f in report.findings if f.subject.endswith("zz_evil.pth"))
    assert "runs code at every interpreter start-up" in pth.message
    digest = hashlib.sha256(hook.read_bytes()).hexdigest()
    allow = IntegrityRules(unowned_allow=("sitecustomize.py",), startup_allow=(digest,), workers=2)
    report = test_env.audit(replace(test_env.policy(), integrity=allow))
    assert not {(k, s) for k, s in kinds(report) if s == str(hook)}


def test_upgraded_and_extra_packages_drift(test_env):
    test_env.install("six==1.17.0", "iniconfig==2.0.0")
    report = test_env.audit()
    assert kinds(report, "drift") == {("wrong_version", "six"), ("extra", "iniconfig")}
    assert not [f for f in report.findings if f.check == "integrity" and f.blocking]  # pip's own install is clean
    allowed = replace(test_env.policy(), drift=DriftRules(allow_extra=("iniconfig",)))
    assert kinds(test_env.audit(allowed), "drift") == {("wrong_version", "six")}


def test_local_version_and_pip_setuptools_pins_are_compared_exactly(test_env, tmp_path):
    text = test_env.lock.read_text()
    lock = tmp_path / "local.txt"
    lock.write_text(text.replace("six==1.16.0", "six==1.16.0+cu124").replace("setuptools==", "setuptools==1"))
    report = test_env.audit(lock_path=str(lock), checks=frozenset({"drift"}))
    assert {k for k, _ in kinds(report)} == {"wrong_version"}
    assert {s for _, s in kinds(report)} == {"six", "setuptools"}
    missing = tmp_path / "missing.txt"
    missing.write_text(text + "iniconfig==2.0.0 --hash=sha256:" + "a" * 64 + "\n")
    assert kinds(test_env.audit(lock_path=str(missing), checks=frozenset({"drift"}))) == {("missing", "iniconfig")}


def test_site_packages_target_read_only_and_missing_files(test_env):
    target = discover_site_packages(str(test_env.site), {"sys_platform": "linux"})
    assert target.markers["python_version"] == "3.11" and target.cache_tag
    (test_env.site / "idna" / "codec.py").unlink()
    report = run_audit(test_env.settings(), target)
    assert ("missing_file", str(test_env.site / "idna" / "codec.py")) in kinds(report)
    assert report.stats["integrity"]["outside_missing"] == 0


def test_broken_distributions_do_not_stop_the_audit(test_env):
    info = next(test_env.site.glob("six-*.dist-info"))
    (info / "METADATA").write_text("garbage without headers")
    (next(test_env.site.glob("idna-*.dist-info")) / "RECORD").unlink()
    report = test_env.audit()
    assert ("no_record", "idna") in kinds(report)
    assert report.exit_code == 1


def test_pyc_verdict_key_covers_every_input_of_the_comparison():
    from warden.deps.pyccheck import verdict_key

    base = ("sha256=pyc", "sha256=src", "3.11.9|cpython-311|a70d0d0a", 0)
    variants = [
        ("sha256=other", *base[1:]),
        (base[0], "sha256=other", *base[2:]),
        (*base[:2], "3.11.10|cpython-311|a70d0d0a", base[3]),
        (*base[:3], 1),
    ]
    keys = {verdict_key(*v) for v in variants}
    assert len(keys) == 4 and verdict_key(*base) not in keys


def test_pyc_header_says_whether_python_loads_it():
    from warden.deps.pyccheck import is_loaded

    magic = importlib.util.MAGIC_NUMBER
    stamp = magic + bytes(4) + (1000).to_bytes(4, "little") + (42).to_bytes(4, "little")
    assert is_loaded(stamp, None, 1000, 42) is True
    assert is_loaded(stamp, None, 1001, 42) is False
    source = b"x = 1\n"
    checked = magic + (3).to_bytes(4, "little") + importlib.util.source_hash(source)
    assert is_loaded(checked, None, 0, 0) is None  # needs the source bytes
    assert is_loaded(checked, source, 0, 0) is True
    assert is_loaded(checked, b"x = 2\n", 0, 0) is False
    assert is_loaded(magic + (1).to_bytes(4, "little") + bytes(8), None, 0, 0) is True  # unchecked
    assert is_loaded(b"\0\0\0\0" + stamp[4:], None, 1000, 42) is False  # another magic
