"""Judges two :class:`~warden.shadow.align.RunSeries` against a :class:`ShadowPolicy`. Pure.

Only steps both runs reached are compared; only the metrics the policy names are judged (each
with its own tolerance); a metric one run lacks at a step is listed as missing, not as a
divergence. The reward snapshots of a step are compared with scipy's two-sample
Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``, exact where scipy chooses it). The first
divergence is the lowest step with one; within a step, metrics in policy order, then rewards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from warden.errors import ConfigError
from warden.shadow.align import RunSeries
from warden.shadow.policy import RewardTest, ShadowPolicy, Tolerance

REWARDS = "rewards"  # the pseudo-metric name of the reward-distribution test


@dataclass(frozen=True)
class MetricRow:
    step: int
    metric: str
    a: float
    b: float
    allowed: float

    @property
    def diff(self) -> float:
        return self.b - self.a

    @property
    def ok(self) -> bool:
        return abs(self.diff) <= self.allowed


@dataclass(frozen=True)
class RewardRow:
    step: int
    n_a: int
    n_b: int
    statistic: float | None  # None: too few samples to judge
    p_value: float | None
    p_value_min: float

    @property
    def judged(self) -> bool:
        return self.p_value is not None

    @property
    def ok(self) -> bool:
        return self.p_value is None or self.p_value >= self.p_value_min


@dataclass(frozen=True)
class Divergence:
    step: int
    metric: str
    detail: str


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    metrics: tuple[str, ...]
    rows: tuple[MetricRow, ...]
    reward_rows: tuple[RewardRow, ...]
    missing: tuple[tuple[int, str], ...]  # (step, metric) one of the runs lacks
    steps_only_a: tuple[int, ...]
    steps_only_b: tuple[int, ...]

    @property
    def common_steps(self) -> tuple[int, ...]:
        return tuple(sorted({r.step for r in self.rows} | {r.step for r in self.reward_rows}))

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        order = {name: i for i, name in enumerate(self.metrics)}
        found = [
            (r.step, order[r.metric], Divergence(r.step, r.metric, _metric_detail(r))) for r in self.rows if not r.ok
        ]
        found += [
            (r.step, len(order), Divergence(r.step, REWARDS, _reward_detail(r))) for r in self.reward_rows if not r.ok
        ]
        return tuple(d for _, _, d in sorted(found, key=lambda t: (t[0], t[1])))

    @property
    def first_divergence(self) -> Divergence | None:
        found = self.divergences
        return found[0] if found else None

    @property
    def ok(self) -> bool:
        return self.first_divergence is None


def _metric_detail(row: MetricRow) -> str:
    return f"{row.metric}: {row.a:.6g} vs {row.b:.6g} (difference {row.diff:+.3g}, tolerance {row.allowed:.3g})"


def _reward_detail(row: RewardRow) -> str:
    return (
        f"reward distributions differ: KS statistic {row.statistic:.3g}, p = {row.p_value:.3g} "
        f"< {row.p_value_min:g} ({row.n_a} vs {row.n_b} rewards)"
    )


def allowed_difference(tolerance: Tolerance, a: float, b: float) -> float:
    return tolerance.absolute + tolerance.relative * max(abs(a), abs(b))


def ks_row(step: int, a: list[float], b: list[float], test: RewardTest) -> RewardRow:
    """The KS test of one step's rewards; not judged when either side has too few samples."""
    if min(len(a), len(b)) < test.min_samples:
        return RewardRow(step, len(a), len(b), None, None, test.p_value_min)
    try:
        from scipy.stats import ks_2samp  # imported only when there is something to test
    except ImportError:
        raise ConfigError("the KS test of reward snapshots needs scipy: pip install 'warden[shadow]'") from None

    result = ks_2samp(a, b)
    statistic, p_value = float(result.statistic), float(result.pvalue)
    if not math.isfinite(p_value):  # cannot happen for finite samples; never judged as agreeing by accident
        p_value = 0.0
    return RewardRow(step, len(a), len(b), statistic, p_value, test.p_value_min)


def compare_series(a: RunSeries, b: RunSeries, policy: ShadowPolicy) -> Comparison:
    """Aligns ``a`` and ``b`` by step and judges every metric of the policy and every snapshot pair."""
    names = tuple(policy.metrics)
    common = sorted(set(a.metrics) & set(b.metrics))
    rows: list[MetricRow] = []
    missing: list[tuple[int, str]] = []
    for step in common:
        ma, mb = a.metrics[step], b.metrics[step]
        for name in names:
            if name not in ma or name not in mb:
                missing.append((step, name))
                continue
            va, vb = ma[name], mb[name]
            rows.append(MetricRow(step, name, va, vb, allowed_difference(policy.metrics[name], va, vb)))
    reward_rows = tuple(
        ks_row(step, a.rewards[step], b.rewards[step], policy.rewards)
        for step in sorted(set(a.rewards) & set(b.rewards))
    )
    return Comparison(
        run_a=a.run_id,
        run_b=b.run_id,
        metrics=names,
        rows=tuple(rows),
        reward_rows=reward_rows,
        missing=tuple(missing),
        steps_only_a=tuple(sorted(set(a.metrics) - set(b.metrics))),
        steps_only_b=tuple(sorted(set(b.metrics) - set(a.metrics))),
    )
