"""What the bridge has emitted so far, saved atomically in ``<state-dir>/verl.json``.

Exactly-once emission across restarts works in two halves:

- every event the bridge writes carries a *marker* in ``data["bridge"]`` saying which
  input item it stands for (a log line, a rollout step, a checkpoint);
- the state records the journal position it accounts for. On start the bridge reads the
  journal after that position and applies the markers it finds (:func:`apply_marker`),
  so an event written just before a crash, whose state save was lost, is not written a
  second time. The state is only a cache of the journal: deleting it makes the bridge
  rebuild it from the whole journal.

The journal is fsynced before the state is saved, so the state is never ahead of it.

Markers (``data["bridge"]``, all with ``"source": "verl"``):

==============  ================================================================
``kind``        fields
==============  ================================================================
``start``       (none): the ``run.started`` the bridge wrote for a new journal
``restart``     ``generation``: verl truncated its log; lines are read anew
``log``         ``generation``, ``start``, ``end``, ``sha256`` of the line
``rollout``     ``file``, ``sha256``: the dump ``{step}.jsonl`` behind a snapshot
``checkpoint``  ``tracker_mtime_ns``: the save that made the step complete (the tracker write, or verl's
                ``ckpt_contents.json`` for an ``async_save`` step)
==============  ================================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecars.bridge.errors import BridgeIncomplete
from warden.safeio import atomic_write_bytes

STATE_VERSION = 1
STATE_FILE = "verl.json"
MARKER_KEY = "bridge"
SOURCE = "verl"
MAX_REMEMBERED_CHECKPOINTS = 256


class StepSet:
    """A set of non-negative steps kept as sorted, disjoint, inclusive ranges."""

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        pairs = [[int(x) for x in pair] for pair in ranges]
        if any(len(p) != 2 or p[0] > p[1] for p in pairs):
            raise ValueError("step ranges must be [low, high] pairs with low <= high")
        self._ranges: list[list[int]] = _merge(pairs)

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and any(low <= step <= high for low, high in self._ranges)

    def add(self, step: int) -> None:
        self._ranges = _merge([*self._ranges, [step, step]])

    def ranges(self) -> list[list[int]]:
        return [list(r) for r in self._ranges]

    def __len__(self) -> int:
        return sum(high - low + 1 for low, high in self._ranges)


def _merge(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], high)
        else:
            out.append([low, high])
    return out


@dataclass
class LogPosition:
    """Where the bridge is in verl's file logger.

    ``generation`` rises each time the file is found truncated or replaced; ``offset`` is
    the byte after the last consumed line; ``line_start``/``line_sha256`` identify that
    line, so a file truncated and regrown past ``offset`` is still noticed; ``file_id``
    is (st_dev, st_ino) of the file; ``last_step`` the highest step read in this generation.
    """

    generation: int = 0
    offset: int = 0
    line_start: int | None = None
    line_sha256: str | None = None
    file_id: tuple[int, int] | None = None
    last_step: int | None = None

    def restart(self, generation: int) -> None:
        """Starts reading a new file (or a truncated one) from its first byte."""
        self.generation, self.offset, self.line_start, self.line_sha256 = generation, 0, None, None
        self.file_id = self.last_step = None


@dataclass
class BridgeState:
    """Everything the bridge remembers; see the module docstring."""

    run_id: str | None = None
    started: bool = False
    journal_offset: int = 0
    journal_seq: int = 0
    log: LogPosition = field(default_factory=LogPosition)
    rollouts: StepSet = field(default_factory=StepSet)
    checkpoints: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        log = self.log
        return {
            "version": STATE_VERSION,
            "run_id": self.run_id,
            "started": self.started,
            "journal": {"offset": self.journal_offset, "seq": self.journal_seq},
            "log": {
                "generation": log.generation,
                "offset": log.offset,
                "line_start": log.line_start,
                "line_sha256": log.line_sha256,
                "file_id": list(log.file_id) if log.file_id else None,
                "last_step": log.last_step,
            },
            "rollouts": self.rollouts.ranges(),
            "checkpoints": {str(k): v for k, v in sorted(self.checkpoints.items())},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BridgeState:
        """Raises KeyError, TypeError or ValueError on a malformed document."""
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"version {raw.get('version')!r} is not {STATE_VERSION}")
        log, journal = raw["log"], raw["journal"]
        file_id = log.get("file_id")
        return cls(
            run_id=raw.get("run_id"),
            started=bool(raw.get("started")),
            journal_offset=int(journal["offset"]),
            journal_seq=int(journal["seq"]),
            log=LogPosition(
                generation=int(log["generation"]),
                offset=int(log["offset"]),
                line_start=None if log.get("line_start") is None else int(log["line_start"]),
                line_sha256=log.get("line_sha256"),
                file_id=(int(file_id[0]), int(file_id[1])) if file_id else None,
                last_step=None if log.get("last_step") is None else int(log["last_step"]),
            ),
            rollouts=StepSet(raw.get("rollouts", [])),
            checkpoints={int(k): int(v) for k, v in raw.get("checkpoints", {}).items()},
        )

    def remember_checkpoint(self, step: int, tracker_mtime_ns: int) -> None:
        self.checkpoints[step] = tracker_mtime_ns
        while len(self.checkpoints) > MAX_REMEMBERED_CHECKPOINTS:
            del self.checkpoints[min(self.checkpoints)]


def marker(kind: str, **fields: Any) -> dict[str, Any]:
    """The ``data["bridge"]`` object of an event the bridge writes."""
    return {"source": SOURCE, "kind": kind, **fields}


def apply_marker(state: BridgeState, step: int | None, found: Any) -> bool:
    """Rolls ``state`` forward over one event the bridge wrote; False for a foreign event.

    Idempotent, and applying the markers of a journal in order rebuilds the state.
    """
    if not isinstance(found, Mapping) or found.get("source") != SOURCE:
        return False
    kind = found.get("kind")
    try:
        if kind == "start":
            state.started = True
        elif kind == "restart":
            generation = int(found["generation"])
            if generation > state.log.generation:
                state.log.restart(generation)
        elif kind == "log":
            _apply_log(state.log, step, found)
        elif kind == "rollout" and step is not None:
            state.rollouts.add(step)
        elif kind == "checkpoint" and step is not None:
            state.remember_checkpoint(step, int(found["tracker_mtime_ns"]))
        else:
            return False
    except (KeyError, TypeError, ValueError):
        return False
    return True


def _apply_log(log: LogPosition, step: int | None, found: Mapping[str, Any]) -> None:
    generation, end = int(found["generation"]), int(found["end"])
    if generation < log.generation or (generation == log.generation and end <= log.offset):
        return
    if generation > log.generation:
        log.restart(generation)
    log.offset, log.line_start, log.line_sha256 = end, int(found["start"]), str(found["sha256"])
    if step is not None:
        log.last_step = step if log.last_step is None else max(log.last_step, step)


class StateStore:
    """Loads and saves :class:`BridgeState` as JSON in ``<state_dir>/verl.json``."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)

    def load(self) -> BridgeState:
        """The saved state, or a fresh one. Raises BridgeIncomplete on an unreadable file."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                raw = json.load(fh)
        except FileNotFoundError:
            return BridgeState()
        except (OSError, ValueError) as exc:
            raise BridgeIncomplete(f"{self.path}: unreadable bridge state ({exc}); delete it to rebuild it") from exc
        try:
            return BridgeState.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise BridgeIncomplete(
                f"{self.path}: malformed bridge state ({exc}); delete it to rebuild it from the journal"
            ) from exc

    def save(self, state: BridgeState) -> None:
        """Writes the state atomically (temporary file, fsync, rename)."""
        os.makedirs(self.state_dir, exist_ok=True)
        payload = json.dumps(state.to_dict(), indent=1, sort_keys=True).encode("utf-8")
        try:
            atomic_write_bytes(self.path, payload)
        except OSError as exc:
            raise BridgeIncomplete(f"{self.path}: cannot save the bridge state ({exc.strerror})") from exc
