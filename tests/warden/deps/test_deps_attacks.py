"""Attack generator: one case per tampering class of issue 19, on a real venv built from PyPI
wheels, each asserting the exact finding; and benign changes that must stay clean.

Each case approves the baseline of the clean venv first (as the sidecar does on its first
clean audit), then attacks, then audits: the finding named by the case must be there, and
the audit must exit 1 (3 where the class is "could not be checked").
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import importlib.util
import json
import marshal
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import replace

import pytest

from tests.warden.deps.deps_helpers import (
    install_rebuilt_six_from_an_index,
    kinds,
    pip_install,
    rebuilt_six,
    record_hash,
    sha256_file,
)
from warden.deps.audit import run_audit
from warden.deps.environment import discover_python
from warden.deps.ignores import IgnoreRule
from warden.deps.osv.importer import import_export, server_date
from warden.deps.osv.loader import load_database
from warden.deps.policy import LockRules


def _info(env, name: str):
    return next(env.site.glob(f"{name}-*.dist-info"))


def _append_row(env, dist: str, row: str) -> None:
    record = _info(env, dist) / "RECORD"
    record.write_text(record.read_text() + row + "\n")


def _rewrite_row(env, dist: str, rel: str, data: bytes) -> None:
    record = _info(env, dist) / "RECORD"
    rows = [
        f"{rel},{record_hash(data)},{len(data)}" if r.startswith(rel + ",") else r
        for r in record.read_text().splitlines()
    ]
    record.write_text("\n".join(rows) + "\n")


# ---- attacks: each returns the (kind, subject) the audit must report -------------------------


def unhashed_row(env):
    evil = env.site / "idna" / "evil.py"
    evil.write_text("import os\n")
    _append_row(env, "idna", "idna/evil.py,,")
    return "unhashed", str(evil)


def weak_hash_row(env):
    evil = env.site / "idna" / "evil.py"
    evil.write_text("import os\n")
    digest = base64.urlsafe_b64encode(hashlib.md5(b"import os\n").digest()).rstrip(b"=").decode()
    _append_row(env, "idna", f"idna/evil.py,md5={digest},10")
    return "unhashed", str(evil)


def renamed_dist_info(env):
    core = env.site / "idna" / "core.py"
    data = core.read_bytes() + b"\nimport os  # injected\n"
    core.write_bytes(data)
    _rewrite_row(env, "idna", "idna/core.py", data)
    info = _info(env, "idna")
    info.rename(env.site / ("Idna" + info.name[4:]))
    return "record_changed", str(core)


def egg_info_replaces_dist_info(env):
    info = _info(env, "idna")
    shutil.rmtree(info)
    egg = env.site / "idna-3.7.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: idna\nVersion: 3.7\n\n")
    return "egg_info", "idna"


def approved_dist_removed(env):
    shutil.rmtree(_info(env, "six"))
    return "removed_from_baseline", "six"


def dist_added_with_matching_record(env):
    mod = env.site / "evilpkg.py"
    mod.write_text("import os\n")
    info = env.site / "evilpkg-1.0.dist-info"
    info.mkdir()
    meta = b"Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n\n"
    (info / "METADATA").write_bytes(meta)
    rows = [f"evilpkg.py,{record_hash(mod.read_bytes())},10", f"{info.name}/METADATA,{record_hash(meta)},{len(meta)}"]
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")
    return "not_in_baseline", "evilpkg"


def owned_file_becomes_link_outside(env, tmp_path):
    core = env.site / "idna" / "core.py"
    outside = tmp_path / "outside.py"
    outside.write_bytes(core.read_bytes())  # same bytes: following the link would pass
    core.unlink()
    core.symlink_to(outside)
    return "tampered", str(core)


def unowned_link_leaving_tree(env, tmp_path):
    link = env.site / "evil_data"
    link.symlink_to(tmp_path)
    return "link_outside", str(link)


def fifo_pth(env):
    fifo = env.site / "zz_fifo.pth"
    os.mkfifo(fifo)
    return "special_file", str(fifo)


def editable_pth_with_import(env):
    pth = env.site / "__editable__.evil-1.0.pth"
    pth.write_text("import os; os.environ['PWNED'] = '1'\n")
    return "pth_not_allowed", str(pth)


def distutils_pth_planted_unowned(env):
    # setuptools removed (RECORD and all), its well-known .pth name kept with new content
    pth = env.site / "distutils-precedence.pth"
    for info in env.site.glob("setuptools-*.dist-info"):
        shutil.rmtree(info)
    pth.write_text("import os; os.system('true')\n")
    return "pth_not_allowed", str(pth)


def pyvenv_home_elsewhere(env, tmp_path):
    other = tmp_path / "other-python" / "bin"
    other.mkdir(parents=True)
    for name in ("python3", "python"):
        (other / name).symlink_to(os.path.realpath(sys.executable))
    cfg = env.venv / "pyvenv.cfg"
    text = "".join(
        f"home = {other}\n" if line.startswith("home") else line for line in cfg.read_text().splitlines(True)
    )
    cfg.write_text(text)
    return "venv_config", str(cfg)


def python_wrapper(env):
    python = env.venv / "bin" / "python"
    real = os.path.realpath(python)
    python.unlink()
    python.write_text(f'#!/bin/sh\nPYTHONPATH=/tmp/evil exec {real} "$@"\n')
    python.chmod(0o755)
    return "interpreter_replaced", str(python)


def activate_exports_pythonpath(env):
    activate = env.venv / "bin" / "activate"
    activate.write_text(activate.read_text() + "export PYTHONPATH=/tmp/evil\n")
    return "venv_script_changed", str(activate)


def unowned_bin_script(env):
    script = env.venv / "bin" / "helper"
    script.write_text("#!/bin/sh\necho hi\n")
    return "unowned", str(script)


def base_interpreter_link_changed(env, tmp_path):
    # bin/python3 relinked to a copy of the interpreter: only the approved baseline knows the old link
    python3 = env.venv / "bin" / "python"
    copy = tmp_path / "python-copy"
    shutil.copy2(os.path.realpath(python3), copy)
    python3.unlink()
    python3.symlink_to(copy)
    return "environment_changed", str(python3)


def rebuilt_wheel_from_index(env, tmp_path):
    """six 1.16.0 rebuilt with one changed module, resolved by name from an index (no direct_url.json):
    the lock's hash is the original's, lock.wheel_dirs holds the original."""
    install_rebuilt_six_from_an_index(env, tmp_path)
    return "record_mismatch", "six"


# ---- .pyc: the body Python would load differs from its source (cached verdicts must not hide it) --

EVIL = "import os\nos.system('true')\n"


def _pyc(env, rel_source: str, optimize: int = 0) -> str:
    return importlib.util.cache_from_source(str(env.site / rel_source), optimization=optimize or "")


def _timestamp_header(source) -> bytes:
    st = os.stat(source)
    fields = (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + fields


def _hash_header(source, checked: bool) -> bytes:
    flags = 0b11 if checked else 0b01
    digest = importlib.util.source_hash(source.read_bytes())
    return importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + digest


def pyc_edited_source_unchanged(env):
    pyc = _pyc(env, "six.py")
    header = pathlib.Path(pyc).read_bytes()[:16]  # the header Python checks is left as it was
    with open(pyc, "wb") as fh:
        fh.write(header + marshal.dumps(compile(EVIL, str(env.site / "six.py"), "exec")))
    return "pyc_mismatch", pyc


def pyc_whose_source_changed(env):
    """The source gains a line, RECORD is rewritten to match, the pyc keeps the old code under a
    header made current for the new source: Python loads the old code, not the new source."""
    source = env.site / "idna" / "core.py"
    pyc = _pyc(env, "idna/core.py")
    body = pathlib.Path(pyc).read_bytes()[16:]
    data = source.read_bytes() + b"\nPATCHED = True\n"
    source.write_bytes(data)
    _rewrite_row(env, "idna", "idna/core.py", data)
    with open(pyc, "wb") as fh:
        fh.write(_timestamp_header(source) + body)
    return "pyc_mismatch", pyc


def checked_hash_pyc_with_evil_body(env):
    """The PEP 552 source hash is right (so Python loads it), the body is not the source's."""
    source = env.site / "idna" / "idnadata.py"
    pyc = _pyc(env, "idna/idnadata.py")
    with open(pyc, "wb") as fh:
        fh.write(_hash_header(source, checked=True) + marshal.dumps(compile(EVIL, str(source), "exec")))
    return "pyc_mismatch", pyc


def unchecked_hash_pyc_with_evil_body(env):
    source = env.site / "idna" / "codec.py"
    pyc = _pyc(env, "idna/codec.py")
    with open(pyc, "wb") as fh:
        fh.write(_hash_header(source, checked=False) + marshal.dumps(compile(EVIL, str(source), "exec")))
    return "pyc_mismatch", pyc


def optimized_pyc_planted(env):
    """An ``.opt-1.pyc`` (what ``python -O`` loads) with a current header and foreign code."""
    source = env.site / "six.py"
    pyc = _pyc(env, "six.py", optimize=1)
    with open(pyc, "wb") as fh:
        fh.write(_timestamp_header(source) + marshal.dumps(compile(EVIL, str(source), "exec", optimize=1)))
    return "pyc_mismatch", pyc


def pyc_replaced_by_link(env, tmp_path):
    """The pyc becomes a link to bytecode elsewhere (Python follows it; the auditor never does)."""
    source = env.site / "six.py"
    pyc = _pyc(env, "six.py")
    elsewhere = tmp_path / "evil.pyc"
    elsewhere.write_bytes(_timestamp_header(source) + marshal.dumps(compile(EVIL, str(source), "exec")))
    os.remove(pyc)
    os.symlink(elsewhere, pyc)
    return "pyc_mismatch", pyc


def pyc_replaced_by_fifo(env):
    """A FIFO where a pyc was: it must be reported without the audit blocking on it."""
    pyc = _pyc(env, "idna/core.py")
    os.remove(pyc)
    os.mkfifo(pyc)
    return "special_file", pyc


PYC_ATTACKS: dict[str, Callable] = {
    "pyc_edited_source_unchanged": pyc_edited_source_unchanged,
    "pyc_whose_source_changed": pyc_whose_source_changed,
    "checked_hash_pyc_with_evil_body": checked_hash_pyc_with_evil_body,
    "unchecked_hash_pyc_with_evil_body": unchecked_hash_pyc_with_evil_body,
    "optimized_pyc_planted": optimized_pyc_planted,
    "pyc_replaced_by_link": pyc_replaced_by_link,
    "pyc_replaced_by_fifo": pyc_replaced_by_fifo,
}

ATTACKS: dict[str, Callable] = {
    "unhashed_row": unhashed_row,
    "weak_hash_row": weak_hash_row,
    "renamed_dist_info": renamed_dist_info,
    "egg_info_replaces_dist_info": egg_info_replaces_dist_info,
    "approved_dist_removed": approved_dist_removed,
    "dist_added_with_matching_record": dist_added_with_matching_record,
    "owned_file_becomes_link_outside": owned_file_becomes_link_outside,
    "unowned_link_leaving_tree": unowned_link_leaving_tree,
    "fifo_pth": fifo_pth,
    "editable_pth_with_import": editable_pth_with_import,
    "distutils_pth_planted_unowned": distutils_pth_planted_unowned,
    "pyvenv_home_elsewhere": pyvenv_home_elsewhere,
    "python_wrapper": python_wrapper,
    "activate_exports_pythonpath": activate_exports_pythonpath,
    "unowned_bin_script": unowned_bin_script,
    "base_interpreter_link_changed": base_interpreter_link_changed,
    "rebuilt_wheel_from_index": rebuilt_wheel_from_index,
    **PYC_ATTACKS,
}


def _run(attack: Callable, env, tmp_path):
    params = attack.__code__.co_varnames[: attack.__code__.co_argcount]
    return attack(env, tmp_path) if "tmp_path" in params else attack(env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_caught(name, test_env, tmp_path):
    approved = test_env.audit(approve=True)
    assert approved.exit_code == 0, approved.findings
    expected = _run(ATTACKS[name], test_env, tmp_path)
    report = run_audit(test_env.settings(), discover_python(test_env.python))
    assert expected in kinds(report, "integrity"), sorted(kinds(report))
    assert report.exit_code == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(PYC_ATTACKS))
def test_pyc_attack_is_caught_by_a_full_pass_with_warm_verdicts(name, test_env, tmp_path):
    """The approval pass filled the content-keyed verdict cache; a full pass re-hashes and must
    still compile (and flag) the attacked pair while taking every other verdict from the cache."""
    approved = test_env.audit(approve=True, full_pass=True)
    assert approved.exit_code == 0, approved.findings
    assert approved.stats["integrity"]["pyc_checked"] > 0
    expected = _run(PYC_ATTACKS[name], test_env, tmp_path)
    report = test_env.audit(full_pass=True)
    assert expected in kinds(report, "integrity"), sorted(kinds(report))
    assert report.exit_code == 1
    stats = report.stats["integrity"]
    assert stats["pyc_verdict_cached"] >= approved.stats["integrity"]["pyc_checked"] - 2
    assert stats["pyc_checked"] <= 2


def test_unreadable_directory_makes_the_audit_incomplete(test_env, monkeypatch):
    """Root reads every directory, so the refusal is injected where the walk lists one."""
    hidden = str(test_env.site / "idna")
    real_scandir = os.scandir

    def scandir(path):
        if os.fspath(path) == hidden:
            raise PermissionError(13, "Permission denied", hidden)
        return real_scandir(path)

    monkeypatch.setattr("warden.deps.walk.os.scandir", scandir)
    report = test_env.audit()
    assert f"unreadable: {hidden}: cannot list directory (Permission denied)" in report.incomplete
    assert report.exit_code == 3


def test_startup_hook_in_the_base_stdlib(base_env):
    """sitecustomize.py planted in the stdlib directory of a base interpreter the test owns (the
    machine's stdlib is never written): it runs in the venv's Python, and is a finding without any
    baseline (test_deps_stdlib.py has the baseline cases)."""
    hook = base_env.stdlib / "sitecustomize.py"
    hook.write_text("print('PLANTED-BY-TEST')\n")
    assert "PLANTED-BY-TEST" in base_env.run_python()
    report = base_env.audit(baseline_path=None)
    assert kinds(report, "integrity") == {("startup_hook", str(hook))}
    assert report.exit_code == 1


# ---- benign: must stay clean after approval ----------------------------------------------------


def _compileall(env, *extra: str) -> None:
    cmd = [env.python, "-m", "compileall", "-q", *extra, str(env.site / "six.py"), str(env.site / "idna")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def force_reinstall(env, tmp_path):
    env.install("--force-reinstall", "--no-deps", "six==1.16.0", "idna==3.7")


def regenerated_pycache(env, tmp_path):
    for cache in [env.site / "__pycache__", env.site / "idna" / "__pycache__"]:
        shutil.rmtree(cache)
    _compileall(env)


def checked_hash_pyc(env, tmp_path):
    _compileall(env, "-f", "--invalidation-mode", "checked-hash")


BENIGN = {
    "force_reinstall": force_reinstall,
    "regenerated_pycache": regenerated_pycache,
    "checked_hash": checked_hash_pyc,
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_change_stays_clean(name, test_env, tmp_path):
    assert test_env.audit(approve=True).exit_code == 0
    BENIGN[name](test_env, tmp_path)
    report = test_env.audit(full_pass=True)
    assert report.findings == [] and report.exit_code == 0, report.findings
    assert report.stats["integrity"]["pyc_checked"] > 0
    assert (
        report.stats["wheels"]["dists"] == 4 and report.stats["wheels"]["missing"] == 0
    )  # compared with the locked wheels


def test_unnormalised_lock_names_stay_clean(test_env, tmp_path):
    text = test_env.lock.read_text().replace("six==", "Six==").replace("idna==", "IDNA==")
    lock = tmp_path / "requirements.txt"
    lock.write_text(text)
    report = test_env.audit(lock_path=str(lock), approve=True)
    assert report.findings == [] and report.exit_code == 0, report.findings


# ---- installed vs locked, lock index options ---------------------------------------------------


def test_rebuilt_wheel_of_the_locked_version_is_not_the_locked_artifact(test_env, tmp_path):
    wheel = rebuilt_six(test_env, tmp_path)
    pip_install(test_env.venv, test_env.wheel_dir, "--force-reinstall", "--no-deps", wheel)
    report = test_env.audit(checks=frozenset({"lock", "drift"}))
    assert kinds(report) == {("not_locked_artifact", "six")}
    finding = next(f for f in report.findings if f.kind == "not_locked_artifact")
    assert finding.details["installed"] == ["sha256:" + sha256_file(wheel)]


def test_reinstalling_the_locked_wheel_by_path_matches_the_lock(test_env):
    wheel = next(test_env.wheel_dir.glob("six-1.16.0-*.whl"))
    pip_install(test_env.venv, test_env.wheel_dir, "--force-reinstall", "--no-deps", str(wheel))
    report = test_env.audit(checks=frozenset({"lock", "drift"}))
    assert report.findings == [] and report.exit_code == 0, report.findings


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("--extra-index-url http://evil.invalid/simple", {"index_option", "insecure_url"}),
        ("--index-url https://mirror.invalid/simple", {"index_option"}),
        ("--trusted-host evil.invalid", {"index_option"}),
        ("-f https://evil.invalid/wheels/", {"index_option"}),
        ("--index-url https://pypi.org/simple/", set()),
    ],
)
def test_lock_index_options_are_findings_unless_allowed(test_env, tmp_path, line, expected):
    lock = tmp_path / "requirements.txt"
    lock.write_text(line + "\n" + test_env.lock.read_text())
    report = test_env.audit(lock_path=str(lock), checks=frozenset({"lock"}))
    assert kinds(report, "lock") == {(kind, f"{lock}:1") for kind in expected}
    allowed = replace(
        test_env.policy(), lock=LockRules(path=str(lock), allowed_indexes=(line.split()[1],), allow_http=True)
    )
    assert kinds(test_env.audit(allowed, lock_path=str(lock), checks=frozenset({"lock"}))) == set()


def test_plain_http_artifact_url_in_pylock(test_env, tmp_path):
    lock = tmp_path / "pylock.toml"
    wheel = next(test_env.wheel_dir.glob("six-1.16.0-*.whl"))
    url = f"http://files.invalid/{wheel.name}"
    lock.write_text(
        'lock-version = "1.0"\ncreated-by = "test"\n\n[[packages]]\nname = "six"\nversion = "1.16.0"\n'
        f'wheels = [{{ url = "{url}", hashes = {{ sha256 = "{sha256_file(wheel)}" }} }}]\n'
    )
    report = test_env.audit(lock_path=str(lock), checks=frozenset({"lock"}))
    assert kinds(report, "lock") == {("insecure_url", "six")}


# ---- OSV data that looks fresh but is not -----------------------------------------------------

CLOCK = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
V4_CRITICAL = "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N"


def _osv(tmp_path, records, modified="2026-11-30T00:00:00Z"):
    path = tmp_path / "all.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for rec in records:
            zf.writestr(f"{rec['id']}.json", json.dumps({"modified": modified, **rec}))
    return str(path)


def _six(ident, **extra):
    affected = {"package": {"ecosystem": "PyPI", "name": "six"}, "versions": ["1.16.0"]}
    return {"id": ident, "summary": ident, "affected": [{**affected, **extra.pop("affected", {})}], **extra}


def _vuln_audit(env, db, policy=None):
    settings = env.settings(policy, osv_db=db, checks=frozenset({"vulns"}))
    return run_audit(settings, discover_python(env.python), clock=lambda: CLOCK)


def test_old_export_with_one_future_record_is_not_fresh(test_env, tmp_path):
    db = _osv(tmp_path, [_six("OSV-OLD-1"), _six("OSV-OLD-2")], modified="2020-01-01T00:00:00Z")
    with zipfile.ZipFile(db, "a") as zf:  # one record dated 2099; the zip members are new files
        zf.writestr("OSV-FUTURE.json", json.dumps({**_six("OSV-FUTURE"), "modified": "2099-01-01T00:00:00Z"}))
    report = _vuln_audit(test_env, db)
    assert report.osv_age_seconds == CLOCK - dt.datetime(2020, 1, 1, tzinfo=dt.UTC).timestamp()
    assert report.stats["osv"]["future_records"] == 1
    assert any("older than vulnerabilities.max_db_age_seconds" in d for d in report.degraded)
    assert report.exit_code == 3


def test_export_without_pypi_records_is_incomplete(test_env, tmp_path):
    npm = {"id": "NPM-1", "affected": [{"package": {"ecosystem": "npm", "name": "six"}, "versions": ["1.16.0"]}]}
    report = _vuln_audit(test_env, _osv(tmp_path, [npm]))
    assert any("holds no PyPI record" in i for i in report.incomplete)
    assert report.exit_code == 3


def test_unevaluable_range_fails_closed_unless_ignored(test_env, tmp_path):
    bad = _six(
        "OSV-BADRANGE",
        affected={"versions": [], "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "not a version"}]}]},
    )
    db = _osv(tmp_path, [bad])
    report = _vuln_audit(test_env, db)
    assert [i for i in report.incomplete if "OSV-BADRANGE" in i] and report.exit_code == 3
    ignore = (IgnoreRule("OSV-BADRANGE", "range checked by hand (SEC-1)", "2099-01-01"),)
    report = _vuln_audit(test_env, db, replace(test_env.policy(), ignore=ignore))
    assert report.incomplete == [] and report.exit_code == 0
    assert [f.details["ignored_by"] for f in report.ignored] == ["OSV-BADRANGE"]


def test_cvss_v4_only_advisory_is_scored_and_fails_a_critical_high_policy(test_env, tmp_path):
    rec = _six("GHSA-v4v4-v4v4-v4v4", severity=[{"type": "CVSS_V4", "score": V4_CRITICAL}])
    policy = test_env.policy(fail_on=("critical", "high"))
    report = _vuln_audit(test_env, _osv(tmp_path, [rec]), policy)
    (finding,) = [f for f in report.findings if f.kind == "vulnerable"]
    assert (finding.details["severity"], finding.details["score"], finding.blocking) == ("critical", 9.3, True)
    assert report.exit_code == 1


# ---- OSV freshness from the download's own time (osv-import metadata) --------------------------

OLD_DOWNLOAD = dt.datetime(2020, 1, 1, tzinfo=dt.UTC).timestamp()


def _imported(tmp_path, modified: str, downloaded: float, extra=()):
    """An export imported with osv-import (a local file and the download's Date), as the audit reads it."""
    src = _osv(tmp_path, [_six("OSV-1"), _six("OSV-2"), *extra], modified=modified)
    dest = tmp_path / "volume" / "all.zip"
    import_export(src, str(dest), downloaded)
    return str(dest)


def test_fresh_record_dates_in_an_old_download_are_not_fresh(test_env, tmp_path):
    """Records re-dated yesterday, downloaded in 2020, then copied (new mtimes): the download's time wins."""
    db = _imported(tmp_path, "2026-11-30T00:00:00Z", OLD_DOWNLOAD)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(db, copy / "all.zip")
    shutil.copy(db + ".meta.json", copy / "all.zip.meta.json")
    report = _vuln_audit(test_env, str(copy / "all.zip"))
    assert report.osv_age_seconds == CLOCK - OLD_DOWNLOAD
    assert report.stats["osv"]["downloaded_at"] == OLD_DOWNLOAD
    assert [d for d in report.degraded if "older than vulnerabilities.max_db_age_seconds" in d] != []
    assert report.exit_code == 3


def test_future_dated_download_and_record_do_not_make_an_old_export_fresh(test_env, tmp_path):
    future = {**_six("OSV-FUTURE"), "modified": "2099-01-01T00:00:00Z"}
    db = _imported(tmp_path, "2020-01-01T00:00:00Z", dt.datetime(2099, 1, 1, tzinfo=dt.UTC).timestamp(), [future])
    report = _vuln_audit(test_env, db)
    assert report.osv_age_seconds == CLOCK - OLD_DOWNLOAD
    assert report.stats["osv"]["future_records"] == 1
    assert f"OSV download metadata of {db} is dated in the future: not used for its age" in report.degraded
    assert report.exit_code == 3


def test_metadata_of_another_export_is_not_used(test_env, tmp_path):
    db = _imported(tmp_path, "2026-11-30T00:00:00Z", CLOCK - 3600)
    with zipfile.ZipFile(db, "a") as zf:  # the export replaced after the import
        zf.writestr("OSV-3.json", json.dumps({**_six("OSV-3"), "modified": "2026-11-30T00:00:00Z"}))
    report = _vuln_audit(test_env, db)
    assert [d for d in report.degraded if d.startswith("OSV download metadata not used: ") and "another export" in d]
    assert report.exit_code == 3


def test_recent_download_of_recent_records_is_fresh(test_env, tmp_path):
    db = _imported(tmp_path, "2026-11-29T00:00:00Z", CLOCK - 3600)
    report = _vuln_audit(test_env, db)
    assert report.osv_age_seconds == CLOCK - dt.datetime(2026, 11, 29, tzinfo=dt.UTC).timestamp()
    assert report.degraded == [] and report.incomplete == []
    assert {f.details["id"] for f in report.findings} == {"OSV-1", "OSV-2"}


def test_a_download_records_the_server_date():
    date = "Tue, 01 Dec 2026 00:00:00 GMT"
    assert server_date({"date": date}) == CLOCK
    assert server_date({"Date": "yesterday"}) is None


def test_osv_import_of_a_url_keeps_the_server_date(tmp_path):
    data = pathlib.Path(_osv(tmp_path, [_six("OSV-1")])).read_bytes()

    def fetch(url, timeout):
        return data, {"Content-Type": "application/zip", "Date": "Tue, 01 Dec 2026 00:00:00 GMT"}

    dest = tmp_path / "v" / "all.zip"
    meta = json.loads(import_export("https://osv.invalid/PyPI/all.zip", str(dest), None, lambda: 0.0, fetch))
    assert (meta["downloaded_at"], meta["date_source"]) == ("2026-12-01T00:00:00Z", "server-date")
    assert meta["export_sha256"] == hashlib.sha256(data).hexdigest() == sha256_file(dest)
    assert load_database(str(dest)).meta.downloaded_at == CLOCK
