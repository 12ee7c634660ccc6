"""Pure helpers that turn a run's journal into the demo's summary text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, STEP_COMPLETED, Event


def ascii_chart(values: Sequence[float], height: int = 8, width: int = 60, label: str = "") -> list[str]:
    """A text chart of ``values``, stretched or sampled to ``width`` columns, y axis labelled."""
    if not values:
        return ["(no data)"]
    n = len(values)
    cols = [values[min(n - 1, int(i * n / width))] for i in range(width)]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    rows = []
    for r in range(height, 0, -1):
        threshold = lo + span * (r - 1) / height
        line = "".join("█" if v >= threshold else " " for v in cols)
        axis = f"{hi:6.2f} |" if r == height else (f"{lo:6.2f} |" if r == 1 else "       |")
        rows.append(axis + line)
    rows.append("       +" + "-" * width)
    left, right = "step 1", f"step {n}"
    rows.append(
        "        " + left + " " * max(1, width - len(left) - len(right)) + right + (f"   {label}" if label else "")
    )
    return rows


@dataclass
class RunFacts:
    """What the journal says about a run."""

    run_id: str = ""
    rewards: list[float] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    snapshot_steps: list[int] = field(default_factory=list)
    last_step: int = 0
    status: str = "unknown"
    kl: float = 0.0
    tokens_per_second: float = 0.0


def facts_from_events(events: Sequence[Event]) -> RunFacts:
    facts = RunFacts()
    for e in events:
        facts.run_id = e.run_id
        if e.type == STEP_COMPLETED:
            facts.rewards.append(float(e.data.get("reward_mean", 0.0)))
            facts.kl = float(e.data.get("kl", 0.0))
            facts.tokens_per_second = float(e.data.get("tokens_per_second", 0.0))
            facts.last_step = e.step or facts.last_step
        elif e.type == CHECKPOINT_SAVED:
            facts.checkpoints.append(str(e.data.get("path", "")))
        elif e.type == REWARD_SNAPSHOT and e.step is not None:
            facts.snapshot_steps.append(e.step)
        elif e.type == "run.finished":
            facts.status = str(e.data.get("status", "unknown"))
    return facts
