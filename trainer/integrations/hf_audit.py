"""The audit trail and ``/metrics`` of :class:`trainer.integrations.hf.WardenCallback`.

- the samples of a step's ``reward.snapshot`` are chosen by :func:`warden.payloads.top_samples`,
  the one rule Warden's trainer uses too (non-finite rewards, TRL's None among them, left out).
- :class:`SampleBuffer`: what ``WardenCallback.record_samples`` gathered since the last
  optimizer step (several calls per step under gradient accumulation; indices continue).
- :class:`HFMetrics`: Warden's trainer's Prometheus families (:class:`trainer.metrics.TrainerMetrics`,
  the same names) fed from HF hooks, served by :class:`warden.httpserve.MetricsServer`.

Imports only prometheus_client and Warden's light modules (no torch, no transformers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.metrics import TrainerMetrics
from warden.errors import ConfigError
from warden.metric_names import HF_ALIASES, warden_aliases

MAX_TEXT_CHARS = 4000  # trainer.config.SnapshotConfig.max_text_chars (a test keeps them equal)
DEFAULT_TOP_K = 4  # trainer.config.SnapshotConfig.top_k

# Warden trainer name (as warden.metric_names.HF_ALIASES maps HF/TRL logs to it) -> the
# TrainerMetrics gauge that means it. Set from ``on_log`` when the logs carry the name
# (TRL's ``kl`` / ``objective/kl`` -> ``kl``, ...). ``reward_mean`` comes from the logs only
# while no samples were recorded (recorded samples are what the snapshot holds).
LOG_GAUGES: dict[str, str] = {
    "kl": "kl",
    "policy_loss": "policy_loss",
    "value_loss": "value_loss",
    "entropy": "entropy",
    "clip_fraction": "clip_fraction",
    "grad_norm": "grad_norm",
    "reward_mean": "reward_mean",
}


def _reward(value: Any) -> float:
    """``value`` as a float (tensors and numpy scalars through ``.item()``); ValueError if it is none."""
    item = getattr(value, "item", None)
    if callable(item):
        value = item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a reward must be a number, not {type(value).__name__}")
    return float(value)


@dataclass
class SampleBuffer:
    """The samples recorded since the last optimizer step."""

    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    def add(self, prompts: Iterable[Any], responses: Iterable[Any], rewards: Iterable[Any]) -> int:
        """Appends one batch (three equally long sequences); returns how many were added."""
        p, r, s = list(prompts), list(responses), [_reward(x) for x in rewards]
        if not len(p) == len(r) == len(s):
            raise ValueError(f"record_samples: {len(p)} prompts, {len(r)} responses and {len(s)} rewards")
        self.prompts.extend(_text(x) for x in p)
        self.responses.extend(_text(x) for x in r)
        self.rewards.extend(s)
        return len(s)

    def __len__(self) -> int:
        return len(self.rewards)

    def clear(self) -> None:
        self.prompts.clear()
        self.responses.clear()
        self.rewards.clear()

    def reward_stats(self) -> tuple[float, float] | None:
        """(mean, max) of the finite rewards; None when there are none."""
        finite = [x for x in self.rewards if math.isfinite(x)]
        return (sum(finite) / len(finite), max(finite)) if finite else None


def _text(value: Any) -> str:
    """A prompt or response as text: a string as is, a chat (list of ``{"content": ...}``) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):
        return "\n".join(str(m.get("content", "")) for m in value)
    return str(value)


class HFMetrics:
    """TrainerMetrics set from HF hooks, served on ``listen:port`` (``port`` 0: not served)."""

    def __init__(self, port: int = 0, listen: str = "127.0.0.1") -> None:
        self.metrics = TrainerMetrics()
        self.port, self.listen = port, listen
        self.server: Any = None
        self._samples_seen = False
        self._step_started: float | None = None

    def start(self, run_id: str | None, versions: Mapping[str, str]) -> None:
        """Sets ``warden_trainer_run_info`` and starts serving (once); a port that cannot be bound
        raises ConfigError, as ``run.metrics_port`` does for Warden's trainer."""
        self.metrics.info.info({"run_id": run_id or "", **versions})
        if not self.port or self.server is not None:
            return
        from warden.httpserve import MetricsServer

        try:
            self.server = MetricsServer(self.metrics.registry, self.listen, self.port).start()
        except OSError as exc:
            raise ConfigError(
                f"WardenCallback(metrics_port={self.port}): cannot listen ({exc.strerror}); "
                "pass another port or 0 to disable"
            ) from None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def served_port(self) -> int | None:
        """The port /metrics is served on, None when not served."""
        return int(self.server.port) if self.server is not None else None

    def step_begun(self) -> None:
        self._step_started = time.monotonic()

    def step_done(self, step: int, samples: SampleBuffer) -> None:
        mt = self.metrics
        mt.steps.inc()
        if self._step_started is not None:
            mt.step_duration.observe(time.monotonic() - self._step_started)
            self._step_started = None
        mt.last_step.set(step)
        mt.last_step_time.set(time.time())
        stats = samples.reward_stats()
        if stats is not None:
            self._samples_seen = True
            mt.reward_mean.set(stats[0])
            mt.reward_max.set(stats[1])

    def logged(self, logs: Mapping[str, Any]) -> None:
        for alias, value in warden_aliases(logs, HF_ALIASES).items():
            gauge = LOG_GAUGES.get(alias)
            if gauge is None or (alias == "reward_mean" and self._samples_seen):
                continue
            getattr(self.metrics, gauge).set(float(value))  # type: ignore[arg-type]

    def checkpoint_done(self, step: int) -> None:
        self.metrics.last_checkpoint_step.set(step)
        self.metrics.last_checkpoint_time.set(time.time())

    def oom(self, phase: str = "step") -> None:
        self.metrics.oom.labels(phase).inc()
