"""Pure PPO / GRPO math for the trainer: tensor in, tensor out.

No I/O, no model code, no distributed collectives. Every function works on the
device and dtype of its inputs.

Shape conventions used throughout:

- ``B``: number of sequences (responses) in the batch;
- ``T``: number of response tokens per sequence, right-padded;
- ``V``: vocabulary size.

Masks (``response_mask``, ``mask``) are ``(B, T)`` tensors of ``bool`` or of a numeric
dtype; any non-zero entry marks a valid token. Values at invalid positions are never
read into a result, so padding may hold anything, including ``inf`` or ``nan``
(``torch.where`` is used rather than multiplying by the mask, since ``nan * 0`` is
``nan``). Functions returning per-token tensors put ``0`` at invalid positions.

Log-probabilities are natural logs (nats). Shape or argument errors raise
``ValueError``.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "KL_PENALTY_KINDS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate_loss",
    "apply_kl_penalty",
    "compute_gae",
    "compute_grpo_advantage",
    "entropy_from_logits",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "value_loss",
]

LOSS_AGG_MODES: frozenset[str] = frozenset({"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"})
"""Accepted ``loss_agg_mode`` values of :func:`aggregate_loss`."""

KL_PENALTY_KINDS: frozenset[str] = frozenset({"k1", "kl", "k3", "low_var_kl", "low-var-kl", "abs", "mse", "k2"})
"""Accepted ``kind`` values of :func:`kl_penalty` (``kl`` = ``k1``, ``low_var_kl`` = ``low-var-kl`` = ``k3``,
``k2`` = ``mse``), verl's names for its ``kl_penalty`` / ``kl_loss_type``."""

# exp() of a log-ratio above ~88 overflows float32; beyond +-20 the ratio is meaningless anyway.
_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0
_WHITEN_EPS = 1e-8

Dim = int | tuple[int, ...] | None


# --------------------------------------------------------------------------- helpers


def _check_same_shape(**tensors: torch.Tensor) -> None:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.shape != first.shape:
            raise ValueError(
                f"shape mismatch: {first_name} has shape {tuple(first.shape)}, {name} has shape {tuple(t.shape)}"
            )


def _check_2d(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, T), got shape {tuple(t.shape)}")


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_loss_agg_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {sorted(LOSS_AGG_MODES)}")


def _check_finite_number(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")


# --------------------------------------------------------------------------- masked reductions


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Dim = None) -> torch.Tensor:
    """Sum of ``x`` over the valid entries of ``mask``.

    Args:
        x: any shape; non-floating dtypes are promoted to the default float dtype.
        mask: same shape as ``x``; bool or numeric, non-zero = valid.
        dim: dimension(s) to reduce; ``None`` reduces everything to a 0-dim tensor.

    Returns:
        ``x``'s float dtype; shape of ``x`` with ``dim`` removed. Invalid entries
        contribute exactly 0 (even if they are ``nan``/``inf``).

    Raises:
        ValueError: ``x`` and ``mask`` shapes differ.
    """
    _check_same_shape(x=x, mask=mask)
    x = _as_float(x)
    kept = torch.where(_valid(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Dim = None) -> torch.Tensor:
    """Mean of ``x`` over the valid entries of ``mask``.

    Args / shapes as :func:`masked_sum`.

    Returns:
        Sum of valid entries divided by their count. Where the count is 0 the result is
        ``0`` (not ``nan``), and the graph is kept so such a loss backpropagates zeros.

    Raises:
        ValueError: ``x`` and ``mask`` shapes differ.
    """
    total = masked_sum(x, mask, dim)
    valid = _valid(mask)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    # clamp: an empty selection gives 0 / 1 = 0 instead of 0 / 0.
    return total / count.clamp(min=1).to(total.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all valid entries (one scalar for the whole tensor).

    Args:
        x: any shape, floating.
        mask: same shape as ``x``; non-zero = valid.
        unbiased: apply Bessel's correction (divide by ``n - 1`` instead of ``n``).

    Returns:
        0-dim tensor of ``x``'s float dtype, in squared units of ``x``.

    Raises:
        ValueError: shapes differ; no valid entry; exactly one valid entry when ``unbiased``.
    """
    _check_same_shape(x=x, mask=mask)
    n = int(_valid(mask).sum().item())
    if n == 0:
        raise ValueError("masked_var: the mask selects no element")
    if unbiased and n == 1:
        raise ValueError("masked_var: unbiased variance needs at least 2 valid elements, mask selects 1")
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((_as_float(x) - mean) ** 2, mask)
    return sq_dev / (n - 1 if unbiased else n)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to unit (unbiased) variance over its valid entries.

    ``(x - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance taken over valid
    entries only; with ``shift_mean=False`` the mean is added back (scale only).

    Args:
        x: any shape, floating (typically advantages ``(B, T)``).
        mask: same shape as ``x``; non-zero = valid.
        shift_mean: if True the result has mean 0 over valid entries.

    Returns:
        Same shape and dtype as ``x``; 0 at invalid positions.

    Raises:
        ValueError: shapes differ, or fewer than 2 valid entries.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (_as_float(x) - mean) * torch.rsqrt(var + _WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_valid(mask), whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))


# --------------------------------------------------------------------------- advantages


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over response tokens (Schulman et al. 2016).

    Runs backwards over ``T``. Invalid positions are skipped, not treated as steps:
    their reward and value are ignored, and the bootstrap value and running advantage
    pass through them unchanged, so a valid token's ``next value`` is that of the next
    *valid* token (0 after the last one), discounted once by ``gamma``. This matches
    verl's ``compute_gae_advantage_return`` for interleaved observation tokens.

    ``delta_t = r_t + gamma * V_next - V_t``; ``A_t = delta_t + gamma * lam * A_next``.

    Args:
        token_rewards: ``(B, T)`` float, reward per token (usually the score on the last
            valid token minus the per-token KL penalty).
        values: ``(B, T)`` float, critic values ``V_t`` in reward units.
        response_mask: ``(B, T)``; non-zero = valid response token.
        gamma: discount in ``[0, 1]``.
        lam: GAE lambda in ``[0, 1]``.
        whiten: if True, whiten the advantages over valid tokens (:func:`masked_whiten`).
            ``returns`` always use the raw advantages.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in ``values``' dtype, with
        ``returns = raw advantages + values``; both 0 at invalid positions. No autograd
        graph (computed under ``no_grad``).

    Raises:
        ValueError: shapes differ or are not 2-D; ``gamma``/``lam`` outside ``[0, 1]``;
        ``whiten`` with fewer than 2 valid tokens.
    """
    _check_2d("token_rewards", token_rewards)
    _check_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")

    values = _as_float(values)
    valid = _valid(response_mask)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    rewards = torch.where(valid, token_rewards.to(values.dtype), zero)
    vals = torch.where(valid, values, zero)

    batch, length = values.shape
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    last_adv = torch.zeros_like(next_value)
    adv_columns: list[torch.Tensor] = []
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv_t = delta + gamma * lam * last_adv
        step = valid[:, t]
        # Invalid tokens are transparent: carry the bootstrap value and running advantage past them.
        next_value = torch.where(step, vals[:, t], next_value)
        last_adv = torch.where(step, adv_t, last_adv)
        adv_columns.append(torch.where(step, adv_t, zero))
    advantages = torch.stack(adv_columns[::-1], dim=1)
    returns = torch.where(valid, advantages + vals, zero)
    if whiten:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@torch.no_grad()
def compute_grpo_advantage(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    response_mask: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: per-group normalised sequence score, broadcast over tokens.

    For each group (responses to the same prompt) ``A_i = (s_i - mean_g) / (std_g + eps)``
    with the unbiased group std, or ``s_i - mean_g`` when ``norm_by_std`` is False.
    A group of size 1, or whose scores are all equal, gets advantage exactly 0 (set
    explicitly, since float round-off in ``mean_g`` would otherwise leave tiny noise
    that ``1 / eps`` could amplify). Note: verl leaves a singleton's score unnormalised
    (mean 0, std 1); here it carries no signal, hence 0.

    Args:
        scores: ``(B,)`` sequence scores in reward units; non-float is promoted.
        group_ids: ``(B,)`` integer group label per sequence (any values, need not be
            contiguous or sorted).
        response_mask: ``(B, T)``; non-zero = valid token.
        eps: ``>= 0``, added to the std.
        norm_by_std: divide by the group std (GRPO) or only centre (Dr. GRPO).

    Returns:
        ``(advantages, returns)``: the same ``(B, T)`` tensor twice (as in verl, GRPO has
        no critic), in ``scores``' float dtype, 0 at invalid positions; no autograd graph.

    Raises:
        ValueError: wrong shapes, non-integer ``group_ids``, non-finite ``scores``, ``eps < 0``.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (B,), got shape {tuple(scores.shape)}")
    if group_ids.shape != scores.shape:
        raise ValueError(f"group_ids must have shape {tuple(scores.shape)}, got {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    _check_2d("response_mask", response_mask)
    if response_mask.shape[0] != scores.shape[0]:
        raise ValueError(f"response_mask has {response_mask.shape[0]} rows but scores has {scores.shape[0]}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    scores = _as_float(scores)
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores contain nan or inf")

    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    zeros_g = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count = zeros_g.index_add(0, inverse, torch.ones_like(scores))
    mean = zeros_g.index_add(0, inverse, scores) / count
    dev = scores - mean[inverse]
    sq = zeros_g.index_add(0, inverse, dev * dev)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    g_max = zeros_g.scatter_reduce(0, inverse, scores, reduce="amax", include_self=False)
    g_min = zeros_g.scatter_reduce(0, inverse, scores, reduce="amin", include_self=False)
    informative = (count[inverse] > 1) & (g_max[inverse] > g_min[inverse])

    adv = dev / (std[inverse] + eps) if norm_by_std else dev
    adv = torch.where(informative, adv, torch.zeros_like(adv))
    token_adv = torch.where(
        _valid(response_mask), adv.unsqueeze(-1), torch.zeros((), dtype=adv.dtype, device=adv.device)
    )
    return token_adv, token_adv


# --------------------------------------------------------------------------- KL


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from sampled-token log-probs.

    With ``d = logprob - ref_logprob`` (nats):

    - ``"k1"`` / ``"kl"``: ``d`` (unbiased, high variance, can be negative);
    - ``"abs"``: ``|d|``;
    - ``"mse"`` / ``"k2"``: ``0.5 * d**2``;
    - ``"k3"`` / ``"low_var_kl"``: ``(r - 1) - log r`` with ``r = exp(-d)`` (Schulman's
      unbiased, non-negative, low-variance estimator); ``log r`` is clamped to
      ``[-20, 20]`` before ``exp`` and the result to ``[-10, 10]`` so one outlier
      token cannot dominate.

    Args:
        logprob: any shape, float, log-probs of the sampled tokens under the policy.
        ref_logprob: same shape, under the reference policy.
        kind: one of :data:`KL_PENALTY_KINDS`.

    Returns:
        Same shape and dtype as ``logprob``, in nats.

    Raises:
        ValueError: shapes differ, or ``kind`` is unknown (message names it).
    """
    _check_same_shape(logprob=logprob, ref_logprob=ref_logprob)
    if kind in ("k1", "kl"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("k3", "low_var_kl", "low-var-kl"):
        log_ratio = (ref_logprob - logprob).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        k3 = torch.exp(log_ratio) - 1.0 - log_ratio
        return k3.clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"unknown KL penalty kind {kind!r}; expected one of {sorted(KL_PENALTY_KINDS)}")


class FixedKLController:
    """Constant KL coefficient; :meth:`update` is a no-op.

    Attributes:
        value: the coefficient (``>= 0``, dimensionless: reward units per nat).
    """

    def __init__(self, coef: float) -> None:
        """Raises ValueError if ``coef`` is negative or not finite."""
        _check_finite_number("coef", coef)
        if coef < 0:
            raise ValueError(f"coef must be >= 0, got {coef!r}")
        self.value: float = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep ``value`` unchanged (same signature as :class:`AdaptiveKLController`)."""


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), as in verl.

    On each update: ``err = clip(current_kl / target - 1, -0.2, 0.2)`` and
    ``value *= 1 + err * n_steps / horizon``; the coefficient grows while the observed
    KL is above ``target`` and shrinks while below.

    Attributes:
        value: current coefficient (``>= 0``).
        target: target KL in nats (``> 0``).
        horizon: number of samples (``> 0``) over which a full proportional step applies.
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        """Raises ValueError if ``init_coef < 0``, ``target <= 0``, ``horizon <= 0`` or any is not finite."""
        for name, v in (("init_coef", init_coef), ("target", target), ("horizon", horizon)):
            _check_finite_number(name, v)
        if init_coef < 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef!r}")
        if target <= 0:
            raise ValueError(f"target must be > 0, got {target!r}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        self.value: float = float(init_coef)
        self.target: float = float(target)
        self.horizon: float = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward keeping ``current_kl`` near ``target``.

        Args:
            current_kl: observed mean KL in nats (e.g. from :func:`apply_kl_penalty`).
            n_steps: samples since the last update (usually the batch size), ``>= 0``.

        Raises:
            ValueError: ``current_kl`` not finite, or ``n_steps < 0``; ``value`` is then unchanged.
        """
        current_kl = float(current_kl)
        _check_finite_number("current_kl", current_kl)
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps!r}")
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract the per-token KL penalty from the token-level scores.

    ``token_rewards = token_level_scores - kl_coef * kl`` on valid tokens, where ``kl``
    is :func:`kl_penalty` (``kl`` is taken as 0 on invalid tokens).

    Args:
        token_level_scores: ``(B, T)`` float, reward units (typically the sequence score
            on the last valid token, 0 elsewhere).
        logprob: ``(B, T)`` rollout-policy log-probs of the sampled tokens, nats.
        ref_logprob: ``(B, T)`` reference-policy log-probs, nats.
        response_mask: ``(B, T)``; non-zero = valid.
        kl_coef: ``>= 0``, reward units per nat.
        kind: see :func:`kl_penalty`.

    Returns:
        ``(token_rewards, mean_kl)``: ``(B, T)`` in the scores' float dtype (invalid
        positions keep their score), and a 0-dim tensor: the per-sequence token-mean KL
        averaged over sequences (nats; feed ``float(mean_kl)`` to a KL controller).
        Computed without autograd.

    Raises:
        ValueError: shapes differ or are not 2-D; ``kl_coef`` negative or not finite; unknown ``kind``.
    """
    _check_2d("token_level_scores", token_level_scores)
    _check_same_shape(
        token_level_scores=token_level_scores, logprob=logprob, ref_logprob=ref_logprob, response_mask=response_mask
    )
    _check_finite_number("kl_coef", kl_coef)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
    with torch.no_grad():
        kl = kl_penalty(logprob, ref_logprob, kind)
        kl = torch.where(_valid(response_mask), kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
        scores = _as_float(token_level_scores)
        token_rewards = scores - kl_coef * kl.to(scores.dtype)
        mean_kl = masked_mean(kl, response_mask, dim=-1).mean()
    return token_rewards, mean_kl


# --------------------------------------------------------------------------- losses


def kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """KL to the reference as a loss term (verl's ``actor.use_kl_loss``): ``agg(kl_penalty(...))``.

    Differentiable w.r.t. ``logprob`` (the current policy's log-probs); ``ref_logprob`` is a
    constant. Shapes ``(B, T)``; returns a 0-dim tensor in nats.

    Raises:
        ValueError: shapes differ or are not 2-D; unknown ``kind`` or ``loss_agg_mode``.
    """
    _check_2d("logprob", logprob)
    kl = kl_penalty(logprob, ref_logprob.detach(), kind)
    return aggregate_loss(kl, response_mask, loss_agg_mode)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Modes (only valid tokens count; a sequence with no valid token is left out of the
    sequence-level means; if nothing is valid the loss is 0 with the graph kept):

    - ``"token-mean"``: sum over all valid tokens / number of valid tokens;
    - ``"seq-mean-token-sum"``: per-sequence sum over tokens, then mean over sequences;
    - ``"seq-mean-token-mean"``: per-sequence mean over tokens, then mean over sequences.

    The reduction is local to this call (one micro-batch on one rank); cross-batch
    normalisation is the caller's job.

    Args:
        loss_mat: ``(B, T)`` float per-token loss.
        mask: ``(B, T)``; non-zero = valid.
        mode: one of :data:`LOSS_AGG_MODES`.

    Returns:
        0-dim tensor, ``loss_mat``'s dtype, differentiable w.r.t. ``loss_mat``.

    Raises:
        ValueError: shapes differ or are not 2-D; unknown ``mode``.
    """
    _check_loss_agg_mode(mode)
    _check_2d("loss_mat", loss_mat)
    _check_same_shape(loss_mat=loss_mat, mask=mask)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    has_tokens = _valid(mask).any(dim=-1)
    if mode == "seq-mean-token-sum":
        seq_loss = masked_sum(loss_mat, mask, dim=-1)
    else:
        seq_loss = masked_mean(loss_mat, mask, dim=-1)
    return masked_mean(seq_loss, has_tokens)


def policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate loss with dual clip (Ye et al. 2020), to be minimised.

    With ``r = exp(logprob - old_logprob)`` (log-ratio clamped to ``[-20, 20]``):
    per token ``L = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``; for
    ``A < 0`` it is further capped, ``L = min(L, -A * clip_ratio_c)``, so a token whose
    ratio has blown up cannot contribute an unbounded loss.

    Args:
        old_logprob: ``(B, T)`` log-probs under the rollout policy, nats (no grad needed).
        logprob: ``(B, T)`` log-probs under the current policy, nats (carries the grad).
        advantages: ``(B, T)`` float.
        response_mask: ``(B, T)``; non-zero = valid.
        clip_low: ``0 <= clip_low < 1``; lower ratio bound is ``1 - clip_low``.
        clip_high: ``>= 0``; upper ratio bound is ``1 + clip_high`` (DAPO's clip-higher
            uses a larger value than ``clip_low``).
        clip_ratio_c: dual-clip constant, ``> 1``.
        loss_agg_mode: see :func:`aggregate_loss`.

    Returns:
        ``(loss, clipfrac, approx_kl, clipfrac_lower)``, all 0-dim tensors:
        ``loss`` (differentiable); ``clipfrac``: fraction of valid tokens where the
        clipped term is strictly the larger one; ``approx_kl``: token-mean of
        ``old_logprob - logprob`` (k1 estimate of ``KL(old || new)``, nats);
        ``clipfrac_lower``: fraction of valid tokens where the dual clip is active.
        The three metrics are detached, in the loss's dtype.

    Raises:
        ValueError: shapes differ or are not 2-D; clip bounds out of range;
        ``clip_ratio_c <= 1``; unknown ``loss_agg_mode``.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c!r}")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    _check_loss_agg_mode(loss_agg_mode)
    _check_2d("logprob", logprob)
    _check_same_shape(old_logprob=old_logprob, logprob=logprob, advantages=advantages, response_mask=response_mask)

    log_ratio = (logprob - old_logprob).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    ppo_loss = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(ppo_loss, dual_cap), ppo_loss)

    loss = aggregate_loss(loss_mat, response_mask, loss_agg_mode)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).to(loss_mat.dtype), response_mask)
        clipfrac_lower = masked_mean((negative & (ppo_loss > dual_cap)).to(loss_mat.dtype), response_mask)
        approx_kl = masked_mean(-log_ratio, response_mask)
    return loss, clipfrac, approx_kl, clipfrac_lower


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped critic loss: ``0.5 * agg(max((v - R)**2, (v_clip - R)**2))``.

    ``v_clip = old_values + clip(values - old_values, -cliprange_value, cliprange_value)``;
    taking the max is pessimistic, so moving the value far from ``old_values`` cannot
    lower the loss.

    Args:
        values: ``(B, T)`` current critic predictions (carries the grad), reward units.
        old_values: ``(B, T)`` predictions at rollout time.
        returns: ``(B, T)`` targets (e.g. from :func:`compute_gae`).
        response_mask: ``(B, T)``; non-zero = valid.
        cliprange_value: ``>= 0``, in reward units.
        loss_agg_mode: see :func:`aggregate_loss`.

    Returns:
        ``(loss, vf_clipfrac)``: 0-dim tensors; ``loss`` in squared reward units,
        differentiable; ``vf_clipfrac`` (detached) is the fraction of valid tokens where
        the clipped term is strictly larger.

    Raises:
        ValueError: shapes differ or are not 2-D; ``cliprange_value < 0``; unknown ``loss_agg_mode``.
    """
    if not cliprange_value >= 0.0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value!r}")
    _check_loss_agg_mode(loss_agg_mode)
    _check_2d("values", values)
    _check_same_shape(values=values, old_values=old_values, returns=returns, response_mask=response_mask)

    v_clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    err_unclipped = (values - returns) ** 2
    err_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * aggregate_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode)
    with torch.no_grad():
        vf_clipfrac = masked_mean((err_clipped > err_unclipped).to(err_clipped.dtype), response_mask)
    return loss, vf_clipfrac


# --------------------------------------------------------------------------- logits


def _upcast_low_precision(logits: torch.Tensor) -> torch.Tensor:
    # fp16/bf16 softmax loses most of the useful precision of a log-prob.
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` along the last dim.

    ``H = logsumexp(z) - sum softmax(z) * z``, stable for large logits; ``-inf`` logits
    (masked vocabulary entries) contribute 0. A row that is entirely ``-inf`` gives ``nan``.

    Args:
        logits: ``(..., V)`` float, typically ``(B, T, V)``.

    Returns:
        ``(...)`` (e.g. ``(B, T)``) in nats; float32 for fp16/bf16 input, else the input dtype.
        Differentiable.

    Raises:
        ValueError: ``logits`` is 0-dim or not floating.
    """
    if logits.dim() == 0 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor (..., V), got {logits.dtype} {tuple(logits.shape)}")
    z = _upcast_low_precision(logits)
    probs = torch.softmax(z, dim=-1)
    # Zero the -inf entries before the product: 0 * -inf is nan, and so would be its gradient.
    z_finite = torch.where(torch.isneginf(z), torch.zeros((), dtype=z.dtype, device=z.device), z)
    return torch.logsumexp(z, dim=-1) - (probs * z_finite).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``: ``log_softmax`` then gather.

    Args:
        logits: ``(B, T, V)`` float (any leading shape ``(..., V)`` works).
        labels: ``(B, T)`` integer token ids in ``[0, V)``, shape ``logits.shape[:-1]``.

    Returns:
        ``(B, T)`` log-probs in nats (``<= 0``); float32 for fp16/bf16 input, else the
        input dtype. Differentiable w.r.t. ``logits``.

    Raises:
        ValueError: shape mismatch, non-floating ``logits`` or non-integer ``labels``.
        RuntimeError: (from torch) a label outside ``[0, V)``.
    """
    if logits.dim() == 0 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor (..., V), got {logits.dtype} {tuple(logits.shape)}")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal logits.shape[:-1] {tuple(logits.shape[:-1])}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    log_probs = torch.log_softmax(_upcast_low_precision(logits), dim=-1)
    return log_probs.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
