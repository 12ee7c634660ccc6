"""Kernel-made faults: read-only bind mounts and tiny tmpfs in a private mount namespace
(`unshare -m`), the immutable attribute (`chattr +i`), and permissions as an unprivileged user."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest
from support import ROOT, need_binary, warden_cmd

NAMESPACE_SCRIPT = """
set -e
B={base}
mkdir -p $B/ro $B/full $B/inodes $B/small $B/ok
echo model > $B/ro/weights.txt
mount --bind $B/ro $B/ro
mount -o remount,bind,ro $B/ro
mount -t tmpfs -o size=64k tmpfs $B/full
dd if=/dev/zero of=$B/full/fill bs=4k count=64 2>/dev/null || true
mount -t tmpfs -o size=1m,nr_inodes=4 tmpfs $B/inodes
for i in 1 2 3 4 5 6; do touch $B/inodes/f$i 2>/dev/null || true; done
mount -t tmpfs -o size=1m tmpfs $B/small
mount -t tmpfs -o size=64m tmpfs $B/ok
{command}
"""


def test_read_only_and_full_filesystems_in_a_mount_namespace(paths_kit, unshare, tmp_path, report_by_name):
    base = str(tmp_path / "ns")
    policy = paths_kit.policy(
        [
            {"name": "checkpoint_root", "path": f"{base}/ro", "writable": True},
            {"name": "model", "path": f"{base}/ro"},
            {"name": "journal_flag", "path": f"{base}/ro", "not_read_only": True},
            {"name": "full_bytes", "path": f"{base}/full", "writable": True},
            {"name": "full_inodes", "path": f"{base}/inodes", "writable": True},
            {"name": "inode_floor", "path": f"{base}/inodes", "min_free_inodes": 10},
            {"name": "byte_floor", "path": f"{base}/small", "min_free_bytes": "10MiB"},
            {"name": "share_floor", "path": f"{base}/full", "min_free_bytes": "50%"},
            {"name": "scratch", "path": f"{base}/ok", "writable": True, "min_free_bytes": "1MiB"},
        ]
    )
    check = " ".join(shlex.quote(a) for a in warden_cmd("paths", "check", "--policy", policy, "--format", "json"))
    script = NAMESPACE_SCRIPT.format(base=shlex.quote(base), command=f"exec {check}")
    code, report, _ = paths_kit.check_script([unshare, "-m", "sh", "-c", script])
    by = report_by_name(report)
    assert code == 1

    ro = by["checkpoint_root"]
    assert (ro["reason"], ro["errno"], ro["step"]) == ("read_only", "EROFS", "write"), ro
    assert ro["message"].startswith(f"checkpoint root {base}/ro: read-only file system (EROFS)")
    assert "remount it read-write" in ro["message"]
    assert ro["mount"]["mount_point"] == f"{base}/ro" and ro["mount"]["read_only"] and ro["read_only"]
    assert by["model"]["healthy"] and by["model"]["read_only"], "a read-only model mount is fine"
    flag = by["journal_flag"]
    assert flag["reason"] == "read_only" and flag["errno"] is None and "ST_RDONLY" in flag["detail"]

    full = by["full_bytes"]
    assert (full["reason"], full["errno"], full["step"]) == ("full", "ENOSPC", "write"), full
    assert full["mount"]["fstype"] == "tmpfs"
    inodes = by["full_inodes"]
    assert (inodes["reason"], inodes["errno"]) == ("full", "ENOSPC") and inodes["free_inodes"] == 0
    floor = by["inode_floor"]
    assert floor["reason"] == "full" and "inodes free, below min_free_inodes 10" in floor["detail"]
    assert by["byte_floor"]["reason"] == "full" and "below min_free_bytes 10485760" in by["byte_floor"]["detail"]
    share = by["share_floor"]
    assert share["reason"] == "full" and "% of bytes free, below min_free_bytes_percent 50%" in share["detail"]
    assert by["scratch"]["healthy"]


def test_preflight_message_for_a_read_only_checkpoint_root(unshare, tmp_path):
    base = str(tmp_path / "ns")
    code = (
        "from warden.paths import preflight\n"
        f"for p in preflight({{'checkpoint root': ({base + '/ro'!r}, True), 'model': ({base + '/ro'!r}, False)}}, 5):\n"
        "    print(p.reason, p.errno, p.message)\n"
    )
    command = f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    script = NAMESPACE_SCRIPT.format(base=shlex.quote(base), command=command)
    done = subprocess.run([unshare, "-m", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"read_only EROFS checkpoint root {base}/ro: read-only file system (EROFS)")


IMMUTABLE_LOOP_SCRIPT = """
set -e
D={base}
mkdir -p $D/mnt
truncate -s 8M $D/ext4.img
mkfs.ext4 -q -F $D/ext4.img
mount -o loop $D/ext4.img $D/mnt || exit 77
mkdir $D/mnt/ckpt
echo x > $D/mnt/ckpt/f
chattr +i $D/mnt/ckpt || exit 77
{check}; code=$?
chattr -i $D/mnt/ckpt
exit $code
"""


def test_immutable_directory_is_a_permission_failure(paths_kit, tmp_path, report_by_name):
    chattr = need_binary("chattr")
    target = tmp_path / "imm"
    target.mkdir()
    (target / "f").write_text("x")
    policy = paths_kit.policy([{"name": "checkpoint_root", "path": str(target), "writable": True}])
    attr = subprocess.run([chattr, "+i", str(target)], capture_output=True, text=True)
    try:
        if attr.returncode == 0:
            code, report, _ = paths_kit.check(policy)
        else:  # tmpfs/overlay: no chattr there; try an ext4 image on a loop device
            unshare = shutil.which("unshare")
            if unshare is None or shutil.which("mkfs.ext4") is None:
                pytest.skip(
                    f"chattr +i unsupported here ({attr.stderr.strip()}) and no unshare/mkfs.ext4 for a loop fs"
                )
            base = str(tmp_path / "loop")
            policy = paths_kit.policy(
                [{"name": "checkpoint_root", "path": f"{base}/mnt/ckpt", "writable": True}], name="loop.yaml"
            )
            check = " ".join(
                shlex.quote(a) for a in warden_cmd("paths", "check", "--policy", policy, "--format", "json")
            )
            script = IMMUTABLE_LOOP_SCRIPT.format(base=shlex.quote(base), check=f"set +e; {check}")
            probe = subprocess.run([unshare, "-m", "sh", "-c", script.replace(check, "true")], capture_output=True)
            if probe.returncode == 77:
                pytest.skip(f"chattr +i unsupported on {tmp_path} and no loop-mounted ext4 here")
            code, report, _ = paths_kit.check_script([unshare, "-m", "sh", "-c", script])
    finally:
        subprocess.run([chattr, "-i", str(target)], capture_output=True)
    ckpt = report_by_name(report)["checkpoint_root"]
    assert code == 1
    assert (ckpt["reason"], ckpt["errno"], ckpt["step"]) == ("permission", "EPERM", "write"), ckpt
    assert "lsattr" in ckpt["message"]


NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


def _nobody_python(setpriv: str) -> str | None:
    """An interpreter uid 65534 can start probe children with (this one may sit under a 0700 /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        spawn = f"import subprocess; subprocess.run([{candidate!r}, '-I', '-S', '-c', 'pass'], check=True)"
        done = subprocess.run([setpriv, *NOBODY, sys.executable, "-c", spawn], capture_output=True, cwd=ROOT)
        if done.returncode == 0:
            return candidate
    return None


def test_permissions_as_an_unprivileged_user(paths_kit, report_by_name):
    setpriv = need_binary("setpriv")
    can_run = subprocess.run(
        [setpriv, *NOBODY, sys.executable, "-c", "import sidecars.paths.commands"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if can_run.returncode != 0:
        pytest.skip(f"uid 65534 cannot run this checkout's Python: {can_run.stderr.strip()[-300:]}")
    python = _nobody_python(setpriv)
    if python is None:
        pytest.skip("uid 65534 can execute no Python interpreter to run probe children with")
    base = tempfile.mkdtemp(prefix="warden-perm-", dir="/tmp")  # pytest's tmp dirs are 0700
    try:
        os.chmod(base, 0o755)
        for name, mode in (("locked", 0o000), ("readonly", 0o555), ("ok", 0o777), ("private", 0o700)):
            os.mkdir(os.path.join(base, name))
            with open(os.path.join(base, name, "f"), "w") as fh:
                fh.write("x")
            os.chmod(os.path.join(base, name), mode)
        os.mkdir(os.path.join(base, "private", "inner"))
        kit_policy = paths_kit.policy(
            [
                {"name": "data", "path": f"{base}/locked"},
                {"name": "checkpoint_root", "path": f"{base}/readonly", "writable": True},
                {"name": "tokenizer", "path": f"{base}/private/inner"},
                {"name": "scratch", "path": f"{base}/ok", "writable": True},
            ]
        )
        policy = os.path.join(base, "paths.yaml")
        shutil.copy(kit_policy, policy)
        os.chmod(policy, 0o644)
        code, report, _ = paths_kit.check(policy, "env", f"WARDEN_PROBE_PYTHON={python}", setpriv, *NOBODY)
    finally:
        subprocess.run(["rm", "-rf", base], check=False)
    by = report_by_name(report)
    assert code == 1
    assert (by["data"]["reason"], by["data"]["errno"], by["data"]["step"]) == ("permission", "EACCES", "list")
    ckpt = by["checkpoint_root"]
    assert (ckpt["reason"], ckpt["errno"], ckpt["step"]) == ("permission", "EACCES", "write")
    assert "uid 65534" in ckpt["message"]
    assert (by["tokenizer"]["reason"], by["tokenizer"]["step"]) == ("permission", "stat")
    assert by["scratch"]["healthy"]
