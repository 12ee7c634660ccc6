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


def _compose_config(env_overrides: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    compose = need_binary("docker-compose")
    env = {k: v for k, v in os.environ.items() if k not in env_overrides}
    env.update({k: v for k, v in env_overrides.items() if v is not None})
    return subprocess.run([compose, "-f", COMPOSE, "config", "-q"], capture_output=True, text=True, cwd=ROOT, env=env)


def test_docker_compose_config_is_valid():
    result = _compose_config({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert result.returncode == 0, result.stderr


def test_compose_refuses_to_start_s3_without_credentials():
    """No default credentials: an unset key is an error, never an S3 that takes anyone."""
    result = _compose_config({"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
    assert result.returncode != 0
    assert "set AWS_" in result.stderr, result.stderr


def test_seaweedfs_has_credentials_and_listens_on_loopback_only():
    seaweed = services()["seaweedfs"]
    env = seaweed.get("environment") or {}
    assert "AWS_ACCESS_KEY_ID" in env and "AWS_SECRET_ACCESS_KEY" in env
    for name, svc in services().items():
        for value in (svc.get("environment") or {}).values():
            assert "change-me" not in str(value), name
    assert [str(p) for p in seaweed["ports"]] == ["127.0.0.1:8333:8333"]


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
