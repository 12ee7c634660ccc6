"""The deploy commands of README.md and docs/deploy.md against docker-compose.yml (issue 32).

Each `up` line names services that exist; the podman sequence starts every service once, each after
what it depends on; the verl/HF lines leave out the trainer and what needs it; the `run-dir.yml`
override the docs show is one docker-compose accepts and binds the `run` volume.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import yaml
from support import ROOT, need_binary

COMPOSE = os.path.join(ROOT, "docker-compose.yml")
DEPLOY = os.path.join(ROOT, "docs", "deploy.md")
README = os.path.join(ROOT, "README.md")


def services() -> dict:
    with open(COMPOSE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)["services"]


def blocks(path: str, lang: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return re.findall(rf"```{lang}\n(.*?)```", fh.read(), re.S)


def up_lines(text: str) -> list[list[str]]:
    """The services of each `... up -d [flags] SERVICE...` command (continuation lines joined)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        for command in re.split(r"&&|;", line):
            words = shlex.split(command.split("#", 1)[0])
            if "up" in words:
                rest = words[words.index("up") + 1 :]
                out.append([w for w in rest if not w.startswith("-")])
    return out


def test_every_service_an_up_line_names_exists():
    known = set(services())
    lines = [u for path in (README, DEPLOY) for block in blocks(path, "sh") for u in up_lines(block)]
    assert len(lines) >= 8, lines
    for named in lines:
        assert set(named) <= known, set(named) - known


def test_the_podman_sequence_starts_each_service_once_after_its_dependencies():
    (podman,) = [b for b in blocks(DEPLOY, "sh") if "compose-stack setup images" in b]
    started: list[str] = []
    for named in up_lines(podman):
        for service in named:  # podman-compose starts them in the order given
            needs = set(services()[service].get("depends_on") or {})
            assert needs <= set(started), f"{service} is started before {needs - set(started)}"
            started.append(service)
    assert sorted(started) == sorted(services())
    # a dependency that must be healthy or completed is waited for before the line that needs it
    for service, spec in services().items():
        for dep, cond in (spec.get("depends_on") or {}).items():
            condition = cond.get("condition")
            if condition == "service_healthy":
                assert re.search(rf"healthy {dep} && \$PC up[^\n]*\b{service}\b", podman), (dep, service)
            elif condition == "service_completed_successfully":
                assert f'podman wait "$(svc {dep})"' in podman, dep


def test_the_verl_and_hf_lines_start_neither_the_trainer_nor_deps():
    for path in (README, DEPLOY):
        for block in blocks(path, "sh"):
            if "WARDEN_PROMETHEUS_CONFIG=" not in block:
                continue
            (named,) = up_lines(block)
            assert "trainer" not in named and "deps" not in named
            assert {"signer", "archiver", "prometheus", "alertmanager"} <= set(named)
            assert "-f run-dir.yml" in block


def test_the_run_dir_override_is_valid_and_binds_the_run_volume(tmp_path):
    (override,) = [b for b in blocks(DEPLOY, "yaml") if "driver_opts" in b]
    path = tmp_path / "run-dir.yml"
    path.write_text(override, encoding="utf-8")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    compose = need_binary("docker-compose")
    done = subprocess.run(
        [compose, "-f", COMPOSE, "-f", str(path), "config"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    run = yaml.safe_load(done.stdout)["volumes"]["run"]
    assert run["driver_opts"] == {"type": "none", "o": "bind", "device": "/shared/runs/exp1"}
