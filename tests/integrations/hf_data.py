"""A tiny causal-LM dataset for the HF Trainer tests (in-process and the torchrun worker)."""

from __future__ import annotations

from typing import Any


class TinyText:
    """A few short lines: input_ids = labels."""

    def __init__(self, tokenizer: Any, n: int = 16) -> None:
        lines = [f"the model learns to add {i} and {i + 1}" for i in range(n)]
        self.items = [tokenizer(line, truncation=True, max_length=16, padding="max_length") for line in lines]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.items[i]
        return {"input_ids": item["input_ids"], "attention_mask": item["attention_mask"], "labels": item["input_ids"]}
