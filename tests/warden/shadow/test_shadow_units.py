"""The pure parts of the shadow comparison (warden/shadow): names, defensive parsing, tolerances, the KS test."""

from __future__ import annotations

import pytest

from warden.journal import Event
from warden.policy import PolicyError, policy_from_mapping
from warden.shadow.align import RunSeries, canonical_metrics, series_from, snapshot_rewards
from warden.shadow.compare import compare_series
from warden.shadow.policy import RewardTest, ShadowPolicy, Tolerance


def ev(seq, etype, step, data, run_id="r"):
    return Event(seq=seq, run_id=run_id, type=etype, time="2026-01-01T00:00:00.000000Z", step=step, data=data)


def policy(**metrics):
    return ShadowPolicy(metrics={k: Tolerance(*v) for k, v in metrics.items()}, rewards=RewardTest(0.01, 3))


def test_verl_names_raw_and_bridged_resolve_to_the_warden_name():
    raw = canonical_metrics({"critic/score/mean": 0.5, "actor/pg_loss": 0.25})
    bridged = canonical_metrics({"critic_score_mean": 0.5, "actor_pg_loss": 0.25})
    hf = canonical_metrics({"objective/rlhf_reward": 0.5})
    assert raw["reward_mean"] == bridged["reward_mean"] == hf["reward_mean"] == 0.5
    assert raw["policy_loss"] == bridged["policy_loss"] == 0.25
    own = canonical_metrics({"reward_mean": 0.1, "critic/score/mean": 0.9})
    assert own["reward_mean"] == 0.1  # the journal's own name wins over an alias


def test_untrusted_values_are_dropped_not_trusted():
    values = canonical_metrics({"a": True, "b": "1.0", "c": float("nan"), "d": None, "e": [1], "f": 2, "g": {"x": 1}})
    assert values == {"f": 2.0}
    samples = [{"reward": 1.0}, {"reward": "2"}, "x", {"reward": float("inf")}, {"no": 1}, {"reward": 0}]
    assert snapshot_rewards({"samples": samples}) == [1.0, 0.0]
    assert snapshot_rewards({"samples": "not a list"}) == []


def test_bad_steps_are_skipped_and_a_replayed_step_keeps_its_last_value():
    series = series_from(
        [
            ev(1, "step.completed", None, {"reward_mean": 1.0}),
            ev(2, "step.completed", -4, {"reward_mean": 1.0}),
            ev(3, "step.completed", 1, {"reward_mean": 1.0}),
            ev(4, "step.completed", 1, {"reward_mean": 2.0}),
            ev(5, "checkpoint.saved", 1, {"reward_mean": 9.0}),
        ]
    )
    assert series.skipped == 2 and series.metrics == {1: {"reward_mean": 2.0}}


def _pair(values_a, values_b, rewards_a=None, rewards_b=None):
    a, b = RunSeries(run_id="a"), RunSeries(run_id="b")
    for step, v in enumerate(values_a, 1):
        a.metrics[step] = {"reward_mean": v, "kl": 0.0}
    for step, v in enumerate(values_b, 1):
        b.metrics[step] = {"reward_mean": v}
    a.rewards.update(rewards_a or {})
    b.rewards.update(rewards_b or {})
    return a, b


def test_tolerance_is_absolute_plus_relative_and_the_first_divergence_is_the_lowest_step():
    a, b = _pair([1.0, 1.0, 1.0, 1.0], [1.05, 1.11, 0.5, 2.0])
    result = compare_series(a, b, policy(reward_mean=(0.0, 0.1), kl=(0.0, 0.0)))
    # allowed = 0.1 * max(|a|, |b|): 0.05 <= 0.105 and 0.11 <= 0.111 agree; 0.5 > 0.1 and 1.0 > 0.2 do not
    assert [r.ok for r in result.rows] == [True, True, False, False]
    assert (result.first_divergence.step, result.first_divergence.metric) == (3, "reward_mean")
    assert result.missing == ((1, "kl"), (2, "kl"), (3, "kl"), (4, "kl"))  # b lacks kl: not a divergence


def test_steps_only_one_run_has_are_listed_not_judged():
    a, b = _pair([1.0, 1.0, 1.0], [1.0])
    result = compare_series(a, b, policy(reward_mean=(0.01, 0.0)))
    assert result.ok and result.common_steps == (1,) and result.steps_only_a == (2, 3)


def test_ks_test_separates_different_reward_distributions_and_accepts_equal_ones():
    low = [0.1 * i for i in range(10)]
    high = [5 + 0.1 * i for i in range(10)]
    a, b = _pair([1.0, 1.0], [1.0, 1.0], {1: low, 2: low}, {1: list(reversed(low)), 2: high})
    result = compare_series(a, b, policy(reward_mean=(0.01, 0.0)))
    same, apart = result.reward_rows
    assert same.ok and same.p_value == pytest.approx(1.0)
    assert not apart.ok and apart.statistic == 1.0 and apart.p_value < 0.01
    assert (result.first_divergence.step, result.first_divergence.metric) == (2, "rewards")


def test_too_few_rewards_are_shown_but_not_judged():
    a, b = _pair([1.0], [1.0], {1: [0.0, 0.0]}, {1: [9.0, 9.0]})
    (row,) = compare_series(a, b, policy(reward_mean=(0.01, 0.0))).reward_rows
    assert not row.judged and row.ok


def test_policy_rejects_negative_tolerances_and_an_empty_metric_list():
    with pytest.raises(PolicyError, match="absolute"):
        policy_from_mapping({"version": 1, "metrics": {"kl": {"absolute": -1}}}, ShadowPolicy)
    with pytest.raises(PolicyError, match="metrics"):
        policy_from_mapping({"version": 1, "metrics": {}}, ShadowPolicy)
