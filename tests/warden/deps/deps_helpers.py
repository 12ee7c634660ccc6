"""Shared helpers of the deps tests: the test venv, its lock, the OSV fixture records.

Imported as ``tests.warden.deps.deps_helpers`` (the tests tree has no __init__ files).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest
from support import IN_CI

from warden.deps.audit import AuditSettings, run_audit
from warden.deps.environment import discover_python
from warden.deps.installed import InstalledDist
from warden.deps.policy import DepsPolicy, DriftRules, IntegrityRules, LockRules, VulnRules

WHEELS = (("six==1.16.0", "idna==3.7", "iniconfig==2.0.0"), ("six==1.17.0",))
BASE = ("six==1.16.0", "idna==3.7")
SITE = os.path.join("lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")
NOW = "2026-11-30T00:00:00Z"


def _fail_or_skip(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory):
    """Small wheels from PyPI (pip's cache makes later sessions fast)."""
    dest = tmp_path_factory.mktemp("wheels")
    for group in WHEELS:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
        proc = subprocess.run([*cmd, *group], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            _fail_or_skip(f"cannot download test wheels from PyPI: {proc.stderr.strip()[-300:]}")
    return dest


def sha256_file(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _bundled_wheels() -> list[str]:
    import ensurepip

    bundled = os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")
    return [os.path.join(bundled, f) for f in sorted(os.listdir(bundled)) if f.endswith(".whl")]


@pytest.fixture(scope="session")
def venv_template(tmp_path_factory, wheel_dir):
    """A venv with pip and setuptools (the wheels ensurepip bundles; not byte-compiled, to keep
    audits fast) and six 1.16.0 and idna 3.7 (byte-compiled), plus its hashed lock."""
    root = tmp_path_factory.mktemp("venv-template")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    bundled = _bundled_wheels()
    base = [os.path.basename(w).split("-")[0] + "==" + os.path.basename(w).split("-")[1] for w in bundled]
    pip_install(venv, wheel_dir, *base, extra=["--no-compile", "--find-links", os.path.dirname(bundled[0])])
    pip_install(venv, wheel_dir, *BASE)
    lines = []
    for whl in [*bundled, *(str(p) for p in sorted(wheel_dir.iterdir()))]:
        name, version = os.path.basename(whl).split("-")[:2]
        if f"{name}=={version}" in (*BASE, *base):
            lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256_file(whl)}\n    # via test\n")
    lock = root / "requirements.lock.txt"
    lock.write_text("# hashed lock of the test venv\n" + "".join(sorted(lines)))
    return venv, lock


def pip_install(venv, wheel_dir, *reqs: str, extra: list[str] | None = None) -> None:
    """Installs into ``venv`` with the test runner's pip (``--python``): the venv needs no pip of its own."""
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-index"]
    cmd += ["--find-links", str(wheel_dir), *(extra or [])]
    proc = subprocess.run([*cmd, *reqs], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


class TestEnv:
    """A copy of the template venv, with helpers to audit it."""

    def __init__(self, venv, lock, state_dir, wheel_dir) -> None:
        self.venv, self.lock, self.state_dir, self.wheel_dir = venv, lock, state_dir, wheel_dir
        self.site = venv / SITE
        self.python = str(venv / "bin" / "python")

    def policy(self, check_pyc: bool = True, **vuln) -> DepsPolicy:
        return DepsPolicy(
            lock=LockRules(path=str(self.lock)),
            drift=DriftRules(),
            integrity=IntegrityRules(workers=2, check_pyc=check_pyc),
            vulnerabilities=VulnRules(**vuln),
        )

    def settings(self, policy: DepsPolicy | None = None, **kw) -> AuditSettings:
        policy = policy or self.policy()
        base = AuditSettings(
            policy=policy,
            lock_path=str(self.lock),
            osv_db=None,
            state_dir=str(self.state_dir),
            baseline_path=str(self.state_dir / "baseline.json"),
            pip_audit=False,
            wheel_dirs=self.wheel_dirs,
        )
        return replace(base, **kw)

    @property
    def wheel_dirs(self) -> tuple[str, ...]:
        """Where every locked wheel of the template lies (lock.wheel_dirs): PyPI's and ensurepip's."""
        return (str(self.wheel_dir), os.path.dirname(_bundled_wheels()[0]))

    def audit(self, policy: DepsPolicy | None = None, **kw):
        return run_audit(self.settings(policy, **kw), discover_python(self.python))

    def install(self, *reqs: str) -> None:
        pip_install(self.venv, self.wheel_dir, *reqs)


@pytest.fixture(autouse=True)
def digests_settled(monkeypatch):
    """The tests' files are seconds old: without this, no digest of them would be cached (walk.settled,
    DIGEST_RACY_NS); tests of that rule set it back."""
    monkeypatch.setattr("warden.deps.walk.DIGEST_RACY_NS", -(10**12), raising=False)


@pytest.fixture
def test_env(tmp_path, venv_template, wheel_dir):
    venv, lock = venv_template
    copy = tmp_path / "venv"
    shutil.copytree(venv, copy, symlinks=True)
    state = tmp_path / "state"
    state.mkdir()
    return TestEnv(copy, lock, state, wheel_dir)


def kinds(report, check: str | None = None, blocking_only: bool = True) -> set[tuple[str, str]]:
    """(kind, subject) of the report's findings."""
    return {
        (f.kind, f.subject)
        for f in report.findings
        if (check is None or f.check == check) and (f.blocking or not blocking_only)
    }


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rebuilt_six(env, tmp_path) -> str:
    """six 1.16.0 rebuilt with one changed line (its RECORD consistent), under the original's file name."""
    original = next(env.wheel_dir.glob("six-1.16.0-*.whl"))
    out = tmp_path / "rebuilt" / original.name
    out.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(out, "w") as dst:
        members = {n: src.read(n) for n in src.namelist()}
        members["six.py"] += b"\nimport os  # rebuilt\n"
        record = next(n for n in members if n.endswith(".dist-info/RECORD"))
        rows = [f"{n},{record_hash(d)},{len(d)}" if not n.endswith("RECORD") else f"{n},," for n, d in members.items()]
        members[record] = ("\n".join(rows) + "\n").encode()
        for name, data in members.items():
            dst.writestr(name, data)
    return str(out)


def install_rebuilt_six_from_an_index(env, tmp_path) -> None:
    """pip resolves ``six==1.16.0`` from a find-links index holding only the rebuilt wheel: no direct_url.json."""
    wheel = rebuilt_six(env, tmp_path)
    cmd = ["--force-reinstall", "--no-deps", "six==1.16.0"]
    pip_install(env.venv, os.path.dirname(wheel), *cmd)
    assert not list(env.site.glob("six-1.16.0.dist-info/direct_url.json"))


def _affected(name: str, events=None, versions=None) -> dict:
    entry: dict = {"package": {"ecosystem": "PyPI", "name": name}}
    if events is not None:
        entry["ranges"] = [{"type": "ECOSYSTEM", "events": events}]
    if versions is not None:
        entry["versions"] = versions
    return entry


REQUESTS_RANGE = [{"introduced": "0"}, {"fixed": "2.20.0"}]
OSV_RECORDS = [
    {
        "id": "PYSEC-2018-28",
        "aliases": ["CVE-2018-18074", "GHSA-x84v-xcm2-53pg"],
        "summary": "requests sends the Authorization header after an https to http redirect",
        "affected": [_affected("requests", REQUESTS_RANGE)],
    },
    {
        "id": "GHSA-x84v-xcm2-53pg",
        "aliases": ["CVE-2018-18074"],
        "summary": "Insufficiently Protected Credentials in Requests",
        "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:N/A:N"}],
        "affected": [_affected("requests", REQUESTS_RANGE)],
    },
    {
        "id": "PYSEC-2019-133",
        "aliases": ["CVE-2019-11324"],
        "summary": "urllib3 mishandles certain CA certificates",
        "affected": [_affected("urllib3", [{"introduced": "0"}, {"fixed": "1.24.2"}])],
        "database_specific": {"severity": "HIGH"},
    },
    {
        "id": "GHSA-462w-v97r-4m45",
        "aliases": ["CVE-2019-10906"],
        "summary": "Jinja2 sandbox escape via string formatting",
        "severity": [{"type": "CVSS_V3", "score": "CVSS:3.0/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:N/A:N"}],
        "affected": [_affected("Jinja2", [{"introduced": "0"}, {"fixed": "2.10.1"}])],
    },
    {
        "id": "PYSEC-2099-1",
        "withdrawn": "2020-01-01T00:00:00Z",
        "summary": "withdrawn: every requests release",
        "affected": [_affected("requests", [{"introduced": "0"}])],
    },
    {"id": "OSV-TEST-VERSIONS", "summary": "listed versions only", "affected": [_affected("six", versions=["1.16.0"])]},
    {
        "id": "OSV-TEST-LAST-AFFECTED",
        "summary": "up to and including idna 3.6",
        "affected": [_affected("idna", [{"introduced": "0"}, {"last_affected": "3.6"}])],
    },
    {
        "id": "OSV-TEST-LIMIT",
        "summary": "jinja2 3.0 line only",
        "affected": [_affected("jinja2", [{"introduced": "3.0.0"}, {"limit": "3.1.0"}])],
    },
]
# package, version -> ids (each set: one de-duplicated finding's ids)
EXPECTED_MATCHES = {
    ("requests", "2.19.1"): [{"PYSEC-2018-28", "GHSA-x84v-xcm2-53pg", "CVE-2018-18074"}],
    ("requests", "2.20.0rc1"): [{"PYSEC-2018-28", "GHSA-x84v-xcm2-53pg", "CVE-2018-18074"}],
    ("requests", "2.20.0"): [],
    ("urllib3", "1.24.1+local"): [{"PYSEC-2019-133", "CVE-2019-11324"}],
    ("urllib3", "1.24.2"): [],
    ("jinja2", "2.10"): [{"GHSA-462w-v97r-4m45", "CVE-2019-10906"}],
    ("jinja2", "2.10.1"): [],
    ("jinja2", "3.0.3"): [{"OSV-TEST-LIMIT"}],
    ("jinja2", "3.1.0"): [],
    ("six", "1.16.0"): [{"OSV-TEST-VERSIONS"}],
    ("six", "1.16.0+cu124"): [{"OSV-TEST-VERSIONS"}],
    ("six", "1.17.0"): [],
    ("idna", "3.6"): [{"OSV-TEST-LAST-AFFECTED"}],
    ("idna", "3.6+local"): [{"OSV-TEST-LAST-AFFECTED"}],
    ("idna", "3.6+cu124.1"): [{"OSV-TEST-LAST-AFFECTED"}],
    ("idna", "3.6.post1"): [],
    ("idna", "3.7"): [],
}


def write_osv_zip(path, records=OSV_RECORDS, corrupt: bool = True, modified: str = NOW):
    with zipfile.ZipFile(path, "w") as zf:
        for rec in records:
            zf.writestr(f"{rec['id']}.json", json.dumps({"schema_version": "1.6.0", "modified": modified, **rec}))
        if corrupt:
            zf.writestr("CORRUPT-1.json", b'{"id": "CORRUPT-1", "affected": [')
    return path


def fake_dist(name: str, version: str) -> InstalledDist:
    return InstalledDist(name, name, version, f"/x/{name}-{version}.dist-info", "/x", (), None)


@pytest.fixture
def osv_zip(tmp_path):
    return write_osv_zip(tmp_path / "all.zip")


# ---- a base interpreter the tests own ------------------------------------------------------------

PY_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
PY_ZIP = f"python{sys.version_info.major}{sys.version_info.minor}.zip"
OWN_STDLIB = ("json", "site-packages")  # real copies (the rest: links to the real stdlib, never written)


@pytest.fixture(scope="session")
def fake_base_template(tmp_path_factory):
    """A base interpreter whose stdlib directory the tests may write: the running interpreter's
    binary copied to ``base/bin``, ``base/lib/pythonX.Y`` holding a link to each entry of the real
    stdlib but ``json`` (copied, with its __pycache__) and an empty ``site-packages``. Python finds
    its prefix from the binary's location, so this base reports ``base/lib/pythonX.Y`` as stdlib."""
    import sysconfig

    real_stdlib = sysconfig.get_paths()["stdlib"]
    real_bin = os.path.realpath(os.path.join(sys.base_prefix, "bin", PY_DIR))
    if not os.path.isfile(real_bin):
        _fail_or_skip(f"no base interpreter binary at {real_bin}")
    base = tmp_path_factory.mktemp("fake-base") / "base"
    stdlib = base / "lib" / PY_DIR
    stdlib.mkdir(parents=True)
    (base / "bin").mkdir()
    shutil.copy2(real_bin, base / "bin" / PY_DIR)
    for lib in os.listdir(os.path.join(sys.base_prefix, "lib")):
        if lib.startswith("libpython"):  # for an $ORIGIN-relative runpath
            os.symlink(os.path.join(sys.base_prefix, "lib", lib), base / "lib" / lib)
    for name in sorted(os.listdir(real_stdlib)):
        if name not in OWN_STDLIB:
            os.symlink(os.path.join(real_stdlib, name), stdlib / name)
    shutil.copytree(os.path.join(real_stdlib, "json"), stdlib / "json", symlinks=True)
    (stdlib / "site-packages").mkdir()
    return base


class BaseEnv:
    """A venv (no pip, empty site-packages) of a copy of the fake base, audited for integrity only."""

    def __init__(self, base, venv, state_dir) -> None:
        self.base, self.venv, self.state_dir = base, venv, state_dir
        self.stdlib = base / "lib" / PY_DIR
        self.python = str(venv / "bin" / "python")

    def settings(self, **kw) -> AuditSettings:
        policy = DepsPolicy(integrity=IntegrityRules(workers=2, check_pyc=False), vulnerabilities=VulnRules())
        base = AuditSettings(
            policy=policy,
            lock_path=None,
            osv_db=None,
            state_dir=str(self.state_dir),
            baseline_path=str(self.state_dir / "baseline.json"),
            checks=frozenset({"integrity"}),
            pip_audit=False,
        )
        return replace(base, **kw)

    def audit(self, **kw):
        return run_audit(self.settings(**kw), discover_python(self.python))

    def run_python(self, code: str = "") -> str:
        """What the venv's Python prints running ``code`` (planted code shows here)."""
        proc = subprocess.run([self.python, "-c", code], capture_output=True, text=True, timeout=60, env={})
        return proc.stdout + proc.stderr


@pytest.fixture
def base_env(tmp_path, fake_base_template):
    base = tmp_path / "base"
    shutil.copytree(fake_base_template, base, symlinks=True)
    venv = tmp_path / "venv"
    subprocess.run([str(base / "bin" / PY_DIR), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    state = tmp_path / "state"
    state.mkdir()
    return BaseEnv(base, venv, state)
