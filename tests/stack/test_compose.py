"""docker-compose.yml: valid for docker-compose, and every warden command in it parses."""

from __future__ import annotations

import importlib
import inspect
import os
import re
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
    (port,) = [str(p) for p in seaweed["ports"]]
    assert port.startswith("127.0.0.1:") and port.endswith(":8333"), port


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
# Warden services whose command is a warden command line (the others run a stack/ script).
WARDEN_COMMANDS = sorted(name for name in WARDEN if services()[name].get("command"))


@pytest.mark.parametrize("name", WARDEN_COMMANDS)
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
        assert str(svc[name].get("restart", "")).startswith("on-failure:"), name
        if name != "seaweedfs-init":
            assert "healthcheck" in svc[name], name


# ---- issue 17: what starting the stack for real found ------------------------------------------------
def _dockerfile() -> str:
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as fh:
        return fh.read()


def test_restarts_are_bounded():
    for name, svc in services().items():
        restart = str(svc.get("restart", "no"))
        assert restart == "no" or re.fullmatch(r"on-failure:\d+", restart), f"{name}: restart {restart!r}"


def test_everything_is_published_on_loopback_only():
    for name, svc in services().items():
        for port in svc.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_metrics_listen_on_every_interface_inside_the_containers():
    svc = services()
    assert "run.metrics_listen=0.0.0.0" in [str(c) for c in svc["trainer"]["command"]]
    for name in ("signer", "archiver", "tokenscan", "deps", "paths", "journal"):
        assert svc[name]["environment"]["WARDEN_LISTEN"] == "0.0.0.0", name


def test_healthchecks_probe_what_prometheus_scrapes():
    """Not loopback: stack/healthcheck.py fetches the port on the container's network address."""
    with open(os.path.join(ROOT, "alerts", "prometheus.yml"), encoding="utf-8") as fh:
        scrape = yaml.safe_load(fh)["scrape_configs"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"][0] for job in scrape if "static_configs" in job}
    for job, target in targets.items():
        service, port = target.split(":")
        if service not in services():
            continue  # not a compose service (bridge: `warden bridge verl`, verl runs only)
        test = [str(t) for t in services()[service]["healthcheck"]["test"]]
        assert test[:3] == ["CMD", "python", "/opt/warden/stack/healthcheck.py"], (job, test)
        assert test[3] == port and "/metrics" in test[4:], (job, test)


def test_signing_key_is_copied_to_a_private_tmpfs_not_loosened():
    for name in ("signer", "archiver"):
        svc = services()[name]
        assert svc["entrypoint"][-1] == "/opt/warden/stack/key-entrypoint.py", name
        assert svc["environment"]["WARDEN_KEY_SECRET"] == "/run/secrets/signing_key", name
        assert any(str(t).startswith("/run/warden-key:") for t in svc["tmpfs"]), name
        assert svc["cap_drop"] == ["ALL"] and "SYS_ADMIN" not in svc["cap_add"], name
    keys = importlib.import_module("warden.signing.keys")
    assert "st.st_mode & 0o077" in inspect.getsource(keys)  # the key check itself is unchanged


def test_depends_on_is_long_form_with_conditions():
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services().items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: short-form depends_on"
        for dep, spec in deps.items():
            assert dep in services() and spec["condition"] in conditions, (name, dep, spec)
    assert services()["archiver"]["depends_on"]["seaweedfs-init"]["condition"] == "service_completed_successfully"


def test_alertmanager_receivers_reach_a_compose_service():
    with open(os.path.join(ROOT, "alerts", "alertmanager.yml"), encoding="utf-8") as fh:
        receivers = yaml.safe_load(fh)["receivers"]
    for receiver in receivers:
        for hook in receiver.get("webhook_configs", []):
            host = hook["url"].split("//", 1)[1].split("/", 1)[0].split(":")[0]
            assert host in services(), f"{receiver['name']}: {hook['url']} is not a compose service"


def test_images_are_pinned_to_what_ci_tests():
    images = {name: str(svc["image"]) for name, svc in services().items()}
    for name, image in images.items():
        tag = image.rpartition(":")[2]
        assert ":" in image and tag not in ("latest", "") and "/" not in tag, f"{name}: {image}"
    for binary, service in (("promtool", "prometheus"), ("amtool", "alertmanager")):
        out = subprocess.run([need_binary(binary), "--version"], capture_output=True, text=True)
        version = re.search(r"version (\d+\.\d+\.\d+)", out.stdout + out.stderr).group(1)
        assert images[service].endswith(f":v{version}"), f"{service}: {images[service]} but CI tests {version}"


def test_mount_points_are_created_and_owned_in_the_image():
    """Docker copies the image directory's owner into a new named volume; it does not chown.

    So every mount a service writes must exist in the image, owned by the service user."""
    dockerfile = _dockerfile()
    for name in WARDEN:
        for volume in services()[name].get("volumes") or []:
            target = _volume_target(volume)
            if target.startswith(("/opt/venv", "/audit")) or str(volume).endswith(":ro"):
                continue  # the trainer image's own site-packages (copied into the volume); read-only mounts
            assert target in dockerfile, f"{name}: {target} is not created in the Dockerfile"


def _volume_target(volume: object) -> str:
    """The container path of a short-form volume (``${VAR:-default}`` sources allowed)."""
    return re.sub(r"\$\{[^}]*\}", "SRC", str(volume)).split(":")[1]


def _volume_source(volume: object) -> str:
    return re.sub(r"\$\{[^}]*\}", lambda m: m.group(0), str(volume)).rsplit(":" + _volume_target(volume), 1)[0]


def test_tokenscan_and_paths_see_the_trainers_mounts():
    svc = services()
    model = next(v for v in svc["trainer"]["volumes"] if _volume_target(v) == "/models")
    for name in ("tokenscan", "paths"):
        assert any(
            _volume_target(v) == "/models" and _volume_source(v) == _volume_source(model) for v in svc[name]["volumes"]
        ), name
    assert "model.tiny.cache_dir=/models/tiny" in [str(c) for c in svc["trainer"]["command"]]
    with open(os.path.join(ROOT, "stack", "policies", "paths.yaml"), encoding="utf-8") as fh:
        watched = {p["path"] for p in yaml.safe_load(fh)["paths"]}
    assert watched == {"/data", "/models", "/run/warden"}


def test_deps_has_an_osv_volume():
    deps = services()["deps"]
    assert any(str(v).endswith(":/var/lib/warden/osv:ro") for v in deps["volumes"])
    assert "/opt/warden/policies/deps.compose.yaml" in deps["command"]
    assert '"  osv_db: /var/lib/warden/osv"' in _dockerfile()
