"""Elastic runs under torchrun (``--nnodes=MIN:MAX --max-restarts=K --rdzv-backend=c10d``).

When a node is lost, the surviving workers' collectives fail, their agents restart them,
the c10d rendezvous re-forms with the survivors and every new worker starts afresh with
``--resume auto``: it loads the newest checkpoint that verifies and carries on with the
new world size (the config's global batch sizes stay; each rank's share is recomputed
from ``WORLD_SIZE``; the sampler's position is global, so no prompt is lost or repeated).

This module works out what ``run.resumed`` reports about that: the world size before and
after, the steps completed after the checkpoint and thrown away ("lost", trained again),
and torchrun's restart count. Pure, except :func:`read_step_history` (reads the journal).
docs/elastic.md has the operator's side.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warden import journal as ev

log = logging.getLogger("warden.trainer")

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


@dataclass(frozen=True)
class StepRecord:
    """One ``step.completed`` of the journal: its step and the world size that trained it (None: not recorded)."""

    step: int
    world_size: int | None


def restart_count(environ: Mapping[str, str]) -> int | None:
    """torchrun's restart count of this worker group (0 on the first start); None outside torchrun. Pure."""
    text = environ.get(RESTART_COUNT_ENV)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def lost_steps(history: Iterable[StepRecord], from_step: int) -> list[int]:
    """Steps completed after ``from_step`` (the checkpoint resumed from), ascending, each once. Pure.

    Their updates are not in the checkpoint: the resumed run trains them again.
    """
    return sorted({r.step for r in history if r.step > from_step})


def previous_world_size(history: list[StepRecord], checkpoint_world_size: int | None) -> int | None:
    """The world size that trained the newest journalled step, else the checkpoint writer's. Pure.

    The journal is preferred: a run may have changed size after its last checkpoint.
    """
    for record in reversed(history):
        if record.world_size is not None:
            return record.world_size
    return checkpoint_world_size


def resume_fields(
    history: list[StepRecord], from_step: int, checkpoint_world_size: int | None, world_size: int, restarts: int | None
) -> dict[str, Any]:
    """The elastic fields of ``run.resumed``. Pure.

    ``old_world_size`` (None when neither the journal nor the checkpoint knows it),
    ``new_world_size``, ``world_size_changed``, ``lost_steps`` (count) with
    ``lost_first_step`` / ``lost_last_step`` (None when nothing was lost), and
    ``restart_count`` (torchrun's, None outside torchrun).
    """
    old = previous_world_size(history, checkpoint_world_size)
    lost = lost_steps(history, from_step)
    return {
        "old_world_size": old,
        "new_world_size": world_size,
        "world_size_changed": old is not None and old != world_size,
        "lost_steps": len(lost),
        "lost_first_step": lost[0] if lost else None,
        "lost_last_step": lost[-1] if lost else None,
        "restart_count": restarts,
    }


def read_step_history(journal_path: str) -> list[StepRecord]:
    """Every ``step.completed`` of the run's journal, in journal order; [] when it cannot be read.

    Reads the whole journal once, at resume, on rank 0 only. A missing journal (a new run
    directory) is not an error: nothing was lost that this run can know of.
    """
    if not os.path.exists(journal_path):
        return []
    out: list[StepRecord] = []
    try:
        for event, _ in ev.JournalReader(journal_path).read_available():
            if event.type != ev.STEP_COMPLETED or event.step is None:
                continue
            size = event.data.get("world_size")
            out.append(StepRecord(event.step, size if isinstance(size, int) and not isinstance(size, bool) else None))
    except (OSError, ev.JournalError) as exc:
        log.warning("%s: cannot read the step history for run.resumed (%s)", journal_path, exc)
    return out
