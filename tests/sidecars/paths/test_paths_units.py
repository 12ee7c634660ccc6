"""Pure parts of the path watcher: errno classification, evaluation, mountinfo, policy."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest
from support import ROOT

from warden.paths import probe
from warden.paths.mountinfo import find_mount, lexical_abspath, parse_mountinfo, unescape
from warden.paths.policy import PathSpec, PathsPolicy, Threshold, parse_threshold
from warden.policy import PolicyError, load_policy


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (errno.ENOENT, "missing"),
        (errno.ENOTDIR, "missing"),
        (errno.EACCES, "permission"),
        (errno.EPERM, "permission"),
        (errno.EROFS, "read_only"),
        (errno.ENOSPC, "full"),
        (errno.EDQUOT, "full"),
        (errno.ESTALE, "stale_handle"),
        (errno.EIO, "io_error"),
        (errno.ENOTCONN, "disconnected"),
        (errno.ETIMEDOUT, "disconnected"),
        (errno.ELOOP, "other"),
        (None, "other"),
    ],
)
def test_classify_errno(err, reason):
    assert probe.classify_errno(err) == reason
    assert reason in probe.REASONS


def _obs(**kw):
    base = {
        "path": "/x",
        "free_bytes": 10_000,
        "total_bytes": 100_000,
        "free_inodes": 50,
        "total_inodes": 1000,
        "read_only": False,
        "duration_seconds": 0.01,
        "error": None,
    }
    return {**base, **kw}


def test_evaluate_precedence_and_thresholds():
    ok = probe.evaluate({"writable": True}, _obs())
    assert ok["reason"] is None and ok["detail"] == "ok"
    err = probe.evaluate({}, _obs(error=("write", errno.EROFS, "Read-only file system"), read_only=True))
    assert (err["reason"], err["errno_name"], err["step"]) == ("read_only", "EROFS", "write")
    assert err["detail"].startswith("read-only file system (EROFS) while creating")
    # read-only flag only matters when the path must not be read-only (default: writable)
    assert probe.evaluate({}, _obs(read_only=True))["reason"] is None
    assert probe.evaluate({"writable": True}, _obs(read_only=True))["reason"] == "read_only"
    assert probe.evaluate({"not_read_only": True}, _obs(read_only=True))["reason"] == "read_only"
    full = probe.evaluate({"min_free_bytes": 20_000}, _obs())
    assert full["reason"] == "full" and "10000 bytes free, below min_free_bytes 20000" in full["detail"]
    assert probe.evaluate({"min_free_bytes_percent": 11}, _obs())["reason"] == "full"
    assert probe.evaluate({"min_free_bytes_percent": 9}, _obs())["reason"] is None
    assert probe.evaluate({"min_free_inodes": 51}, _obs())["reason"] == "full"
    assert "inodes" in probe.evaluate({"min_free_inodes_percent": 6}, _obs())["detail"]
    # no inode numbers (some filesystems report f_files = 0): inode thresholds are skipped
    assert probe.evaluate({"min_free_inodes": 5}, _obs(free_inodes=None, total_inodes=None))["reason"] is None
    slow = probe.evaluate({"max_latency_seconds": 0.005}, _obs())
    assert slow["reason"] == "slow" and "over max_latency_seconds" in slow["detail"]
    # exists: false lets a missing path pass
    gone = _obs(error=("stat", errno.ENOENT, "No such file or directory"))
    assert probe.evaluate({"exists": False}, gone)["reason"] is None
    assert probe.evaluate({}, gone)["reason"] == "missing"


def test_probe_child_script_runs_isolated(tmp_path):
    """The child runs as `python -I -S probe.py SPEC` (no site, no package imports)."""
    (tmp_path / "f.txt").write_text("x")
    done = subprocess.run(
        [sys.executable, "-I", "-S", os.path.join(ROOT, "warden/paths/probe.py"), f"path={tmp_path}", "writable=1"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:5] == ["@stat", "@statvfs", "@list", "@read", "@write"]
    result = json.loads(lines[-1])
    assert result["reason"] is None and result["read_target"] == str(tmp_path / "f.txt")
    assert sorted(os.listdir(tmp_path)) == ["f.txt"], "the probe file is removed"
    bad = subprocess.run(
        [sys.executable, "-I", "-S", os.path.join(ROOT, "warden/paths/probe.py"), "bogus=1"], capture_output=True
    )
    assert bad.returncode == 2


def test_child_protocol_round_trips():
    spec = PathSpec(name="d", path="/a b=c", writable=True, min_free_bytes="5%", max_latency_seconds=0.5).probe_spec()
    back = probe.args_to_spec(probe.spec_to_args(spec))
    assert back == {k: v for k, v in spec.items() if v is not None}
    for bad in (["path"], ["writable=2", "path=/"], ["min_free_bytes=x", "path=/"], ["readable=1"]):
        with pytest.raises(ValueError):
            probe.args_to_spec(bad)
    weird = {"s": 'q"b\\n\n\t\x01é\udcff', "n": None, "t": True, "f": 1.5, "i": -3, "l": [1, "x"], "inf": float("inf")}
    assert json.loads(probe.to_json(weird)) == {**weird, "inf": None}


MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
25 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw
40 22 0:39 / /mnt/with\040space rw,nosuid master:7 - fuse.faultfs faultfs rw,user_id=0
41 22 0:40 / /data ro,relatime - nfs4 srv:/export rw,vers=4.2,hard
42 22 0:41 / /data rw,relatime - tmpfs tmpfs rw,size=64k
43 22 8:1 /srv/ckpt /ckpt rw - ext4 /dev/sda1 rw
garbage line
"""


def test_mountinfo_parse_and_lookup():
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 6
    assert unescape(r"a\040b\134c") == "a b\\c"
    spaced = find_mount(mounts, "/mnt/with space/x/y")
    assert spaced is not None and spaced.fstype == "fuse.faultfs" and spaced.mount_point == "/mnt/with space"
    # stacked on /data: the last (top) one wins
    top = find_mount(mounts, "/data/sub")
    assert top is not None and top.fstype == "tmpfs" and not top.read_only
    assert find_mount(mounts, "/database") is not None and find_mount(mounts, "/database").mount_point == "/"
    nfs = mounts[3]
    assert nfs.read_only and "hard" in nfs.super_options and nfs.describe().startswith("nfs4 srv:/export on /data")
    # a device number from the probe picks the right one of matching mounts
    assert find_mount(mounts, "/data/x", dev="0:40").fstype == "nfs4"
    assert find_mount(mounts, "/ckpt/step-1", dev="8:1").mount_point == "/ckpt"
    assert find_mount([], "/x") is None
    assert lexical_abspath("a/../b", cwd="/w") == "/w/b"


def test_parse_threshold():
    assert parse_threshold(None, "k", True) == Threshold()
    assert parse_threshold(1024, "k", True) == Threshold(absolute=1024)
    assert parse_threshold("10GiB", "k", True) == Threshold(absolute=10 * 1024**3)
    assert parse_threshold("500MB", "k", True) == Threshold(absolute=500_000_000)
    assert parse_threshold("5%", "k", True) == Threshold(percent=5.0)
    assert parse_threshold("2.5 %", "k", False) == Threshold(percent=2.5)
    assert parse_threshold("1000", "k", False) == Threshold(absolute=1000)
    for bad, sizes in (("10GiB", False), ("lots", True), ("150%", True), (-1, True), (True, True)):
        with pytest.raises(ValueError, match="k:"):
            parse_threshold(bad, "k", sizes)


def test_policy_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "paths.yaml"
    cases = {
        "paths: []": "paths: list at least one path",
        "paths:\n  - {name: data, path: /tmp, min_free_bytes: lots}": "paths[0]: min_free_bytes: expected",
        "paths:\n  - {name: Data, path: /tmp}": "paths[0]: name: 'Data' must match",
        "paths:\n  - {name: d, path: /tmp, deadline_seconds: 0}": "paths[0]: deadline_seconds: must be > 0",
        "paths:\n  - {name: d, path: /tmp, wrtable: true}": "paths[0].wrtable: unknown key",
        "paths:\n  - {name: d, path: /a}\n  - {name: d, path: /b}": "paths[1].name: 'd' is used twice",
    }
    for body, expected in cases.items():
        bad.write_text("version: 1\n" + body + "\n")
        with pytest.raises(PolicyError) as info:
            load_policy(bad, PathsPolicy)
        assert str(info.value).startswith(f"{bad}: ") and expected in str(info.value), str(info.value)


def test_shipped_policy_loads_and_covers_the_named_paths():
    policy = load_policy(os.path.join(ROOT, "policies", "paths.yaml"), PathsPolicy)
    names = {spec.name for spec in policy.paths}
    assert {"data", "model", "tokenizer", "checkpoint_root", "event_journal"} <= names
    assert policy.check_interval_seconds <= 0.5
    ckpt = next(s for s in policy.paths if s.name == "checkpoint_root")
    assert ckpt.writable and ckpt.probe_spec()["not_read_only"] is True
    assert ckpt.display_name == "checkpoint root"


def test_probe_spec_expands_variables(monkeypatch):
    monkeypatch.setenv("WARDEN_TEST_DIR", "/srv/run")
    spec = PathSpec(name="ckpt", path="$WARDEN_TEST_DIR/ckpt", min_free_bytes="5%", min_free_inodes=10)
    got = spec.probe_spec()
    assert got["path"] == "/srv/run/ckpt" and got["min_free_bytes_percent"] == 5.0 and got["min_free_inodes"] == 10


def test_importing_sidecars_paths_does_not_import_torch():
    code = "import sys, sidecars.paths, sidecars.paths.sidecar, sidecars.paths.commands; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_probe_removes_stale_probe_files_of_this_host(tmp_path):
    stale = tmp_path / f".warden-probe-{socket.gethostname()}-999999"
    fresh = tmp_path / f".warden-probe-{socket.gethostname()}-999998"
    other = tmp_path / ".warden-probe-otherhost-1"
    for f in (stale, fresh, other):
        f.write_text("x")
    os.utime(stale, (1, 1))
    os.utime(other, (1, 1))
    assert probe.run_probe({"path": str(tmp_path), "writable": True})["reason"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, other.name])
