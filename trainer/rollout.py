"""Rollout engines behind one interface; HF ``generate`` here, vLLM in its own module.

``generate(prompt_ids (B, P) left-padded, prompt_mask (B, P)) -> responses (B, T)``
right-padded with ``pad_id`` after the first EOS (which is kept), where
``T = max_new_tokens``; and ``response_mask (B, T)`` (1 up to and including EOS).
``sync_weights(actor)`` is called after every PPO update; :func:`build_rollout` picks
the engine that ``rollout.engine`` names (``vllm`` is imported only then).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

import torch

from trainer.config import RolloutConfig, TrainerConfig


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def sync_weights(self, actor: Any) -> None:
        """Loads the actor's current weights (no-op for engines that share the module)."""
        ...


def response_mask_from(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """``(B, T)`` int mask: 1 up to and including the first ``eos_id``, 0 after it."""
    is_eos = (responses == eos_id).int()
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0
    return (~after_eos).int()


class _Progress:
    """A transformers stopping criterion that draws ``generating k/T`` on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.count, self.enabled = total, 0, enabled and sys.stderr.isatty()
        self.start = time.monotonic()

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.count += 1
        if self.enabled and time.monotonic() - self.start > 1.0:
            done = int(20 * self.count / self.total)
            sys.stderr.write(f"\r  generating [{'#' * done}{'.' * (20 - done)}] {self.count}/{self.total} tokens")
            sys.stderr.flush()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def close(self) -> None:
        if self.enabled and time.monotonic() - self.start > 1.0:
            sys.stderr.write("\r" + " " * 60 + "\r")


class HFRollout:
    """Sampling with ``model.generate`` on the actor module itself (weights always current)."""

    def __init__(self, actor: Any, cfg: RolloutConfig, eos_id: int, pad_id: int) -> None:
        self.actor, self.cfg, self.eos_id, self.pad_id = actor, cfg, eos_id, pad_id

    def sync_weights(self, actor: Any) -> None:
        self.actor = actor

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers import StoppingCriteriaList

        progress = _Progress(self.cfg.max_new_tokens, self.cfg.progress)
        try:
            out = self.actor.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                top_k=self.cfg.top_k or None,
                max_new_tokens=self.cfg.max_new_tokens,
                min_new_tokens=0,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
                stopping_criteria=StoppingCriteriaList([progress]),
            )
        finally:
            progress.close()
        responses = out[:, prompt_ids.shape[1] :]
        width = self.cfg.max_new_tokens
        if responses.shape[1] < width:
            pad = torch.full((responses.shape[0], width - responses.shape[1]), self.pad_id, dtype=responses.dtype)
            responses = torch.cat([responses, pad.to(responses.device)], dim=1)
        mask = response_mask_from(responses, self.eos_id)
        responses = torch.where(mask.bool(), responses, torch.full_like(responses, self.pad_id))
        return responses, mask


def build_rollout(cfg: TrainerConfig, actor: Any, model_dir: str, eos_id: int, pad_id: int) -> RolloutEngine:
    """The engine ``cfg.rollout.engine`` names, sampling from ``actor`` (loaded from ``model_dir``)."""
    if cfg.rollout.engine == "vllm":
        from trainer.rollout_vllm import VLLMRollout

        return VLLMRollout(actor, cfg, model_dir, eos_id, pad_id)
    return HFRollout(actor, cfg.rollout, eos_id, pad_id)
