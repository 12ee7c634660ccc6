"""Prompt data (JSONL or Parquet, verl's layout) and a seeded sampler whose position is checkpointed."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from sidecars.errors import ConfigError


@dataclass(frozen=True)
class PromptRow:
    prompt: str
    ground_truth: str | None = None


def _prompt_text(value: Any, where: str) -> str:
    """A string prompt, or chat messages flattened as ``role: content`` lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    raise ConfigError(f"{where}: prompt must be a string or a list of chat messages, got {type(value).__name__}")


def _truth(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None and isinstance(row.get("reward_model"), dict):  # verl keeps it here
        value = row["reward_model"].get("ground_truth")
    return None if value is None else str(value)


def load_prompts(files: tuple[str, ...], prompt_key: str, truth_key: str) -> list[PromptRow]:
    """Reads every file in order. Raises ConfigError naming the file and line."""
    rows: list[PromptRow] = []
    for path in files:
        for where, row in _rows(path):
            if prompt_key not in row:
                raise ConfigError(f"{where}: no {prompt_key!r} column (data.prompt_key)")
            rows.append(PromptRow(_prompt_text(row[prompt_key], where), _truth(row, truth_key)))
    if not rows:
        raise ConfigError(f"data.train_files: no prompts in {', '.join(files)}")
    return rows


def _rows(path: str) -> list[tuple[str, dict[str, Any]]]:
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        return [(f"{path}: row {i + 1}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    out = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path}: line {number}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}: line {number}: expected a JSON object")
            out.append((f"{path}: line {number}", row))
    return out


class PromptSampler:
    """Yields batches of indices from a per-epoch permutation seeded by ``seed + epoch``.

    ``state()`` / ``load_state()`` make the position part of the checkpoint, so a
    resumed run sees exactly the prompts the straight run would have seen.
    """

    def __init__(self, size: int, batch: int, seed: int, shuffle: bool = True) -> None:
        self.size, self.batch, self.seed, self.shuffle = size, batch, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        import random

        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch:
            if self.index >= self.size:
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(self.batch - len(out), self.size - self.index)
            out.extend(self._order[self.index : self.index + take])
            self.index += take
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": self.size}

    def load_state(self, state: dict[str, int]) -> None:
        if state.get("size") != self.size:
            raise ConfigError(f"data position was saved for {state.get('size')} prompts, the data has {self.size}")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation()


def check_readable_files(files: tuple[str, ...]) -> None:
    for i, path in enumerate(files):
        key = f"data.train_files[{i}]"
        if not os.path.isabs(path):
            raise ConfigError(f"{key}: {path!r} must be an absolute path")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(f"{key}: {path} does not exist or is not a readable file")
