"""Every metric an alert rule or a dashboard names exists in a real scrape of our processes
(docs/design.md section 8), or is an explicit external family (vLLM, DCGM, node exporter, Prometheus)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT, TEST_CONFIG, free_port, http_get, merge, spawn, stop_process, wait_http, warden_cmd

EXTERNAL = re.compile(r"^(vllm:.*|DCGM_.*|node_.*|up|ALERTS|ALERTS_FOR_STATE)$")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "info": ("_info",),
}


def generator():
    spec = importlib.util.spec_from_file_location(
        "warden_grafana_generate", os.path.join(ROOT, "grafana", "generate.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def rule_names() -> tuple[set[str], set[str]]:
    """(metric names used by rule expressions, names recorded by recording rules)."""
    pytest.importorskip("promql_parser", reason="promql-parser is in the test extra")
    gen = generator()
    used, recorded = set(), set()
    rules_dir = os.path.join(ROOT, "alerts", "rules")
    for name in os.listdir(rules_dir):
        with open(os.path.join(rules_dir, name), encoding="utf-8") as fh:
            for group in yaml.safe_load(fh)["groups"]:
                for rule in group["rules"]:
                    used |= gen.metric_names(rule["expr"])
                    if "record" in rule:
                        recorded.add(rule["record"])
    return used, recorded


def sample_names(text: str) -> set[str]:
    names = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(fam.name + s for s in SUFFIXES.get(fam.type, ()))
        names.update(s.name for s in fam.samples)
    return names


def scrape_sidecar(name: str, run_dir, policy: dict | None) -> set[str]:
    args = ["sidecar", "run", name, "--run-dir", str(run_dir), "--port", str(port := free_port())]
    if policy is not None:
        path = run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"version": 1, **policy}))
        args += ["--policy", str(path)]
    proc = spawn(warden_cmd(*args), stderr=subprocess.PIPE)
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", deadline_s=90, proc=proc)
        except AssertionError as exc:
            raise AssertionError(f"sidecar {name}: {exc}: {proc.stderr.read().decode()[-1500:]}") from None
        return sample_names(http_get(f"http://127.0.0.1:{port}/metrics")[1])
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """Sample names from a real scrape of the trainer and of every sidecar."""
    from trainer.config import load_config
    from trainer.core import PPOTrainer
    from warden.signing import generate_keypair

    base = tmp_path_factory.mktemp("scrape")
    run_dir = base / "run"
    port = free_port()
    cfg_path = base / "train.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            merge(
                TEST_CONFIG,
                {"model": {"tiny": {"cache_dir": str(base / "assets")}}, "run": {"metrics_port": port}, "max_steps": 1},
            )
        )
    )
    trainer = PPOTrainer(load_config(str(cfg_path)), str(run_dir))
    try:
        trainer.train()
        names = sample_names(http_get(f"http://127.0.0.1:{port}/metrics")[1])
    finally:
        trainer.close()
    keys = generate_keypair(str(base / "keys"))
    empty_site = base / "site"
    empty_site.mkdir()
    (base / "empty.lock").write_text("")
    policies = {
        "journal": None,
        "signer": {"signing_key": str(keys.private_key)},
        "archiver": {
            "store": f"file://{base / 'archive'}",
            "signing_key": str(keys.private_key),
            "retention": {"mode": "none", "days": 0, "require_object_lock": False},
        },
        "tokenscan": {"paths": []},
        "deps": {
            "target": {"site_packages": str(empty_site)},
            "lock": {"path": str(base / "empty.lock")},
            "vulnerabilities": {"osv_db": None, "pip_audit_crosscheck": False},
            "strict": False,
        },
        "paths": None,
        "shadow": {"baseline": str(run_dir)},
    }
    for name, policy in policies.items():
        names |= scrape_sidecar(name, run_dir, policy)
    return names | scrape_bridge(base)


def scrape_bridge(base) -> set[str]:
    """The verl bridge following a log line with the verl keys the bridge rules name."""
    verl_log = base / "verl" / "metrics.jsonl"
    verl_log.parent.mkdir()
    keys = {"critic/score/mean": 0.5, "actor/kl_loss": 0.01, "actor/reward_kl_penalty": 0.01, "actor/pg_loss": 0.1}
    verl_log.write_text(json.dumps({"step": 1, "data": keys}) + "\n")
    port = free_port()
    args = ["bridge", "verl", "--run-dir", str(base / "bridge-run"), "--verl-log", str(verl_log), "--port", str(port)]
    proc = spawn(warden_cmd(*args, "--run-id", "scrape", "--poll-interval", "0.2"), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            body = wait_http(f"http://127.0.0.1:{port}/metrics", deadline_s=60, proc=proc)
            if "warden_verl_critic_score_mean" in body:
                return sample_names(body)
            assert time.monotonic() < deadline, f"the bridge exported no verl metric: {body[-1500:]}"
            time.sleep(0.2)
    finally:
        stop_process(proc)


def test_every_rule_and_panel_metric_exists(scraped):
    used, recorded = rule_names()
    with open(os.path.join(ROOT, "grafana", "metrics-used.json"), encoding="utf-8") as fh:
        used |= set(json.load(fh))
    missing = sorted(n for n in used if n not in scraped and n not in recorded and not EXTERNAL.match(n))
    assert missing == [], f"named by rules or dashboards but absent from every scrape: {missing}"


def test_our_metrics_follow_the_conventions(scraped):
    ours = sorted(n for n in scraped if n.startswith(("warden_", "process_", "python_")) is False)
    assert all(":" not in n for n in scraped if n.startswith("warden_"))
    assert all(n.startswith(("warden_", "process_", "python_", "vllm:")) for n in scraped), ours
