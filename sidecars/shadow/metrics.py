"""The ``warden_shadow_*`` gauges and the pure reduction of a comparison to their values."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from warden.shadow.align import RunSeries
from warden.shadow.compare import Comparison, MetricRow


@dataclass(frozen=True)
class ShadowReading:
    """What the gauges show after one comparison."""

    diverged: bool
    first_divergent_step: int  # -1: none
    common_steps: int
    last_step_baseline: int  # -1: no step yet
    last_step_candidate: int
    difference: dict[str, float]  # metric -> B - A at the newest common step that has it
    tolerance: dict[str, float]
    divergent_steps: dict[str, int]  # metric -> common steps where it diverged ("rewards" included)
    ks_p_value: float  # newest judged step; NaN: none judged
    ks_statistic: float


def _newest(rows: tuple[MetricRow, ...], metric: str) -> MetricRow | None:
    found = [r for r in rows if r.metric == metric]
    return max(found, key=lambda r: r.step) if found else None


def reading_of(comparison: Comparison, baseline: RunSeries, candidate: RunSeries) -> ShadowReading:
    """The gauge values of ``comparison`` (pure)."""
    first = comparison.first_divergence
    difference, tolerance = {}, {}
    for name in comparison.metrics:
        row = _newest(comparison.rows, name)
        difference[name] = row.diff if row else math.nan
        tolerance[name] = row.allowed if row else math.nan
    counts = {name: 0 for name in (*comparison.metrics, "rewards")}
    for d in comparison.divergences:
        counts[d.metric] += 1
    judged = [w for w in comparison.reward_rows if w.statistic is not None and w.p_value is not None]
    newest = max(judged, key=lambda w: w.step) if judged else None
    return ShadowReading(
        diverged=first is not None,
        first_divergent_step=first.step if first else -1,
        common_steps=len(comparison.common_steps),
        last_step_baseline=max(baseline.metrics, default=-1),
        last_step_candidate=max(candidate.metrics, default=-1),
        difference=difference,
        tolerance=tolerance,
        divergent_steps=counts,
        ks_p_value=newest.p_value if newest and newest.p_value is not None else math.nan,
        ks_statistic=newest.statistic if newest and newest.statistic is not None else math.nan,
    )


class ShadowMetrics:
    """The families; label ``metric`` takes only the policy's metric names and ``rewards``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "warden_shadow_"
        self.diverged = Gauge(
            p + "diverged", "1 when the candidate run diverged from the baseline at a common step.", registry=registry
        )
        self.first_step = Gauge(
            p + "first_divergent_step", "First step that diverged; -1 while none has.", registry=registry
        )
        self.common_steps = Gauge(
            p + "common_steps", "Steps both runs have completed and that were compared.", registry=registry
        )
        self.last_step = Gauge(p + "last_step", "Newest completed step of each run.", ["run"], registry=registry)
        self.difference = Gauge(
            p + "metric_difference",
            "Candidate minus baseline at the newest common step.",
            ["metric"],
            registry=registry,
        )
        self.tolerance = Gauge(
            p + "metric_tolerance",
            "Allowed absolute difference at the newest common step.",
            ["metric"],
            registry=registry,
        )
        self.divergent_steps = Gauge(
            p + "divergent_steps", "Common steps at which the metric diverged.", ["metric"], registry=registry
        )
        self.ks_p_value = Gauge(
            p + "reward_ks_p_value", "KS test p-value of the newest judged step's reward snapshots.", registry=registry
        )
        self.ks_statistic = Gauge(
            p + "reward_ks_statistic", "KS statistic of the newest judged step's reward snapshots.", registry=registry
        )
        self.first_step.set(-1)
        self.ks_p_value.set(math.nan)
        self.ks_statistic.set(math.nan)
        for run in ("baseline", "candidate"):
            self.last_step.labels(run).set(-1)

    def show(self, reading: ShadowReading) -> None:
        self.diverged.set(1 if reading.diverged else 0)
        self.first_step.set(reading.first_divergent_step)
        self.common_steps.set(reading.common_steps)
        self.last_step.labels("baseline").set(reading.last_step_baseline)
        self.last_step.labels("candidate").set(reading.last_step_candidate)
        for name, value in reading.difference.items():
            self.difference.labels(name).set(value)
            self.tolerance.labels(name).set(reading.tolerance[name])
        for name, count in reading.divergent_steps.items():
            self.divergent_steps.labels(name).set(count)
        self.ks_p_value.set(reading.ks_p_value)
        self.ks_statistic.set(reading.ks_statistic)
