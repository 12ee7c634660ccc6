"""Metric names -> Prometheus-safe names: the documented table, collisions, aliases."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, Gauge

from warden.metric_names import HF_ALIASES, map_metrics, mapping_table, prometheus_name, warden_aliases

PROM = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@pytest.mark.parametrize(
    ("original", "mapped"),
    [
        ("actor/pg_loss", "actor_pg_loss"),
        ("critic/score/mean", "critic_score_mean"),
        ("perf/throughput", "perf_throughput"),
        ("val-core/openai/gsm8k/reward/mean@1", "val_core_openai_gsm8k_reward_mean_at_1"),
        ("val-aux/openai/gsm8k/reward/best@4/mean", "val_aux_openai_gsm8k_reward_best_at_4_mean"),
        ("timing_s/update.actor", "timing_s_update_actor"),
        ("perf/mfu%", "perf_mfu_"),
        ("tööl:calls", "t__l_calls"),
        ("4bit/loss", "_4bit_loss"),
        ("", "_"),
        ("loss", "loss"),
    ],
)
def test_the_documented_table(original, mapped):
    assert prometheus_name(original) == mapped
    assert PROM.match(mapped)


def test_every_mapped_name_is_accepted_by_prometheus_client(verl_kit):
    registry = CollectorRegistry()
    names = verl_kit.verl_metrics(3, validate=True)
    for original, mapped in mapping_table(names):
        Gauge(f"warden_verl_{mapped}", f"verl {original}", registry=registry)
    assert len(list(registry.collect())) == len(names)


def test_map_metrics_keeps_finite_numbers_and_reports_the_rest():
    result = map_metrics({"a/b": 1, "a_b": 2.0, "n": None, "nan": math.nan, "t": True, "s": "x", "l": [1], "i": 5})
    # sorted order: "a/b" comes before "a_b", so "a_b" is the collision
    assert result.values == {"a_b": 1.0, "i": 5.0}
    assert result.collisions == ("a_b",)
    assert set(result.non_numeric) == {"n", "nan", "t", "s", "l"}


def test_verl_aliases_give_the_warden_trainer_names(verl_kit):
    metrics = verl_kit.verl_metrics(4)
    aliases = warden_aliases(metrics)
    assert aliases["reward_mean"] == metrics["critic/score/mean"]
    assert aliases["policy_loss"] == metrics["actor/pg_loss"]
    assert aliases["value_loss"] == metrics["critic/vf_loss"]
    assert aliases["kl"] == metrics["actor/kl_loss"]
    assert aliases["timings"] == {"step_s": 20.0, "rollout_s": 12.5, "update_s": 4.25}
    assert warden_aliases({"actor/pg_loss": None}) == {}


def test_hf_aliases():
    logs = {"loss": 1.5, "grad_norm": 0.3, "learning_rate": 1e-4, "reward": 0.7, "kl": 0.01}
    assert warden_aliases(logs, HF_ALIASES) == {
        "reward_mean": 0.7,
        "kl": 0.01,
        "grad_norm": 0.3,
        "lr": 1e-4,
    }
