"""docker-compose.yml: valid for docker-compose, and every warden command in it parses."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from support import ROOT, need_binary, run_warden

COMPOSE = os.path.join(ROOT, "docker-compose.yml")


def services():
    with open(COMPOSE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)["services"]


def test_docker_compose_config_is_valid():
    compose = need_binary("docker-compose")
    result = subprocess.run([compose, "-f", COMPOSE, "config", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_stack_has_every_component():
    names = set(services())
    assert {
        "trainer",
        "signer",
        "archiver",
        "tokenscan",
        "deps",
        "paths",
        "seaweedfs",
        "prometheus",
        "alertmanager",
        "grafana",
    } <= names


WARDEN = sorted(name for name, svc in services().items() if str(svc.get("image", "")).startswith("warden"))


@pytest.mark.parametrize("name", WARDEN)
def test_every_warden_command_line_parses(name):
    command = [str(c) for c in services()[name]["command"]]
    result = run_warden(*command, "--help")
    assert result.returncode == 0, f"{name}: warden {' '.join(command)} --help -> {result.stderr}"
    assert "Usage: warden" in result.stdout


def test_secrets_reach_only_signer_and_archiver_and_are_not_baked_in():
    for name, svc in services().items():
        has_secret = "signing_key" in (svc.get("secrets") or [])
        assert has_secret == (name in ("signer", "archiver")), name
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as fh:
        dockerfile = fh.read()
    assert "signing.key" not in dockerfile and "AWS_SECRET" not in dockerfile


def test_mounts_follow_the_design():
    svc = services()
    assert "run:/run/warden" in svc["signer"]["volumes"]  # writes .sig files
    assert "run:/run/warden:ro" in svc["archiver"]["volumes"]
    assert any(v.startswith("trainer-site-packages:") and v.endswith(":ro") for v in svc["deps"]["volumes"])
    assert all(v.endswith(":ro") for v in svc["tokenscan"]["volumes"] if "/models" in v)
    for name in WARDEN:
        assert svc[name].get("restart") == "on-failure", name
        if name != "trainer":
            assert "healthcheck" in svc[name], name
