"""The shadow sidecar following two live journals, in process and as `warden sidecar run shadow`."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import yaml
from prometheus_client import CollectorRegistry
from support import free_port, http_get, parse_samples, spawn, stop_process, wait_http, warden_cmd

from sidecars.runtime import Outcome, SidecarContext
from sidecars.shadow.sidecar import ShadowSidecar
from warden.journal import EventWriter
from warden.shadow.errors import ShadowConfigError, ShadowInputError
from warden.shadow.policy import RewardTest, ShadowPolicy, Tolerance

POLICY = ShadowPolicy(
    metrics={"reward_mean": Tolerance(0.01, 0.0), "kl": Tolerance(0.01, 0.0)}, rewards=RewardTest(0.01, 3)
)


def writer(run_dir, run_id):
    run_dir.mkdir(parents=True, exist_ok=True)
    return EventWriter(str(run_dir / "events.jsonl"), run_id)


def step(w, n, reward, kl=0.0, rewards=(0.0, 0.5, 1.0)):
    w.emit("step.completed", {"reward_mean": reward, "kl": kl}, step=n)
    w.emit("reward.snapshot", {"samples": [{"reward": r} for r in rewards]}, step=n)


def sidecar(tmp_path, registry, policy=POLICY, candidate=None):
    ctx = SidecarContext(
        name="shadow",
        state_dir=str(tmp_path / "state"),
        run_dir=str(candidate or tmp_path / "cand"),
        policy=policy,
        registry=registry,
    )
    return ShadowSidecar(ctx)


def gauge(registry, name, **labels):
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} not exported"
    return value


def test_follows_both_journals_and_reports_the_first_divergent_step(tmp_path):
    policy = ShadowPolicy(metrics=POLICY.metrics, baseline=str(tmp_path / "base"), rewards=POLICY.rewards)
    registry = CollectorRegistry()
    base, cand = writer(tmp_path / "base", "base"), writer(tmp_path / "cand", "cand")
    shadow = sidecar(tmp_path, registry, policy)
    assert shadow.check() is Outcome.OK  # nothing written yet: nothing to compare, nothing wrong
    assert gauge(registry, "warden_shadow_first_divergent_step") == -1
    for n in (1, 2):
        step(base, n, 0.5)
        step(cand, n, 0.5)
    step(base, 3, 0.5)  # the baseline runs ahead; step 3 is not judged yet
    assert shadow.check() is Outcome.OK
    assert gauge(registry, "warden_shadow_common_steps") == 2
    assert gauge(registry, "warden_shadow_diverged") == 0
    assert gauge(registry, "warden_shadow_last_step", run="baseline") == 3
    assert gauge(registry, "warden_shadow_reward_ks_p_value") == 1.0
    step(cand, 3, 0.9, kl=0.5)
    assert shadow.check() is Outcome.VIOLATION
    assert gauge(registry, "warden_shadow_diverged") == 1
    assert gauge(registry, "warden_shadow_first_divergent_step") == 3
    assert gauge(registry, "warden_shadow_metric_difference", metric="reward_mean") == pytest.approx(0.4)
    assert gauge(registry, "warden_shadow_divergent_steps", metric="kl") == 1
    base.close()
    cand.close()


def test_a_baseline_must_be_named(tmp_path, monkeypatch):
    monkeypatch.delenv("WARDEN_SHADOW_BASELINE", raising=False)
    with pytest.raises(ShadowConfigError, match="baseline"):
        sidecar(tmp_path, CollectorRegistry())
    monkeypatch.setenv("WARDEN_SHADOW_BASELINE", str(tmp_path / "elsewhere"))
    shadow = sidecar(tmp_path, CollectorRegistry())
    assert shadow.baseline.path == str(tmp_path / "elsewhere" / "events.jsonl")


def test_a_fifo_in_place_of_a_journal_is_refused_without_blocking(tmp_path):
    (tmp_path / "base").mkdir()
    os.mkfifo(tmp_path / "base" / "events.jsonl")
    policy = ShadowPolicy(metrics=POLICY.metrics, baseline=str(tmp_path / "base"))
    shadow = sidecar(tmp_path, CollectorRegistry(), policy)
    with pytest.raises(ShadowInputError, match="not a regular file"):
        shadow.check()


def test_relative_baseline_resolves_against_the_policy_file_and_the_service_exports_its_gauges(tmp_path):
    base, cand = writer(tmp_path / "runs" / "base", "base"), writer(tmp_path / "cand", "cand")
    step(base, 1, 0.5)
    step(cand, 1, 0.7)
    base.close()
    cand.close()
    policy_file = tmp_path / "runs" / "shadow.yaml"
    policy_file.write_text(
        yaml.safe_dump({"version": 1, "baseline": "base", "metrics": {"reward_mean": {"absolute": 0.01}}})
    )
    port = free_port()
    args = ["sidecar", "run", "shadow", "--run-dir", str(tmp_path / "cand"), "--policy", str(policy_file)]
    proc = spawn(warden_cmd(*args, "--port", str(port)), stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", deadline_s=60, proc=proc)
        deadline = time.monotonic() + 30
        while True:  # the first comparison runs right after the server starts
            samples = parse_samples(http_get(f"http://127.0.0.1:{port}/metrics")[1])
            if samples.get(("warden_shadow_common_steps", ())) == 1:
                break
            assert time.monotonic() < deadline, f"no comparison within 30 s: {samples}"
            time.sleep(0.1)
    finally:
        stop_process(proc)
    assert samples[("warden_shadow_diverged", ())] == 1
    assert samples[("warden_shadow_first_divergent_step", ())] == 1
    assert samples[("warden_shadow_common_steps", ())] == 1
