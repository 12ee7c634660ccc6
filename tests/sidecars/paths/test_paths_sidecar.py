"""The `paths` sidecar and `warden paths check` as real processes; a FIFO as a killable hang."""

from __future__ import annotations

import os
import subprocess
import time

from support import http_get, need_binary, run_warden

from warden.paths.probe import REASONS

FAMILIES = (
    "warden_path_up",
    "warden_path_stuck",
    "warden_path_probe_duration_seconds",
    "warden_path_free_bytes",
    "warden_path_free_inodes",
    "warden_path_read_only",
    "warden_path_failure",
    "warden_path_last_success_timestamp_seconds",
    "warden_path_probes_total",
    "warden_path_probe_processes",
    "warden_path_mount_info",
    "warden_sidecar_up",
    "warden_sidecar_last_success_timestamp_seconds",
)


def test_fifo_hang_marks_stuck_metrics_stay_fast_and_recovery_clears_it(paths_kit, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "small").write_text("ok\n")
    deadline = 1.0
    policy = paths_kit.policy(
        [
            {"name": "data", "path": str(data), "read_file": "small", "interval_seconds": 0.3, "deadline_seconds": 1},
            {"name": "scratch", "path": str(tmp_path), "writable": True, "min_free_bytes": "1MiB"},
        ]
    )
    sidecar = paths_kit.start_sidecar(policy)
    sidecar.wait_for("warden_path_up", 1, 10, path="data")
    # Each path is probed on its own schedule: wait for both, not only the first.
    sidecar.wait_for("warden_path_up", 1, 10, path="scratch")
    samples = sidecar.scrape()
    names = {name for name, _ in samples}
    for family in FAMILIES:
        assert any(n == family or n.startswith(family + "_") for n in names), family
    assert samples[("warden_path_up", (("path", "scratch"),))] == 1
    assert samples[("warden_path_free_bytes", (("path", "scratch"),))] > 1024**2
    assert samples[("warden_sidecar_up", (("sidecar", "paths"),))] == 1

    # Fault: the small file becomes a FIFO, so the probe's open() blocks.
    os.unlink(data / "small")
    os.mkfifo(data / "small")
    t0 = time.monotonic()
    sidecar.wait_for("warden_path_stuck", 1, deadline + 2, path="data")
    detected = time.monotonic() - t0
    assert detected < 0.3 + deadline + 1.0, detected
    hang_end = time.monotonic() + 3
    while time.monotonic() < hang_end:  # metrics keep answering fast while the probe hangs
        samples = sidecar.scrape()
        assert samples[("warden_path_stuck", (("path", "data"),))] == 1
        assert samples[("warden_path_up", (("path", "data"),))] == 0
        assert samples[("warden_path_probe_processes", (("path", "data"),))] <= 1
        assert len(sidecar.children()) <= 2
        time.sleep(0.1)
    for reason in REASONS:
        want = 1 if reason == "stuck" else 0
        assert samples[("warden_path_failure", (("path", "data"), ("reason", reason)))] == want, reason
    assert samples[("warden_path_up", (("path", "scratch"),))] == 1, "one hung path does not affect another"
    sidecar.assert_scrapes_fast()

    # Repair: recovery clears stuck.
    os.unlink(data / "small")
    (data / "small").write_text("ok again\n")
    sidecar.wait_for("warden_path_stuck", 0, deadline + 2, path="data")
    sidecar.wait_for("warden_path_up", 1, 2, path="data")
    assert sidecar.value("warden_path_probes_total", path="data", result="stuck") >= 1


def test_metrics_pass_promtool(paths_kit, tmp_path):
    promtool = need_binary("promtool")
    policy = paths_kit.policy([{"name": "scratch", "path": str(tmp_path), "writable": True}])
    sidecar = paths_kit.start_sidecar(policy)
    sidecar.wait_for("warden_path_up", 1, 10, path="scratch")
    body = http_get(sidecar.url)[1]
    done = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_paths_check_exit_codes_and_formats(paths_kit, tmp_path, report_by_name):
    (tmp_path / "f").write_text("x")
    healthy = paths_kit.policy([{"name": "scratch", "path": str(tmp_path), "writable": True}], name="ok.yaml")
    done = run_warden("paths", "check", "--policy", healthy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("paths: 1 healthy, 0 unhealthy") and "scratch" in done.stdout

    broken = paths_kit.policy(
        [
            {"name": "scratch", "path": str(tmp_path), "writable": True},
            {"name": "checkpoint_root", "path": str(tmp_path / "missing"), "writable": True},
            {"name": "optional", "path": str(tmp_path / "missing"), "exists": False},
        ],
        name="bad.yaml",
    )
    code, report, _ = paths_kit.check(broken)
    assert code == 1 and report["healthy"] is False and report["exit_code"] == 1
    by = report_by_name(report)
    assert by["scratch"]["healthy"] and by["optional"]["healthy"]
    ckpt = by["checkpoint_root"]
    assert (ckpt["reason"], ckpt["errno"], ckpt["step"]) == ("missing", "ENOENT", "stat")
    assert ckpt["message"].startswith(f"checkpoint root {tmp_path / 'missing'}: no such file or directory (ENOENT)")
    assert by["scratch"]["mount"]["mount_point"] and by["scratch"]["mount"]["fstype"]

    text = run_warden("paths", "check", "--policy", broken)
    assert text.returncode == 1 and "FAIL" in text.stdout and "Traceback" not in text.stderr
    # The same via the sidecar's --once and via the environment variable.
    once = run_warden("sidecar", "run", "paths", "--policy", broken, "--once", "--state-dir", str(tmp_path / "s"))
    assert once.returncode == 1, once.stderr
    env = run_warden("paths", "check", env={"WARDEN_POLICY": healthy})
    assert env.returncode == 0, env.stderr

    bad = tmp_path / "usage.yaml"
    bad.write_text("version: 1\npaths:\n  - {name: x, path: /tmp, deadline_seconds: -1}\n")
    usage = run_warden("paths", "check", "--policy", str(bad))
    assert usage.returncode == 2 and f"{bad}: paths[0]: deadline_seconds: must be > 0" in usage.stderr
    assert "Traceback" not in usage.stderr
