"""Rollout engines behind one interface; HF ``generate`` here, vLLM in its own module.

``generate(prompt_ids (B, P) left-padded, prompt_mask (B, P), plan) -> responses (B, T)``
right-padded with ``pad_id`` after the first stop token (which is kept), where
``T = max_new_tokens``; and ``response_mask (B, T)`` (1 up to and including the stop token).
``sync_weights(actor)`` is called after every PPO update; :func:`build_rollout` picks
the engine that ``rollout.engine`` names (``vllm`` is imported only then).

Sampling in the HF engine is seeded per step and independent of how the batch is split:
:class:`SeededSampling` applies temperature, top-k and top-p to the logits and adds Gumbel
noise drawn for the *whole* global batch from a generator seeded by the step
(:class:`SamplingPlan`), keeping this rank's rows, and ``generate`` takes the argmax
(Gumbel-max = a sample from the filtered softmax). So a row's response depends only on its
prompt, the seed and its global row index: two ranks that each generate half the batch get
the responses one process would.

On CUDA (``rollout.static_cache`` auto/on) sampling runs Warden's own decode loop
(:mod:`trainer.decode`: a static KV cache, each token step replayed from a CUDA graph, the same
:class:`SeededSampling` on the same logits) instead of ``generate``; prompts are padded to
``data.max_prompt_tokens`` so the shapes never change. A failure of that path falls back to
``generate`` with the dynamic cache, with a log line. With a
low-precision ``model.dtype`` the engine samples from its own copy of the actor in that
dtype (the trained actor keeps float32 master weights), refreshed in place after each update.
"""

from __future__ import annotations

import copy
import gc
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainer.config import RolloutConfig, TrainerConfig

log = logging.getLogger("warden.trainer")


@dataclass(frozen=True)
class SamplingPlan:
    """One rollout call's randomness: ``seed`` for the whole global batch of ``total`` rows, of
    which this call generates rows ``offset .. offset + B``. ``temperature`` 0: greedy."""

    seed: int
    offset: int = 0
    total: int = 0  # 0: the local batch is the whole batch
    temperature: float = 1.0


class RolloutEngine(Protocol):
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, plan: SamplingPlan | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def sync_weights(self, actor: Any) -> None:
        """Loads the actor's current weights (no-op for engines that share the module)."""
        ...


def response_mask_from(responses: torch.Tensor, stop_ids: int | Sequence[int]) -> torch.Tensor:
    """``(B, T)`` int mask: 1 up to and including the first stop token, 0 after it."""
    ids = [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
    is_stop = torch.isin(responses, torch.tensor(ids, dtype=responses.dtype, device=responses.device)).int()
    after_stop = (torch.cumsum(is_stop, dim=1) - is_stop) > 0
    return (~after_stop).int()


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering: removed entries become ``-inf``; at least one stays. Pure."""
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = torch.where(logits < kth, neg_inf, logits)
    if top_p < 1.0:
        ordered, index = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above
        drop_sorted = before > top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, index, drop_sorted)
        logits = torch.where(drop, neg_inf, logits)
    return logits


def gumbel_noise(
    generator: torch.Generator, total: int, offset: int, rows: int, vocab: int, device: Any
) -> torch.Tensor:
    """``(rows, vocab)`` Gumbel(0, 1) noise: rows ``offset..offset+rows`` of one ``(total, vocab)`` draw."""
    # -log(E) with E ~ Exp(1) is Gumbel(0, 1): one draw kernel and one log over the whole batch
    exponential = torch.empty((total, vocab), device=device, dtype=torch.float32).exponential_(generator=generator)
    return -torch.log(exponential[offset : offset + rows])


class SeededSampling:
    """A transformers logits processor: filtered, tempered logits plus seeded Gumbel noise (see module doc)."""

    def __init__(self, plan: SamplingPlan, top_k: int, top_p: float, rows: int, device: Any) -> None:
        self.plan, self.top_k, self.top_p, self.rows = plan, top_k, top_p, rows
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(plan.seed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.plan.temperature == 0:
            return scores.float()
        logits = filter_logits(scores.float() / self.plan.temperature, self.top_k, self.top_p)
        total = self.plan.total or self.rows
        noise = gumbel_noise(self.generator, total, self.plan.offset, scores.shape[0], scores.shape[-1], scores.device)
        return logits + noise


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


def use_static_cache(cfg: RolloutConfig, device: torch.device) -> bool:
    """The static-cache compiled path: on CUDA unless ``rollout.static_cache`` is off."""
    return cfg.static_cache != "off" and device.type == "cuda"


class HFRollout:
    """Sampling with ``model.generate``: on the actor itself (float32), or on a low-precision copy."""

    def __init__(
        self,
        actor: Any,
        cfg: RolloutConfig,
        stop_ids: Sequence[int],
        pad_id: int,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.cfg, self.stop_ids, self.pad_id = cfg, tuple(stop_ids), pad_id
        self.dtype = dtype
        self.model = self._copy(actor) if dtype is not None else actor
        device = next(actor.parameters()).device
        self.static = use_static_cache(cfg, device)
        self.static_failed = False  # the caller pads prompts to data.max_prompt_tokens while static
        self.decoder: Any = None  # trainer.decode.StaticDecoder, made on the first static rollout

    def _copy(self, actor: Any) -> Any:
        model = copy.deepcopy(actor).to(self.dtype).eval()
        model.requires_grad_(False)
        return model

    @torch.no_grad()
    def sync_weights(self, actor: Any) -> None:
        if self.dtype is None:
            self.model = actor
            return
        for mine, theirs in zip(self.model.parameters(), actor.parameters(), strict=True):
            mine.copy_(theirs)  # in place: a compiled forward keeps its graphs

    def _kwargs(self, plan: SamplingPlan, rows: int, device: Any) -> dict[str, Any]:
        from transformers import LogitsProcessorList

        return {
            "do_sample": False,  # the argmax of SeededSampling's perturbed logits is the sample
            "logits_processor": LogitsProcessorList(
                [SeededSampling(plan, self.cfg.top_k, self.cfg.top_p, rows, device)]
            ),
            "max_new_tokens": self.cfg.max_new_tokens,
            "min_new_tokens": 0,
            "eos_token_id": list(self.stop_ids),
            "pad_token_id": self.pad_id,
            "temperature": None,
            "top_p": None,
            "top_k": None,
        }

    def _decode(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """``(B, P + T)`` prompts and responses from :class:`~trainer.decode.StaticDecoder`, as ``generate`` gives."""
        from trainer.decode import StaticDecoder

        if self.decoder is None:
            cuda = prompt_ids.device.type == "cuda"
            self.decoder = StaticDecoder(
                self.model, self.cfg.max_new_tokens, self.stop_ids, self.pad_id, graphs=cuda, compiled=cuda
            )
        [sampling] = kwargs["logits_processor"]
        responses = self.decoder.generate(prompt_ids, prompt_mask, lambda logits: sampling(None, logits))
        return torch.cat([prompt_ids, responses.to(prompt_ids.dtype)], dim=1)

    def _generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        from transformers import StoppingCriteriaList

        progress = _Progress(self.cfg.max_new_tokens, self.cfg.progress)
        if progress.enabled:
            kwargs = {**kwargs, "stopping_criteria": StoppingCriteriaList([progress])}
        # No cyclic garbage is made while decoding, but a collection of the whole heap (models,
        # compiled graphs) can land inside it: hundreds of milliseconds at a time on a GPU step.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if self.static and not self.static_failed:
                try:
                    return self._decode(prompt_ids, prompt_mask, kwargs)
                except Exception as exc:  # any failure of the graph path: the dynamic cache still works
                    self.static_failed = True
                    self.decoder = None
                    log.warning(
                        "static-cache rollout failed (%s: %s); falling back to the dynamic cache",
                        type(exc).__name__,
                        str(exc)[:300],
                    )
            return self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
        finally:
            if collecting:
                gc.enable()
            progress.close()

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, plan: SamplingPlan | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = plan or SamplingPlan(seed=int(torch.randint(0, 2**62, (1,))), temperature=self.cfg.temperature)
        out = self._generate(prompt_ids, prompt_mask, self._kwargs(plan, prompt_ids.shape[0], prompt_ids.device))
        responses = out[:, prompt_ids.shape[1] :]
        width = self.cfg.max_new_tokens
        if responses.shape[1] < width:
            pad = torch.full((responses.shape[0], width - responses.shape[1]), self.pad_id, dtype=responses.dtype)
            responses = torch.cat([responses, pad.to(responses.device)], dim=1)
        mask = response_mask_from(responses, self.stop_ids)
        responses = torch.where(mask.bool(), responses, torch.full_like(responses, self.pad_id))
        return responses, mask


def build_rollout(
    cfg: TrainerConfig,
    actor: Any,
    model_dir: str,
    stop_ids: Sequence[int],
    pad_id: int,
    dtype: torch.dtype | None = None,
) -> RolloutEngine:
    """The engine ``cfg.rollout.engine`` names, sampling from ``actor`` (loaded from ``model_dir``);
    ``dtype`` set: the HF engine samples from a copy of the actor in that dtype."""
    if cfg.rollout.engine == "vllm":
        from trainer.rollout_vllm import VLLMRollout

        return VLLMRollout(actor, cfg, model_dir, list(stop_ids), pad_id)
    return HFRollout(actor, cfg.rollout, stop_ids, pad_id, dtype)
