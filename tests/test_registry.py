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

from sidecars.registry import DEPLOYMENTS, SIDECARS, sidecar_class

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


def _scrape_jobs(config: str = "prometheus.yml") -> dict[str, list[str]]:
    jobs = _yaml("alerts", config)["scrape_configs"]
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
    absent = {
        alert
        for rule_file in ("meta.yml", "meta-trainer.yml", "meta-bridge.yml")
        for alert in _alert_names(rule_file)
        if alert.endswith("Absent")
    }
    known = {f"Warden{n.capitalize()}Absent" for n in [*NAMES, "trainer", "bridge"]}
    assert absent <= known, absent - known


# Each deployment kind (Warden's trainer, verl, HF/TRL) scrapes every sidecar and loads every
# sidecar's rules; what it adds is its trainer side, declared in DEPLOYMENTS and nowhere else.
COMMON_RULES = {"rules/meta.yml", "rules/sidecars.yml", *(f"rules/{n}.yml" for n in NAMES)}


@pytest.mark.parametrize("kind", sorted(DEPLOYMENTS))
def test_deployment_config_is_the_sidecars_plus_its_trainer_side(kind):
    deployment = DEPLOYMENTS[kind]
    config = _yaml("alerts", deployment.prometheus)
    jobs = _scrape_jobs(deployment.prometheus)
    for name in NAMES:
        port = sidecar_class(name).default_port
        assert jobs.get(name) == [f"{name}:{port}"], f"alerts/{deployment.prometheus}: job {name!r}"
    assert set(jobs) == {*NAMES, *deployment.jobs}, f"alerts/{deployment.prometheus}: jobs {sorted(jobs)}"
    rule_files = config["rule_files"]
    assert len(rule_files) == len(set(rule_files)), rule_files
    assert set(rule_files) == COMMON_RULES | set(deployment.rules), f"alerts/{deployment.prometheus}: rule_files"
    assert config["global"] == _yaml("alerts", "prometheus.yml")["global"]
    assert config["alerting"] == _yaml("alerts", "prometheus.yml")["alerting"]


@pytest.mark.parametrize("kind", sorted(DEPLOYMENTS))
def test_a_deployment_expects_only_the_trainer_side_it_scrapes(kind):
    """The false page of the issue: an absent alert for a job the deployment does not declare."""
    deployment = DEPLOYMENTS[kind]
    loaded = [r.removeprefix("rules/") for r in _yaml("alerts", deployment.prometheus)["rule_files"]]
    jobs = set(_scrape_jobs(deployment.prometheus))
    for rule_file in loaded:
        for group in _yaml("alerts", "rules", rule_file)["groups"]:
            for rule in group["rules"]:
                for job in re.findall(r'absent\(up\{job="([^"]+)"\}\)', rule.get("expr", "")):
                    assert job in jobs, f"alerts/{deployment.prometheus}: {rule['alert']} expects job {job!r}"
    for job in deployment.jobs:
        absent = f"Warden{job.capitalize()}Absent"
        if kind != "warden" or job == "trainer":  # the default stack's bridge is optional
            assert any(absent in _alert_names(r) for r in loaded), f"alerts/{deployment.prometheus}: no {absent}"


def test_every_rule_file_is_loaded_by_some_deployment():
    on_disk = {f"rules/{f}" for f in os.listdir(os.path.join(ROOT, "alerts", "rules")) if f.endswith(".yml")}
    loaded = {r for d in DEPLOYMENTS.values() for r in _yaml("alerts", d.prometheus)["rule_files"]}
    assert loaded == on_disk, on_disk ^ loaded
