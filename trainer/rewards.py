"""Reward functions behind one interface: ``score(prompts, responses, truths) -> list[float]``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol


class RewardFunction(Protocol):
    def score(self, prompts: Sequence[str], responses: Sequence[str], truths: Sequence[str | None]) -> list[float]:
        """One reward per response; ``truths`` may hold None where a sample has none."""
        ...


def digit_fraction(text: str) -> float:
    """Share of non-space characters that are ASCII digits (0 for an empty response)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsReward:
    """Synthetic task: respond with digits. A 1M-parameter model learns it in tens of steps."""

    def score(self, prompts: Sequence[str], responses: Sequence[str], truths: Sequence[str | None]) -> list[float]:
        return [digit_fraction(r) for r in responses]


_LEADING_INT = re.compile(r"\s*(-?\d+)")


def exact_answer(response: str, truth: str | None) -> float:
    """1.0 when the response starts with the ground-truth integer, else 0.0."""
    if truth is None:
        return 0.0
    match = _LEADING_INT.match(response)
    return 1.0 if match and match.group(1) == truth.strip() else 0.0


class ArithmeticReward:
    """Exact match of the first integer of the response against the ground truth."""

    def score(self, prompts: Sequence[str], responses: Sequence[str], truths: Sequence[str | None]) -> list[float]:
        return [exact_answer(r, t) for r, t in zip(responses, truths, strict=True)]


class ModelReward:
    """A sequence-classification reward model from a local directory (logit 0 = reward)."""

    def __init__(self, path: str, tokenizer: Any, device: str = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=False, local_files_only=True, num_labels=1
        ).to(device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.device = device

    def score(self, prompts: Sequence[str], responses: Sequence[str], truths: Sequence[str | None]) -> list[float]:
        import torch

        texts = [p + r for p, r in zip(prompts, responses, strict=True)]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)
        with torch.no_grad():
            logits = self.model(**batch).logits
        return [float(x) for x in logits[:, 0]]


def build_reward(kind: str, rule: str, model_path: str = "", tokenizer: Any = None, device: str = "cpu") -> Any:
    if kind == "model":
        return ModelReward(model_path, tokenizer, device)
    return ArithmeticReward() if rule == "arithmetic" else DigitsReward()
