"""One PPO iteration on models: experience making and the clipped update.

Experience is made for the whole global batch on every rank (identical inputs and RNG,
so identical results); the update is data-parallel: each rank takes its share of every
minibatch and losses are normalised by the *global* minibatch denominators, so the
summed gradient equals the single-process gradient.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from trainer import ppo
from trainer.config import AlgorithmConfig, PPOConfig
from trainer.distributed import DistInfo, all_reduce_sum


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
    values: torch.Tensor  # (B, T)
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
) -> torch.Tensor:
    out = []
    for i in range(0, exp_seq.shape[0], micro):
        sl = slice(i, i + micro)
        logits = response_logits(model, exp_seq[sl], attn[sl], pos[sl], prompt_len, temperature)
        out.append(ppo.logprobs_from_logits(logits, responses[sl]))
    return torch.cat(out)


@torch.no_grad()
def batched_values(
    critic: Any, seq: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, prompt_len: int, micro: int
) -> torch.Tensor:
    out = [critic(seq[i : i + micro], attn[i : i + micro], pos[i : i + micro]) for i in range(0, seq.shape[0], micro)]
    return torch.cat(out)[:, prompt_len - 1 : -1]


def make_experience(
    actor: Any,
    ref: Any,
    critic: Any,
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
) -> Experience:
    """Log-probs, values, KL-penalised token rewards and advantages for one rollout."""
    seq = torch.cat([prompt_ids, responses], dim=1)
    attn = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    pos = position_ids_from(attn)
    p_len = prompt_ids.shape[1]
    old_lp = batched_logprobs(actor, seq, attn, pos, responses, p_len, temperature, micro)
    ref_lp = batched_logprobs(ref, seq, attn, pos, responses, p_len, temperature, micro)
    values = batched_values(critic, seq, attn, pos, p_len, micro) * response_mask
    last = response_mask.sum(dim=1).clamp(min=1) - 1
    token_scores = torch.zeros_like(old_lp)
    token_scores[torch.arange(len(scores)), last] = scores.to(token_scores.dtype)
    token_rewards, mean_kl = ppo.apply_kl_penalty(token_scores, old_lp, ref_lp, response_mask, kl_coef, alg.kl_kind)
    if alg.adv_estimator == "grpo":
        adv, ret = ppo.compute_grpo_advantage(scores, group_ids, response_mask)
    else:
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


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl", "vf_clip_fraction")


def ppo_update(
    actor: Any,
    critic: Any,
    actor_opt: Any,
    critic_opt: Any,
    exp: Experience,
    cfg: PPOConfig,
    temperature: float,
    info: DistInfo,
    generator: torch.Generator,
) -> dict[str, float]:
    """Runs ``cfg.epochs`` passes of minibatch updates; returns mean statistics and grad norm."""
    n = exp.responses.shape[0]
    sums = torch.zeros(len(STAT_KEYS), dtype=torch.float64)
    grad_norms: list[float] = []
    updates = 0
    for _epoch in range(cfg.epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, cfg.mini_batch_size):
            mini = order[start : start + cfg.mini_batch_size]
            den = _denominator(exp.response_mask[mini], cfg.loss_agg_mode).clamp(min=1)
            local = mini[info.rank :: info.world_size]
            actor_opt.zero_grad(set_to_none=True)
            critic_opt.zero_grad(set_to_none=True)
            chunks = list(torch.split(local, cfg.micro_batch_size))
            for i, micro in enumerate(chunks):
                sync = i == len(chunks) - 1
                sums += _micro_step(actor, critic, exp, micro, den, cfg, temperature, info, sync)
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.grad_clip)))
            torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.grad_clip)
            actor_opt.step()
            critic_opt.step()
            updates += 1
    all_reduce_sum(sums, info)
    stats = {k: float(v) / updates for k, v in zip(STAT_KEYS, sums, strict=True)}
    stats["grad_norm"] = sum(grad_norms) / len(grad_norms)
    return stats


def _micro_step(
    actor: Any,
    critic: Any,
    exp: Experience,
    idx: torch.Tensor,
    den: torch.Tensor,
    cfg: PPOConfig,
    temperature: float,
    info: DistInfo,
    sync: bool,
) -> torch.Tensor:
    """Forward/backward of one micro-batch; returns its weighted statistics (float64, len(STAT_KEYS))."""
    mask = exp.response_mask[idx]
    weight = float(_denominator(mask, cfg.loss_agg_mode) / den) * info.world_size
    seq, attn, pos = exp.sequences[idx], exp.attention_mask[idx], exp.position_ids[idx]
    no_sync_a = actor.no_sync() if (not sync and hasattr(actor, "no_sync")) else nullcontext()
    no_sync_c = critic.no_sync() if (not sync and hasattr(critic, "no_sync")) else nullcontext()
    with no_sync_a:
        logits = response_logits(actor, seq, attn, pos, exp.prompt_len, temperature)
        logprob = ppo.logprobs_from_logits(logits, exp.responses[idx])
        pg_loss, clipfrac, approx_kl, _ = ppo.policy_loss(
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
        ((pg_loss - cfg.entropy_coef * entropy) * weight).backward()
    with no_sync_c:
        values = critic(seq, attn, pos)[:, exp.prompt_len - 1 : -1]
        vf_loss, vf_clipfrac = ppo.value_loss(
            values, exp.values[idx], exp.returns[idx], mask, cfg.value_clip, cfg.loss_agg_mode
        )
        (vf_loss * weight).backward()
    share = weight / info.world_size
    parts = (pg_loss, vf_loss, entropy, clipfrac, approx_kl, vf_clipfrac)
    return torch.tensor([float(p.detach()) * share for p in parts], dtype=torch.float64)
