"""Reward functions behind one interface: ``score(prompts, responses, truths) -> list[float]``.

:func:`build_reward` makes the run's reward from ``reward``: one built-in (``kind``/``rule``),
or the weighted sum of several ``functions``: ``digits``, ``arithmetic``, ``model`` (a
sequence classifier with its own tokenizer, loaded through the tokenizer guard) and
``module:function`` from the run's own code directory (``reward.code_dir``). A user function
is loaded by file path from that directory only (never ``sys.path``, never the model, tokenizer
or data directories, never a file others can write) and called as verl calls
``compute_score(data_source, solution_str, ground_truth, extra_info)``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from warden.errors import ConfigError


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
    """A sequence-classification reward model from a local directory (logit 0 = reward).

    ``tokenizer`` is the reward model's own: texts are decoded by the policy's tokenizer and
    re-encoded with this one, so the two vocabularies may differ.
    """

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
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        batch = self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)
        with torch.no_grad():
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return [float(x) for x in logits[:, 0]]


class CustomReward:
    """A user function ``f(data_source, solution_str, ground_truth, extra_info) -> float``, per sample."""

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self.name, self.function = name, function

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        truths: Sequence[str | None],
        sources: Sequence[str] | None = None,
    ) -> list[float]:
        sources = sources or [""] * len(prompts)
        out = []
        for prompt, response, truth, source in zip(prompts, responses, truths, sources, strict=True):
            value = self.function(
                data_source=source, solution_str=response, ground_truth=truth, extra_info={"prompt": prompt}
            )
            if isinstance(value, dict):  # verl allows {"score": x, ...}
                value = value.get("score")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise RewardError(f"reward function {self.name} returned {value!r}, not a finite number")
            out.append(float(value))
        return out


class RewardError(ConfigError):
    """A reward function cannot be loaded or returned something that is not a finite number."""


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def module_file(code_dir: str, module: str) -> str:
    """``code_dir/a/b.py`` for module ``a.b``: a regular file below ``code_dir`` (no link leaving it). Pure
    but for the file system look-ups; raises RewardError."""
    path = os.path.join(code_dir, *module.split(".")) + ".py"
    if not _inside(path, code_dir):
        raise RewardError(f"reward.functions: {module}: resolves outside reward.code_dir {code_dir}")
    try:
        st = os.stat(path)
    except OSError:
        raise RewardError(f"reward.functions: {module}: no file {path} in reward.code_dir") from None
    if not stat.S_ISREG(st.st_mode):
        raise RewardError(f"reward.functions: {module}: {path} is not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RewardError(f"reward.functions: {module}: {path} is writable by group or others; chmod go-w it")
    return path


def check_code_dir(code_dir: str, forbidden: Sequence[tuple[str, str]]) -> None:
    """``code_dir`` must not be, contain or lie inside a model, tokenizer or data directory."""
    for key, other in forbidden:
        if other and (_inside(code_dir, other) or _inside(other, code_dir)):
            raise RewardError(
                f"reward.code_dir: {code_dir} overlaps {key} ({other}); reward code is loaded only from the "
                "run's own code directory, never from a model, tokenizer or data directory"
            )


def load_function(code_dir: str, name: str) -> Callable[..., Any]:
    """The function ``name`` (``module:function``) from a file below ``code_dir``."""
    module, _, func = name.partition(":")
    path = module_file(code_dir, module)
    spec = importlib.util.spec_from_file_location(f"warden_reward_{module.replace('.', '_')}", path)
    if spec is None or spec.loader is None:
        raise RewardError(f"reward.functions: {name}: cannot load {path}")
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except Exception as exc:
        raise RewardError(f"reward.functions: {name}: importing {path} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(loaded, func, None)
    if not callable(function):
        raise RewardError(f"reward.functions: {name}: {path} defines no function {func!r}")
    return function


@dataclass
class WeightedReward:
    """``sum_i weight_i * f_i``; ``last_parts`` keeps each function's scores of the last call."""

    parts: list[tuple[str, float, Any]]

    def __post_init__(self) -> None:
        self.last_parts: dict[str, list[float]] = {}

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        truths: Sequence[str | None],
        sources: Sequence[str] | None = None,
    ) -> list[float]:
        total = [0.0] * len(responses)
        self.last_parts = {}
        for name, weight, function in self.parts:
            if isinstance(function, CustomReward):
                values = function.score(prompts, responses, truths, sources)
            else:
                values = function.score(prompts, responses, truths)
            self.last_parts[name] = values
            total = [t + weight * v for t, v in zip(total, values, strict=True)]
        return total


@dataclass(frozen=True)
class RewardSources:
    """What a reward needs from outside its config: paths and the reward model's tokenizer loader."""

    code_dir: str = ""
    reward_model: str = ""
    forbidden: tuple[tuple[str, str], ...] = ()
    load_tokenizer: Callable[[str], Any] | None = None
    device: str = "cpu"


def _one(name: str, rew: Any, src: RewardSources) -> Any:
    if name == "digits":
        return DigitsReward()
    if name == "arithmetic":
        return ArithmeticReward()
    if name == "model":
        if src.load_tokenizer is None:
            raise RewardError("reward.functions.model: no tokenizer loader")
        tokenizer = src.load_tokenizer(rew.model_tokenizer_path or src.reward_model)
        return ModelReward(src.reward_model, tokenizer, src.device)
    check_code_dir(src.code_dir, src.forbidden)
    return CustomReward(name, load_function(src.code_dir, name))


def build_reward(rew: Any, src: RewardSources) -> WeightedReward:
    """The run's reward from its ``RewardConfig`` (see the module doc)."""
    functions = dict(rew.functions) or {("model" if rew.kind == "model" else rew.rule): 1.0}
    return WeightedReward([(name, float(weight), _one(name, rew, src)) for name, weight in functions.items()])
