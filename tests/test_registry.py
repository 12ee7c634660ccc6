"""The registry is the single truth: every registered sidecar is deployed, scraped, alerted on,
documented and shown, and nothing outside the registry names a sidecar it does not have.

Each check fails naming the sidecar and the file that lacks it (CONTRIBUTING.md lists the
same steps for adding a sidecar).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from support import ROOT

from sidecars.registry import SIDECARS, sidecar_class

NAMES = sorted(SIDECARS)


def _yaml(*parts: str):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _text(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def _alert_names(rule_file: str) -> list[str]:
    groups = _yaml("alerts", "rules", rule_file)["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def _scrape_jobs() -> dict[str, list[str]]:
    jobs = _yaml("alerts", "prometheus.yml")["scrape_configs"]
    return {job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]] for job in jobs}


def test_ports_are_unique():
    ports = {name: sidecar_class(name).default_port for name in NAMES}
    assert len(set(ports.values())) == len(ports), ports


@pytest.mark.parametrize("name", NAMES)
def test_compose_runs_the_sidecar_on_its_port(name):
    services = _yaml("docker-compose.yml")["services"]
    assert name in services, f"docker-compose.yml: no service {name!r} for the registered sidecar"
    command = [str(c) for c in services[name].get("command", [])]
    assert command[:3] == ["sidecar", "run", name], f"docker-compose.yml: {name}: command {command}"
    port = sidecar_class(name).default_port
    published = [str(p) for p in services[name].get("ports", [])]
    assert any(p.endswith(f":{port}") for p in published), f"docker-compose.yml: {name}: {port} not published"


@pytest.mark.parametrize("name", NAMES)
def test_prometheus_scrapes_the_sidecar(name):
    port = sidecar_class(name).default_port
    jobs = _scrape_jobs()
    assert jobs.get(name) == [f"{name}:{port}"], f"alerts/prometheus.yml: job {name!r} must scrape {name}:{port}"


@pytest.mark.parametrize("name", NAMES)
def test_meta_alerts_watch_the_sidecar(name):
    rules = {r["alert"]: r for g in _yaml("alerts", "rules", "meta.yml")["groups"] for r in g["rules"]}
    down = rules["WardenTargetDown"]["expr"]
    jobs = re.search(r'job=~"([^"]+)"', down)
    assert jobs and name in jobs.group(1).split("|"), f"alerts/rules/meta.yml: WardenTargetDown misses {name}"
    absent = f"Warden{name.capitalize()}Absent"
    assert absent in rules, f"alerts/rules/meta.yml: no {absent}"
    assert f'absent(up{{job="{name}"}})' in rules[absent]["expr"]


@pytest.mark.parametrize("name", NAMES)
def test_sidecar_has_rules_with_promtool_tests_and_runbooks(name):
    rule_file = f"{name}.yml"
    assert os.path.isfile(os.path.join(ROOT, "alerts", "rules", rule_file)), f"alerts/rules/{rule_file} missing"
    assert f"rules/{rule_file}" in _yaml("alerts", "prometheus.yml")["rule_files"], f"prometheus.yml: {rule_file}"
    tests = _yaml("alerts", "tests", f"{name}_test.yml")
    assert f"../rules/{rule_file}" in tests["rule_files"], f"alerts/tests/{name}_test.yml does not load its rules"
    tested = {a["alertname"] for case in tests["tests"] for a in case.get("alert_rule_test", [])}
    runbook_titles = set(re.findall(r"^## (\S+)", _text("alerts", "runbooks.md"), re.M))
    for alert in _alert_names(rule_file):
        assert alert in tested, f"alerts/tests/{name}_test.yml: no promtool test of {alert}"
        assert alert in runbook_titles, f"alerts/runbooks.md: no '## {alert}' section"


@pytest.mark.parametrize("name", NAMES)
def test_policy_file_and_its_reference_section(name):
    assert os.path.isfile(os.path.join(ROOT, "policies", f"{name}.yaml")), f"policies/{name}.yaml missing"
    assert re.search(rf"^## {name}\.yaml$", _text("policies", "README.md"), re.M), (
        f"policies/README.md: no '## {name}.yaml' section"
    )


@pytest.mark.parametrize("name", NAMES)
def test_overview_dashboard_has_a_row_for_the_sidecar(name):
    overview = json.loads(_text("grafana", "dashboards", "overview.json"))
    exprs = [t.get("expr", "") for p in overview["panels"] for t in p.get("targets", [])]
    exprs += [t.get("expr", "") for p in overview["panels"] for q in p.get("panels", []) for t in q.get("targets", [])]
    assert any(f'up{{job="{name}"}}' in e for e in exprs), f"grafana overview: no up{{job={name!r}}} panel"


def test_nothing_outside_the_registry_claims_to_be_a_sidecar():
    services = _yaml("docker-compose.yml")["services"]
    running = {str(s["command"][2]) for s in services.values() if s.get("command", [None])[:2] == ["sidecar", "run"]}
    assert running <= set(NAMES), running - set(NAMES)
    runbook_meta = _yaml("alerts", "rules", "meta.yml")
    absent = {r["alert"] for g in runbook_meta["groups"] for r in g["rules"] if r["alert"].endswith("Absent")}
    known = {f"Warden{n.capitalize()}Absent" for n in [*NAMES, "trainer", "bridge"]}
    assert absent <= known, absent - known
