"""One PPO iteration on models: experience making and the clipped update.

Experience: each data-parallel rank computes the log-probs (and values) of its share of
the rollout rows, and the shares are gathered, so every rank holds the whole batch for the
advantages (GRPO groups span ranks). The update is data-parallel: each rank takes its share
of every minibatch and losses are normalised by the *global* minibatch denominators, so
the summed gradient equals the single-process gradient.

Mixed precision: the trained models keep float32 master weights and AdamW state; forward
passes run under ``torch.autocast`` in the configured dtype (:class:`Precision`). An
optimizer step whose gradients are not finite is skipped (counted in the statistics);
float16 uses a gradient scaler.

GRPO has no critic: ``critic`` is None, no values are computed and no value loss is taken.
With ``algorithm.use_kl_in_reward`` the KL penalty is in the token rewards, and GRPO's
sequence score is their sum (as verl's GRPO reads ``token_level_rewards``), so the KL
coefficient reaches the advantages of either estimator; ``ppo.use_kl_loss`` adds
``kl_loss_coef x KL`` to the actor's loss instead (verl's ``use_kl_loss``).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from trainer import ppo
from trainer.config import AlgorithmConfig, PPOConfig
from trainer.distributed import DistInfo, all_gather_rows, all_reduce_sum, rank_slice

SINGLE = DistInfo()


@dataclass(frozen=True)
class Precision:
    """Where and in what dtype forward passes compute; the weights stay float32."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None  # None: float32, no autocast

    def autocast(self) -> AbstractContextManager[Any]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    @property
    def needs_scaler(self) -> bool:
        return self.dtype == torch.float16


@dataclass
class Experience:
    """All tensors have B rows (responses); T = response length, P = prompt length."""

    sequences: torch.Tensor  # (B, P+T) prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # (B, P+T)
    position_ids: torch.Tensor  # (B, P+T)
    responses: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) int
    old_logprob: torch.Tensor  # (B, T)
    ref_logprob: torch.Tensor  # (B, T)
    values: torch.Tensor | None  # (B, T); None without a critic (GRPO)
    advantages: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T)
    scores: torch.Tensor  # (B,)
    mean_kl: float

    @property
    def prompt_len(self) -> int:
        return self.sequences.shape[1] - self.responses.shape[1]


def position_ids_from(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(
    model: Any, seq: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, prompt_len: int, temperature: float
) -> torch.Tensor:
    """``(B, T, V)`` float32 logits that predict each response token."""
    logits = model(input_ids=seq, attention_mask=attn, position_ids=pos).logits
    return logits[:, prompt_len - 1 : -1].float() / temperature


@torch.no_grad()
def batched_logprobs(
    model: Any,
    exp_seq: torch.Tensor,
    attn: torch.Tensor,
    pos: torch.Tensor,
    responses: torch.Tensor,
    prompt_len: int,
    temperature: float,
    micro: int,
    precision: Precision = Precision(),
) -> torch.Tensor:
    out = []
    for i in range(0, exp_seq.shape[0], micro):
        sl = slice(i, i + micro)
        with precision.autocast():
            logits = response_logits(model, exp_seq[sl], attn[sl], pos[sl], prompt_len, temperature)
        out.append(ppo.logprobs_from_logits(logits, responses[sl]))
    return torch.cat(out)


@torch.no_grad()
def batched_values(
    critic: Any,
    seq: torch.Tensor,
    attn: torch.Tensor,
    pos: torch.Tensor,
    prompt_len: int,
    micro: int,
    precision: Precision = Precision(),
) -> torch.Tensor:
    out = []
    for i in range(0, seq.shape[0], micro):
        with precision.autocast():
            out.append(critic(seq[i : i + micro], attn[i : i + micro], pos[i : i + micro]).float())
    return torch.cat(out)[:, prompt_len - 1 : -1]


def sequence_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` sum of the token rewards over valid tokens: the score minus the summed KL penalty."""
    return ppo.masked_sum(token_rewards, response_mask, dim=-1)


def make_experience(
    actor: Any,
    ref: Any,
    critic: Any | None,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    alg: AlgorithmConfig,
    kl_coef: float,
    temperature: float,
    micro: int,
    precision: Precision = Precision(),
    info: DistInfo = SINGLE,
) -> Experience:
    """Log-probs, values, KL-penalised token rewards and advantages for one rollout (all rows).

    Each rank computes its share of the rows; the shares are gathered.
    """
    seq = torch.cat([prompt_ids, responses], dim=1)
    attn = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    pos = position_ids_from(attn)
    p_len = prompt_ids.shape[1]
    mine = rank_slice(seq.shape[0], info)
    args = (seq[mine], attn[mine], pos[mine])
    old_lp = all_gather_rows(
        batched_logprobs(actor, *args, responses[mine], p_len, temperature, micro, precision), info
    )
    ref_lp = all_gather_rows(batched_logprobs(ref, *args, responses[mine], p_len, temperature, micro, precision), info)
    values = None
    if critic is not None:
        values = all_gather_rows(batched_values(critic, *args, p_len, micro, precision), info) * response_mask
    last = response_mask.sum(dim=1).clamp(min=1) - 1
    token_scores = torch.zeros_like(old_lp)
    token_scores[torch.arange(len(scores)), last] = scores.to(token_scores.dtype)
    coef = kl_coef if alg.use_kl_in_reward else 0.0
    token_rewards, mean_kl = ppo.apply_kl_penalty(token_scores, old_lp, ref_lp, response_mask, coef, alg.kl_kind)
    if alg.adv_estimator == "grpo":
        adv, ret = ppo.compute_grpo_advantage(sequence_rewards(token_rewards, response_mask), group_ids, response_mask)
    else:
        if values is None:
            raise ValueError("gae needs a critic")
        adv, ret = ppo.compute_gae(
            token_rewards, values, response_mask, alg.gamma, alg.lam, whiten=alg.whiten_advantages
        )
    return Experience(
        seq, attn, pos, responses, response_mask, old_lp, ref_lp, values, adv, ret, scores, float(mean_kl)
    )


def _denominator(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What ``mode`` divides by: valid tokens, or sequences with at least one token."""
    if mode == "token-mean":
        return mask.sum().double()
    return (mask.sum(dim=1) > 0).sum().double()


STAT_KEYS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "vf_clip_fraction",
    "kl_loss",
    "clip_fraction_lower",
)


@dataclass
class Trainables:
    """The trained models, their optimizers and (float16) the gradient scaler; critic None for GRPO."""

    actor: Any
    actor_opt: Any
    critic: Any | None = None
    critic_opt: Any | None = None
    scaler: Any | None = None

    def zero_grad(self) -> None:
        self.actor_opt.zero_grad(set_to_none=True)
        if self.critic_opt is not None:
            self.critic_opt.zero_grad(set_to_none=True)

    def optimizers(self) -> list[Any]:
        return [o for o in (self.actor_opt, self.critic_opt) if o is not None]


def ppo_update(
    models: Trainables,
    exp: Experience,
    cfg: PPOConfig,
    temperature: float,
    info: DistInfo,
    generator: torch.Generator,
    precision: Precision = Precision(),
) -> dict[str, float]:
    """Runs ``cfg.epochs`` passes of minibatch updates; returns mean statistics, grad norm and
    ``skipped_updates`` (optimizer steps skipped for non-finite gradients)."""
    n = exp.responses.shape[0]
    sums = torch.zeros(len(STAT_KEYS), dtype=torch.float64)
    grad_norms: list[float] = []
    updates = skipped = 0
    for _epoch in range(cfg.epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, cfg.mini_batch_size):
            mini = order[start : start + cfg.mini_batch_size]
            den = _denominator(exp.response_mask[mini], cfg.loss_agg_mode).clamp(min=1)
            local = mini[info.rank :: info.world_size]
            models.zero_grad()
            chunks = list(torch.split(local, cfg.micro_batch_size))
            for i, micro in enumerate(chunks):
                sync = i == len(chunks) - 1
                sums += _micro_step(models, exp, micro, den, cfg, temperature, info, sync, precision)
            norm = optimizer_step(models, cfg.grad_clip)
            updates += 1
            if norm is None:
                skipped += 1
            else:
                grad_norms.append(norm)
    all_reduce_sum(sums, info)
    stats = {k: float(v) / updates for k, v in zip(STAT_KEYS, sums, strict=True)}
    if models.critic is None:
        del stats["value_loss"], stats["vf_clip_fraction"]
    if not cfg.use_kl_loss:
        del stats["kl_loss"]
    stats["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    stats["skipped_updates"] = float(skipped)
    return stats


def optimizer_step(models: Trainables, grad_clip: float) -> float | None:
    """Clips and steps every optimizer; None (no step taken, gradients dropped) when any gradient
    is not finite, else the actor's gradient norm before clipping. Gradients are already
    all-reduced by DDP (reduce-scattered by FSDP2, whose norm is over all shards), so every rank
    takes the same decision."""
    scaler = models.scaler
    if scaler is not None:
        for opt in models.optimizers():
            scaler.unscale_(opt)
    norm = _clip(models.actor_opt, grad_clip)
    finite = math.isfinite(norm)
    if models.critic is not None and models.critic_opt is not None:
        finite = math.isfinite(_clip(models.critic_opt, grad_clip)) and finite
    if finite:
        for opt in models.optimizers():
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
    if scaler is not None:
        scaler.update()
    if not finite:
        models.zero_grad()
        return None
    return norm


def _clip(optimizer: Any, grad_clip: float) -> float:
    """Clips the optimizer's gradients to ``grad_clip``; their norm before clipping. Under FSDP2 the
    norm is a DTensor over the shards (its full value is every rank's)."""
    norm = torch.nn.utils.clip_grad_norm_(_trained(optimizer), grad_clip)
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def _trained(optimizer: Any) -> list[torch.Tensor]:
    """The parameters ``optimizer`` steps, in order: what is clipped (a model's own parameters would
    also take in a LoRA base's frozen weights, or a shared critic's adapter for the actor)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _no_sync(model: Any, sync: bool) -> AbstractContextManager[Any]:
    return model.no_sync() if (not sync and hasattr(model, "no_sync")) else nullcontext()


def _backward(loss: torch.Tensor, scaler: Any | None) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def _micro_step(
    models: Trainables,
    exp: Experience,
    idx: torch.Tensor,
    den: torch.Tensor,
    cfg: PPOConfig,
    temperature: float,
    info: DistInfo,
    sync: bool,
    precision: Precision,
) -> torch.Tensor:
    """Forward/backward of one micro-batch; returns its weighted statistics (float64, len(STAT_KEYS))."""
    mask = exp.response_mask[idx]
    weight = float(_denominator(mask, cfg.loss_agg_mode) / den) * info.world_size
    seq, attn, pos = exp.sequences[idx], exp.attention_mask[idx], exp.position_ids[idx]
    zero = torch.zeros((), dtype=torch.float32)
    with _no_sync(models.actor, sync):
        with precision.autocast():
            logits = response_logits(models.actor, seq, attn, pos, exp.prompt_len, temperature)
        logprob = ppo.logprobs_from_logits(logits, exp.responses[idx])
        pg_loss, clipfrac, approx_kl, clip_lower = ppo.policy_loss(
            exp.old_logprob[idx],
            logprob,
            exp.advantages[idx],
            mask,
            cfg.clip_ratio_low,
            cfg.clip_ratio_high,
            cfg.clip_ratio_c,
            cfg.loss_agg_mode,
        )
        entropy = ppo.aggregate_loss(ppo.entropy_from_logits(logits), mask, cfg.loss_agg_mode)
        loss = pg_loss - cfg.entropy_coef * entropy
        kl = zero
        if cfg.use_kl_loss:
            kl = ppo.kl_loss(logprob, exp.ref_logprob[idx], mask, cfg.kl_loss_type, cfg.loss_agg_mode)
            loss = loss + cfg.kl_loss_coef * kl
        _backward(loss * weight, models.scaler)
    vf_loss = vf_clipfrac = zero
    if models.critic is not None and exp.values is not None:
        with _no_sync(models.critic, sync):
            with precision.autocast():
                values = models.critic(seq, attn, pos)[:, exp.prompt_len - 1 : -1].float()
            vf_loss, vf_clipfrac = ppo.value_loss(
                values, exp.values[idx], exp.returns[idx], mask, cfg.value_clip, cfg.loss_agg_mode
            )
            _backward(vf_loss * weight, models.scaler)
    share = weight / info.world_size
    parts = (pg_loss, vf_loss, entropy, clipfrac, approx_kl, vf_clipfrac, kl, clip_lower)
    return torch.tensor([float(p.detach()) * share for p in parts], dtype=torch.float64)
