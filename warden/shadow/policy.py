"""Schema of policies/shadow.yaml (also the policy of ``warden compare``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tolerance:
    """A value pair agrees when ``|a - b| <= absolute + relative * max(|a|, |b|)``."""

    absolute: float = 0.0
    relative: float = 0.0

    def __post_init__(self) -> None:
        for name in ("absolute", "relative"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class RewardTest:
    """Two-sample Kolmogorov-Smirnov test of the reward snapshots' rewards at each step.

    A step diverges when ``p < p_value_min``; steps where either run has fewer than
    ``min_samples`` rewards are shown but not judged.
    """

    p_value_min: float = 0.01
    min_samples: int = 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_value_min < 1.0:
            raise ValueError(f"p_value_min: must be in [0, 1), got {self.p_value_min}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples: must be >= 1, got {self.min_samples}")


DEFAULT_METRICS: Mapping[str, Tolerance] = {
    "reward_mean": Tolerance(absolute=0.05, relative=0.05),
    "reward_max": Tolerance(absolute=0.05, relative=0.05),
    "kl": Tolerance(absolute=0.01, relative=0.1),
    "policy_loss": Tolerance(absolute=0.05, relative=0.1),
    "entropy": Tolerance(absolute=0.05, relative=0.05),
}


@dataclass(frozen=True)
class ShadowPolicy:
    """``baseline``/``candidate``: journals (or run directories) the sidecar follows; relative
    paths resolve against the policy file, an empty candidate means ``--run-dir``."""

    baseline: str | None = None
    candidate: str | None = None
    metrics: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_METRICS))
    rewards: RewardTest = field(default_factory=RewardTest)
    check_interval_seconds: float = 15.0

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("metrics: name at least one metric with its tolerance")
        if self.check_interval_seconds <= 0:
            raise ValueError("check_interval_seconds: must be > 0")
