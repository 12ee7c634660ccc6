"""The shadow sidecar's reduction of a comparison to the ``warden_shadow_*`` gauge values (pure)."""

from __future__ import annotations

import math

import pytest

from sidecars.shadow.metrics import reading_of
from warden.shadow.align import RunSeries
from warden.shadow.compare import compare_series
from warden.shadow.policy import RewardTest, ShadowPolicy, Tolerance


def policy(**metrics):
    return ShadowPolicy(metrics={k: Tolerance(*v) for k, v in metrics.items()}, rewards=RewardTest(0.01, 3))


def _pair(values_a, values_b):
    a, b = RunSeries(run_id="a"), RunSeries(run_id="b")
    for step, v in enumerate(values_a, 1):
        a.metrics[step] = {"reward_mean": v, "kl": 0.0}
    for step, v in enumerate(values_b, 1):
        b.metrics[step] = {"reward_mean": v}
    return a, b


def test_reading_reports_the_newest_common_step_and_counts_divergent_steps():
    a, b = _pair([1.0, 1.0, 1.0], [1.0, 3.0, 1.5])
    comparison = compare_series(a, b, policy(reward_mean=(0.1, 0.0)))
    reading = reading_of(comparison, a, b)
    assert reading.diverged and reading.first_divergent_step == 2
    assert reading.difference["reward_mean"] == pytest.approx(0.5)
    assert reading.divergent_steps == {"reward_mean": 2, "rewards": 0}
    assert math.isnan(reading.ks_p_value)
