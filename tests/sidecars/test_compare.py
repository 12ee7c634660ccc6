"""`warden compare` on real runs: the trainer twice with one seed, once with another learning
rate, and a verl journal written by the bridge from verl's own metric names (issue 22)."""

from __future__ import annotations

import json

import pytest
import yaml
from support import TEST_CONFIG, merge, run_warden

from warden.journal import JournalReader
from warden.policy import default_policy_path, load_policy
from warden.shadow.policy import ShadowPolicy

# The trainer (torch, transformers) is the `train` extra; without it these tests skip, never error.
pytest.importorskip("torch", reason="needs the train extra: pip install 'warden[train]'")

STEPS = 3


def _train(base, name, tiny_cache, extra=None):
    from trainer.config import load_config
    from trainer.core import PPOTrainer

    cache, _ = tiny_cache
    raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}, "checkpoint": {"every_steps": 0}})
    raw = merge(raw, {"max_steps": STEPS, **(extra or {})})
    path = base / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir = base / name
    trainer = PPOTrainer(load_config(str(path)), str(run_dir))
    try:
        trainer.train()
    finally:
        trainer.close()
    return run_dir


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    from trainer.assets import ensure_tiny_assets
    from trainer.config import TinyAssets

    cache = tmp_path_factory.mktemp("tiny-assets")
    spec = TinyAssets(cache_dir=str(cache), **TEST_CONFIG["model"]["tiny"])
    return cache, ensure_tiny_assets(spec)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_cache):
    base = tmp_path_factory.mktemp("compare")
    return {
        "a": _train(base, "a", tiny_cache),
        "same": _train(base, "same", tiny_cache),
        "lr": _train(base, "lr", tiny_cache, {"ppo": {"actor_lr": 3.0e-2}}),
    }


def _events(run_dir, etype):
    return [e for e, _ in JournalReader(str(run_dir / "events.jsonl")).read_available() if e.type == etype]


def _first_outside_tolerance(run_a, run_b):
    """The first (step, metric) whose raw journal values differ by more than the shipped policy allows,
    computed here from the journals without the comparison code."""
    policy = load_policy(default_policy_path("shadow"), ShadowPolicy)
    a = {e.step: e.data for e in _events(run_a, "step.completed")}
    b = {e.step: e.data for e in _events(run_b, "step.completed")}
    for step in sorted(set(a) & set(b)):
        for name, tol in policy.metrics.items():
            va, vb = a[step][name], b[step][name]
            if abs(va - vb) > tol.absolute + tol.relative * max(abs(va), abs(vb)):
                return step, name
    return None


def _compare(a, b, *extra):
    result = run_warden("compare", str(a), str(b), "--format", "json", *extra, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_two_runs_with_one_seed_agree(runs, tmp_path):
    png = tmp_path / "same.png"
    code, report = _compare(runs["a"], runs["same"], "--plot", str(png))
    assert code == 0 and report["ok"] is True and report["first_divergence"] is None
    assert report["common_steps"] == list(range(1, STEPS + 1))
    assert {r["metric"] for r in report["rows"]} == set(report["metrics"])
    assert all(w["judged"] and w["p_value"] == 1.0 for w in report["rewards"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_warden("compare", str(runs["a"]), str(runs["same"]), timeout=120)
    assert text.returncode == 0 and "verdict: within tolerance" in text.stdout


def test_a_changed_learning_rate_diverges_at_the_first_step_outside_tolerance(runs, tmp_path):
    expected = _first_outside_tolerance(runs["a"], runs["lr"])
    assert expected is not None, "a 10x learning rate should leave the tolerance within the run"
    code, report = _compare(runs["a"], runs["lr"], "--plot", str(tmp_path / "lr.png"))
    assert code == 1 and report["ok"] is False
    first = report["first_divergence"]
    assert (first["step"], first["metric"]) == expected
    text = run_warden("compare", str(runs["a"]), str(runs["lr"]), timeout=120)
    assert text.returncode == 1
    assert f"DIVERGED first at step {expected[0]}, metric {expected[1]}" in text.stdout


def _verl_journal_of(run_dir, base):
    """A verl file-logger log with verl's names only (what verl writes), through the bridge."""
    log = base / "verl" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    lines = []
    for e in _events(run_dir, "step.completed"):
        verl = {k: v for k, v in e.data.items() if "/" in k and k.split("/")[0] in ("actor", "critic", "timing_s")}
        lines.append(json.dumps({"step": e.step, "data": verl}))
    log.write_text("\n".join(lines) + "\n")
    out = base / "bridged"
    result = run_warden(
        "bridge", "verl", "--run-dir", str(out), "--verl-log", str(log), "--once", "--port", "0", "--run-id", "verl"
    )
    assert result.returncode == 0, result.stderr
    return out


def test_a_verl_journal_from_the_bridge_meets_a_warden_run(runs, tmp_path):
    bridged = _verl_journal_of(runs["a"], tmp_path / "from-a")
    bridged_events = _events(bridged, "step.completed")
    assert bridged_events and "reward_mean" not in json.dumps(_verl_log_keys(tmp_path / "from-a"))
    code, report = _compare(runs["same"], bridged)
    assert code == 0, report["divergences"]
    assert {r["metric"] for r in report["rows"]} == set(report["metrics"])  # every metric found through aliases
    assert report["common_steps"] == list(range(1, STEPS + 1))
    code, report = _compare(runs["lr"], bridged)
    assert code == 1 and report["first_divergence"]["step"] == _first_outside_tolerance(runs["lr"], runs["a"])[0]


def _verl_log_keys(base):
    return [json.loads(line)["data"] for line in (base / "verl" / "metrics.jsonl").read_text().splitlines()]


def test_runs_without_a_common_step_cannot_be_compared(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "events.jsonl").write_text("")
    result = run_warden("compare", str(runs["a"]), str(empty))
    assert result.returncode == 3 and "share no step" in result.stderr


def test_a_path_that_is_no_journal_is_a_usage_error(tmp_path):
    result = run_warden("compare", str(tmp_path / "nothing"), str(tmp_path))
    assert result.returncode == 2 and "no journal there" in result.stderr
