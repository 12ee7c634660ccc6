"""`warden stack up` / `warden demo`: the Prometheus config pages only for what the stack runs (issue 32).

A fresh demo ended with WardenShadowAbsent firing: the demo runs no shadow sidecar, its scrape job was
left out, but the job's `absent(up{job="shadow"})` alert stayed and fired after its 5 minutes.
"""

from __future__ import annotations

import subprocess

import yaml
from support import need_binary

from sidecars.stack.local import StackOptions, write_prometheus_config

DEMO_PORTS = {"trainer": 9460, "signer": 9461, "archiver": 9462, "tokenscan": 9463, "deps": 9464, "paths": 9465}


def loaded_alerts(config_path: str) -> dict[str, str]:
    with open(config_path, encoding="utf-8") as fh:
        conf = yaml.safe_load(fh)
    alerts = {}
    for path in conf["rule_files"]:
        with open(path, encoding="utf-8") as fh:
            for group in yaml.safe_load(fh).get("groups", []):
                alerts.update({r["alert"]: r["expr"] for r in group["rules"] if "alert" in r})
    return alerts


def test_absent_alerts_of_jobs_the_stack_does_not_run_are_left_out(tmp_path):
    opts = StackOptions(run_dir=str(tmp_path / "run"))
    path = write_prometheus_config(opts, str(tmp_path), {**DEMO_PORTS, "journal": 9466}, 9093)
    alerts = loaded_alerts(path)
    for job in ("signer", "archiver", "tokenscan", "deps", "paths", "journal"):
        assert f"Warden{job.capitalize()}Absent" in alerts, job
    assert "WardenTrainerAbsent" in alerts
    assert "WardenShadowAbsent" not in alerts and "WardenJournalAbsent" in alerts
    # everything else of those files stays: the other alerts of meta.yml and the shadow sidecar's own
    assert {"WardenTargetDown", "Watchdog", "WardenShadowDiverged"} <= set(alerts)


def test_without_the_journal_sidecar_its_absent_alert_goes_too_and_promtool_accepts_the_config(tmp_path):
    opts = StackOptions(run_dir=str(tmp_path / "run"))
    path = write_prometheus_config(opts, str(tmp_path), DEMO_PORTS, 9093)
    alerts = loaded_alerts(path)
    assert "WardenJournalAbsent" not in alerts and "WardenShadowAbsent" not in alerts
    assert "WardenSignerAbsent" in alerts
    promtool = need_binary("promtool")
    done = subprocess.run([promtool, "check", "config", path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
