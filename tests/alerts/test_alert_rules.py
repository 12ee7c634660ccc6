"""Alert rules and routing, checked with the real promtool and amtool."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml
from support import ROOT, need_binary

ALERTS = os.path.join(ROOT, "alerts")
RULE_FILES = sorted(
    os.path.join(ALERTS, "rules", f) for f in os.listdir(os.path.join(ALERTS, "rules")) if f.endswith(".yml")
)
TEST_FILES = sorted(
    os.path.join(ALERTS, "tests", f) for f in os.listdir(os.path.join(ALERTS, "tests")) if f.endswith(".yml")
)
SEVERITIES = {"critical", "warning", "info"}


def all_alerts():
    for path in RULE_FILES:
        with open(path, encoding="utf-8") as fh:
            for group in yaml.safe_load(fh)["groups"]:
                for rule in group["rules"]:
                    if "alert" in rule:
                        yield os.path.basename(path), rule


def run(cmd, cwd=ALERTS):
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus.verl.yml", "prometheus.hf.yml"])
def test_promtool_check_config(config):
    run([need_binary("promtool"), "check", "config", config])


def test_promtool_check_rules_lint_fatal():
    run([need_binary("promtool"), "check", "rules", "--lint-fatal", *RULE_FILES])


def test_promtool_unit_tests():
    out = run(
        [need_binary("promtool"), "test", "rules", *[os.path.basename(t) for t in TEST_FILES]],
        cwd=os.path.join(ALERTS, "tests"),
    )
    assert out.count("SUCCESS") == len(TEST_FILES)


def test_every_rule_file_is_loaded_by_prometheus_yml():
    """The default stack loads every rule file but the verl deployment's meta-bridge.yml."""
    with open(os.path.join(ALERTS, "prometheus.yml"), encoding="utf-8") as fh:
        loaded = {os.path.normpath(os.path.join(ALERTS, p)) for p in yaml.safe_load(fh)["rule_files"]}
    assert loaded == set(RULE_FILES) - {os.path.join(ALERTS, "rules", "meta-bridge.yml")}


def test_every_alert_has_labels_annotations_and_runbook_anchor():
    with open(os.path.join(ALERTS, "runbooks.md"), encoding="utf-8") as fh:
        anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", fh.read(), re.M)}
    names = set()
    for source, rule in all_alerts():
        name = rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), f"{source}: {name} is not CamelCase"
        assert name not in names, f"duplicate alert {name}"
        names.add(name)
        assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{name}: severity"
        notes = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert notes.get(key), f"{name}: annotation {key} missing"
        url = notes["runbook_url"]
        assert url.startswith("alerts/runbooks.md#"), url
        assert url.split("#", 1)[1] in anchors, f"{name}: runbook anchor {url} has no section"


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    firing, quiet = set(), set()
    for path in TEST_FILES:
        with open(path, encoding="utf-8") as fh:
            for test in yaml.safe_load(fh)["tests"]:
                for case in test.get("alert_rule_test", []):
                    (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for _, rule in all_alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == {"Watchdog"}, "alerts never tested quiet (Watchdog always fires)"


ROUTES = [
    ({"alertname": "Watchdog", "severity": "info"}, "deadman"),
    ({"alertname": "WardenPathStuck", "severity": "critical", "job": "paths"}, "pager"),
    ({"alertname": "WardenTrainerOOM", "severity": "warning", "job": "trainer"}, "ticket"),
    ({"alertname": "Something", "severity": "info"}, "ticket"),
]


def test_amtool_check_config():
    run([need_binary("amtool"), "check-config", "alertmanager.yml"])


@pytest.mark.parametrize(("labels", "receiver"), ROUTES)
def test_amtool_routes(labels, receiver):
    amtool = need_binary("amtool")
    args = [f"{k}={v}" for k, v in labels.items()]
    run([amtool, "config", "routes", "test", "--config.file=alertmanager.yml", f"--verify.receivers={receiver}", *args])


def test_alertmanager_groups_and_inhibits_as_designed():
    with open(os.path.join(ALERTS, "alertmanager.yml"), encoding="utf-8") as fh:
        conf = yaml.safe_load(fh)
    assert conf["route"]["group_by"] == ["alertname", "job", "severity"]
    assert conf["route"]["group_wait"] in ("1s", "1000ms") or conf["route"]["group_wait"].endswith("s")
    rules = conf["inhibit_rules"]
    assert any(
        r["source_matchers"] == ['severity="critical"'] and set(r["equal"]) == {"alertname", "instance"} for r in rules
    )
    assert any(r["source_matchers"] == ['alertname="WardenTargetDown"'] and r["equal"] == ["job"] for r in rules)
