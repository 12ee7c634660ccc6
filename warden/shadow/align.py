"""Journal events -> per-step series under the Warden trainer's metric names. Pure, no I/O.

Journals are written by other processes (the trainer, the verl bridge, the HF callback), so
every value is checked: only finite numbers are kept, steps must be non-negative integers, a
snapshot's rewards are taken only from well-formed samples and capped in number. A step that
appears twice (a resumed run trains it again) keeps its last value, as the run's state does.

Names: the trainer writes its own names (``reward_mean``) and verl's (``actor/pg_loss``); the
bridge writes verl's names mapped to Prometheus form (``actor_pg_loss``) plus the aliases of
:data:`warden.metric_names.VERL_ALIASES`. :func:`canonical_metrics` resolves all of them to
the Warden name through that one table, so a verl run and a Warden run meet on ``reward_mean``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from warden.journal import REWARD_SNAPSHOT, STEP_COMPLETED, Event
from warden.metric_names import HF_ALIASES, VERL_ALIASES, finite_number, prometheus_name

MAX_REWARDS_PER_STEP = 10_000
MAX_STEPS = 1_000_000


def _alias_sources() -> dict[str, tuple[str, ...]]:
    """Warden name -> every other name a journal may use for it (first present wins)."""
    out: dict[str, list[str]] = {}
    for table in (VERL_ALIASES, HF_ALIASES):
        for alias, sources in table.items():
            names = out.setdefault(alias, [])
            for source in sources:
                for name in (source, prometheus_name(source)):
                    if name != alias and name not in names:
                        names.append(name)
    return {alias: tuple(names) for alias, names in out.items()}


ALIAS_SOURCES: Mapping[str, tuple[str, ...]] = _alias_sources()


def canonical_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of one ``step.completed`` payload, with the aliased names filled in.

    A name the payload carries itself wins over an alias; nested objects (``timings``) are skipped.
    """
    values = {str(k): n for k, v in data.items() if (n := finite_number(v)) is not None}
    for alias, sources in ALIAS_SOURCES.items():
        if alias in values:
            continue
        for source in sources:
            if source in values:
                values[alias] = values[source]
                break
    return values


def snapshot_rewards(data: Mapping[str, object]) -> list[float]:
    """The finite rewards of a ``reward.snapshot`` payload's samples (malformed samples skipped)."""
    samples = data.get("samples")
    if not isinstance(samples, list):
        return []
    rewards = []
    for sample in samples[:MAX_REWARDS_PER_STEP]:
        if isinstance(sample, dict) and (reward := finite_number(sample.get("reward"))) is not None:
            rewards.append(reward)
    return rewards


@dataclass
class RunSeries:
    """One run as seen so far: metrics and snapshot rewards by step."""

    run_id: str = ""
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    rewards: dict[int, list[float]] = field(default_factory=dict)
    skipped: int = 0  # events of a useful type that were ignored (bad step, too many steps)

    def add(self, event: Event) -> None:
        """Folds one event in (other types are ignored)."""
        if event.type not in (STEP_COMPLETED, REWARD_SNAPSHOT):
            return
        step = event.step
        if step is None or step < 0 or (step not in self.metrics and len(self.metrics) >= MAX_STEPS):
            self.skipped += 1
            return
        if not self.run_id:
            self.run_id = event.run_id
        if event.type == STEP_COMPLETED:
            self.metrics[step] = canonical_metrics(event.data)
        else:
            self.rewards[step] = snapshot_rewards(event.data)


def series_from(events: Iterable[Event]) -> RunSeries:
    """A :class:`RunSeries` of ``events``."""
    series = RunSeries()
    for event in events:
        series.add(event)
    return series
