"""Prompt data (JSONL or Parquet, verl's layout), prompt encoding, and a seeded sampler whose
position is checkpointed.

A prompt is a string, or chat messages (a list of ``{"role", "content"}``), which
:func:`encode_prompts` renders with the tokenizer's chat template (with the generation
prompt). A prompt longer than ``data.max_prompt_tokens`` is an error at start (exit 2,
naming the row; verl's default), or is cut on the ``left`` (keeps the end, where the
question usually is) or the ``right``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from warden.errors import ConfigError


@dataclass(frozen=True)
class PromptRow:
    prompt: str  # the text (chat messages flattened as ``role: content`` lines, for snapshots and rewards)
    ground_truth: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) of a chat-format prompt
    data_source: str = ""
    where: str = ""


def _prompt_text(value: Any, where: str) -> tuple[str, tuple[tuple[str, str], ...] | None]:
    """(text, chat messages or None) of a string prompt or a list of chat messages."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        messages = tuple((str(m.get("role", "user")), str(m["content"])) for m in value)
        return "\n".join(f"{role}: {content}" for role, content in messages), messages
    raise ConfigError(f"{where}: prompt must be a string or a list of chat messages, got {type(value).__name__}")


def _truth(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None and isinstance(row.get("reward_model"), dict):  # verl keeps it here
        value = row["reward_model"].get("ground_truth")
    return None if value is None else str(value)


def load_prompts(
    files: tuple[str, ...],
    prompt_key: str,
    truth_key: str,
    source_key: str = "data_source",
    key: str = "data.train_files",
) -> list[PromptRow]:
    """Reads every file in order. Raises ConfigError naming the file and line."""
    rows: list[PromptRow] = []
    for path in files:
        for where, row in _rows(path):
            if prompt_key not in row:
                raise ConfigError(f"{where}: no {prompt_key!r} column (data.prompt_key)")
            text, messages = _prompt_text(row[prompt_key], where)
            source = str(row.get(source_key) or "")
            rows.append(PromptRow(text, _truth(row, truth_key), messages, source, where))
    if not rows:
        raise ConfigError(f"{key}: no prompts in {', '.join(files)}")
    return rows


def render_chat(tokenizer: Any, messages: tuple[tuple[str, str], ...], where: str) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"{where}: a chat-format prompt, but the tokenizer has no chat template "
            "(model.tokenizer_path); give plain-text prompts or set data.apply_chat_template: false"
        )
    chat = [{"role": role, "content": content} for role, content in messages]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def truncate(ids: list[int], limit: int, policy: str, where: str) -> list[int]:
    """``ids`` cut to ``limit`` tokens by ``policy`` (error | left | right). Pure but for the error."""
    if len(ids) <= limit:
        return ids
    if policy == "left":
        return ids[-limit:]
    if policy == "right":
        return ids[:limit]
    raise ConfigError(
        f"{where}: the prompt has {len(ids)} tokens, over data.max_prompt_tokens ({limit}); raise it, "
        "or set data.truncation: left (keep the end) or right (keep the start)"
    )


def encode_prompts(
    rows: list[PromptRow], tokenizer: Any, limit: int, policy: str, chat_template: bool
) -> list[list[int]]:
    """Token ids of every row (chat rows through the template when ``chat_template``), truncated by ``policy``."""
    out = []
    for row in rows:
        if row.messages is not None and chat_template:
            ids = render_chat(tokenizer, row.messages, row.where)
        else:
            ids = list(tokenizer(row.prompt)["input_ids"])
        out.append(truncate(ids, limit, policy, row.where))
    return out


def left_pad(rows: list[list[int]], pad_id: int, length: int | None = None) -> tuple[Any, Any]:
    """``(ids, mask)`` int64 tensors ``(B, L)``, left-padded to ``length`` (default: the longest row)."""
    import torch

    width = max(len(r) for r in rows) if length is None else length
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


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


def batch_digest(index: Sequence[int]) -> str:
    """SHA-256 (first 16 hex digits) of a step's prompt indices in order: the audit of which prompts
    a step drew, comparable across runs and world sizes. Pure."""
    text = ",".join(str(int(i)) for i in index)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


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


def check_readable_files(files: tuple[str, ...], name: str = "data.train_files") -> None:
    for i, path in enumerate(files):
        key = f"{name}[{i}]"
        if not os.path.isabs(path):
            raise ConfigError(f"{key}: {path!r} must be an absolute path")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(f"{key}: {path} does not exist or is not a readable file")
