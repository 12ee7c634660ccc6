"""Tests for trainer.ppo against hand-computed values (derivations in comments)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trainer.ppo import (
    KL_PENALTY_KINDS,
    LOSS_AGG_MODES,
    AdaptiveKLController,
    FixedKLController,
    aggregate_loss,
    apply_kl_penalty,
    compute_gae,
    compute_grpo_advantage,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss,
    value_loss,
)

F64 = torch.float64


def t(data: object, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype)


def scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# --------------------------------------------------------------------------- masked reductions


class TestMaskedReductions:
    def test_sum_and_mean_ignore_padding_even_nan_inf(self):
        x = t([[1.0, 2.0, float("nan")], [3.0, float("inf"), -float("inf")]])
        mask = torch.tensor([[True, True, False], [True, False, False]])
        # valid: 1, 2, 3 -> sum 6, mean 2
        assert_close(masked_sum(x, mask), scalar(6.0))
        assert_close(masked_mean(x, mask), scalar(2.0))
        # per row: [1+2, 3] and [3/2, 3/1]
        assert_close(masked_sum(x, mask, dim=-1), t([3.0, 3.0]))
        assert_close(masked_mean(x, mask, dim=-1), t([1.5, 3.0]))

    def test_numeric_mask_equivalent_to_bool(self):
        x = t([[1.0, 2.0], [4.0, 8.0]])
        assert_close(masked_mean(x, t([[1, 0], [1, 1]], torch.int64)), scalar(13.0 / 3.0))
        assert_close(masked_mean(x, t([[1.0, 0.0], [1.0, 1.0]])), scalar(13.0 / 3.0))

    def test_mean_of_empty_selection_is_zero_and_backprops(self):
        x = t([[1.0, 2.0]]).requires_grad_()
        mask = torch.zeros(1, 2, dtype=torch.bool)
        out = masked_mean(x, mask)
        assert_close(out, scalar(0.0))
        out.backward()
        assert x.grad is not None
        assert_close(x.grad, t([[0.0, 0.0]]))
        # an empty row in a per-row mean is 0, the other row is unaffected
        assert_close(masked_mean(t([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [0, 0]]), dim=1), t([2.0, 0.0]))

    def test_bool_input_is_promoted(self):
        x = torch.tensor([True, False, True, True])
        assert_close(masked_mean(x, torch.tensor([1, 1, 1, 0])), torch.tensor(2.0 / 3.0))

    def test_var_hand_values(self):
        x = t([[1.0, 2.0, 99.0], [3.0, 4.0, -99.0]])
        mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
        # valid 1,2,3,4: mean 2.5, squared deviations 2.25+0.25+0.25+2.25 = 5
        assert_close(masked_var(x, mask, unbiased=True), scalar(5.0 / 3.0))
        assert_close(masked_var(x, mask, unbiased=False), scalar(5.0 / 4.0))

    def test_var_raises_on_too_few_elements(self):
        x = t([1.0, 2.0])
        with pytest.raises(ValueError, match="no element"):
            masked_var(x, torch.tensor([0, 0]))
        with pytest.raises(ValueError, match="at least 2"):
            masked_var(x, torch.tensor([1, 0]))
        assert_close(masked_var(x, torch.tensor([1, 0]), unbiased=False), scalar(0.0))

    def test_whiten_hand_values_and_moments(self):
        x = t([[1.0, 2.0, 1e6], [3.0, 4.0, float("nan")]])
        mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
        w = masked_whiten(x, mask)
        # (x - 2.5) / sqrt(5/3); the 1e-8 epsilon is below the tolerance
        s = math.sqrt(5.0 / 3.0)
        assert_close(w, t([[-1.5 / s, -0.5 / s, 0.0], [0.5 / s, 1.5 / s, 0.0]]))
        assert_close(masked_mean(w, mask), scalar(0.0))
        assert_close(masked_var(w, mask), scalar(1.0))

    def test_whiten_without_shift_keeps_mean(self):
        x = t([[1.0, 2.0, 3.0, 4.0]])
        mask = torch.ones(1, 4)
        w = masked_whiten(x, mask, shift_mean=False)
        s = math.sqrt(5.0 / 3.0)
        assert_close(w, t([[2.5 - 1.5 / s, 2.5 - 0.5 / s, 2.5 + 0.5 / s, 2.5 + 1.5 / s]]))
        assert_close(masked_mean(w, mask), scalar(2.5))

    def test_shape_mismatch_raises(self):
        with pytest.raises(ValueError, match="shape mismatch"):
            masked_mean(t([1.0, 2.0]), torch.ones(3))


# --------------------------------------------------------------------------- GAE


class TestGAE:
    def test_gamma_lambda_one_is_reward_to_go_minus_value(self):
        rewards = t([[1.0, 2.0, 3.0]])
        values = t([[0.5, 1.0, 2.0]])
        mask = torch.ones(1, 3)
        adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
        # reward-to-go: [1+2+3, 2+3, 3] = [6, 5, 3]; minus values -> [5.5, 4, 1]
        assert_close(adv, t([[5.5, 4.0, 1.0]]))
        assert_close(ret, t([[6.0, 5.0, 3.0]]))

    def test_three_tokens_gamma_09_lambda_08(self):
        rewards = t([[0.0, 0.0, 1.0]])
        values = t([[0.5, 0.2, 0.4]])
        mask = torch.ones(1, 3)
        adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
        # gamma*lam = 0.72
        # t=2: delta = 1 + 0.9*0   - 0.4 =  0.6          A2 = 0.6
        # t=1: delta = 0 + 0.9*0.4 - 0.2 =  0.16         A1 = 0.16 + 0.72*0.6   = 0.592
        # t=0: delta = 0 + 0.9*0.2 - 0.5 = -0.32         A0 = -0.32 + 0.72*0.592 = 0.10624
        # returns = A + V = [0.60624, 0.792, 1.0]
        assert_close(adv, t([[0.10624, 0.592, 0.6]]))
        assert_close(ret, t([[0.60624, 0.792, 1.0]]))

    def test_gamma_zero_is_one_step_td(self):
        rewards = t([[1.0, 2.0]])
        values = t([[0.25, 0.5]])
        adv, _ = compute_gae(rewards, values, torch.ones(1, 2), gamma=0.0, lam=0.95)
        # gamma = 0: A_t = r_t - V_t
        assert_close(adv, t([[0.75, 1.5]]))

    def test_right_padding_is_ignored(self):
        # Row 0 is the 3-token example above padded to 5 with garbage; row 1 is 1 valid token.
        rewards = t([[0.0, 0.0, 1.0, 50.0, -7.0], [2.0, 9.0, 9.0, 9.0, 9.0]])
        values = t([[0.5, 0.2, 0.4, 1e3, float("nan")], [0.5, 9.0, 9.0, 9.0, float("inf")]])
        mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
        adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
        # row 1: A0 = 2 - 0.5 = 1.5 (no bootstrap past the last valid token); return 2
        assert_close(adv, t([[0.10624, 0.592, 0.6, 0.0, 0.0], [1.5, 0.0, 0.0, 0.0, 0.0]]))
        assert_close(ret, t([[0.60624, 0.792, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0]]))

    def test_interior_masked_tokens_are_skipped(self):
        # A masked token between valid ones (e.g. a tool observation) is transparent:
        # same result as the 3-token example with the masked column removed.
        rewards = t([[0.0, 5.0, 0.0, 1.0]])
        values = t([[0.5, 3.0, 0.2, 0.4]])
        mask = torch.tensor([[1, 0, 1, 1]])
        adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
        assert_close(adv, t([[0.10624, 0.0, 0.592, 0.6]]))
        assert_close(ret, t([[0.60624, 0.0, 0.792, 1.0]]))

    def test_whiten_flag(self):
        rewards = t([[1.0, 2.0, 3.0, 0.0]])
        values = t([[0.5, 1.0, 2.0, 0.0]])
        mask = torch.tensor([[1, 1, 1, 0]])
        adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0, whiten=True)
        # raw A = [5.5, 4, 1]: mean 3.5, squared deviations 4 + 0.25 + 6.25 = 10.5, unbiased var 5.25
        s = math.sqrt(5.25)
        assert_close(adv, t([[2.0 / s, 0.5 / s, -2.5 / s, 0.0]]))
        # returns come from the raw advantages
        assert_close(ret, t([[6.0, 5.0, 3.0, 0.0]]))

    def test_no_grad_and_validation(self):
        values = t([[1.0, 2.0]]).requires_grad_()
        adv, ret = compute_gae(t([[0.0, 1.0]]), values, torch.ones(1, 2), gamma=1.0, lam=1.0)
        assert not adv.requires_grad and not ret.requires_grad
        with pytest.raises(ValueError, match="gamma"):
            compute_gae(t([[0.0]]), t([[0.0]]), torch.ones(1, 1), gamma=1.5, lam=1.0)
        with pytest.raises(ValueError, match="lam"):
            compute_gae(t([[0.0]]), t([[0.0]]), torch.ones(1, 1), gamma=1.0, lam=-0.1)
        with pytest.raises(ValueError, match="shape mismatch"):
            compute_gae(t([[0.0, 1.0]]), t([[0.0]]), torch.ones(1, 2), gamma=1.0, lam=1.0)
        with pytest.raises(ValueError, match="2-D"):
            compute_gae(t([0.0]), t([0.0]), torch.ones(1), gamma=1.0, lam=1.0)


# --------------------------------------------------------------------------- GRPO


class TestGRPO:
    def test_group_normalisation_hand_values(self):
        scores = t([1.0, 0.0, 1.0, 1.0, 3.0, 5.0])
        groups = torch.tensor([0, 0, 0, 7, 7, 3])
        mask = torch.tensor([[1, 1, 0]] * 6)
        adv, ret = compute_grpo_advantage(scores, groups, mask, eps=0.0)
        # group 0: [1, 0, 1], mean 2/3, deviations [1/3, -2/3, 1/3],
        #          unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3, std 1/sqrt(3)
        #          -> [sqrt(3)/3, -2 sqrt(3)/3, sqrt(3)/3]
        # group 7: [1, 3], mean 2, unbiased var (1 + 1) / 1 = 2 -> [-1/sqrt(2), 1/sqrt(2)]
        # group 3: singleton -> 0
        r3 = math.sqrt(3.0) / 3.0
        r2 = 1.0 / math.sqrt(2.0)
        per_seq = [r3, -2 * r3, r3, -r2, r2, 0.0]
        assert_close(adv, t([[a, a, 0.0] for a in per_seq]))
        assert torch.equal(adv, ret)

    def test_eps_in_denominator(self):
        adv, _ = compute_grpo_advantage(t([1.0, 3.0]), torch.tensor([4, 4]), torch.ones(2, 1), eps=0.5)
        # std sqrt(2): A = ±1 / (sqrt(2) + 0.5)
        d = 1.0 / (math.sqrt(2.0) + 0.5)
        assert_close(adv, t([[-d], [d]]))

    def test_centre_only(self):
        adv, _ = compute_grpo_advantage(
            t([1.0, 0.0, 1.0]), torch.tensor([0, 0, 0]), torch.ones(3, 1), norm_by_std=False
        )
        assert_close(adv, t([[1.0 / 3.0], [-2.0 / 3.0], [1.0 / 3.0]]))

    def test_singletons_and_constant_groups_are_exactly_zero(self):
        # 0.1 * 3 / 3 != 0.1 in floating point; the advantage must still be exactly 0.
        scores = t([7.0, 0.1, 0.1, 0.1, -4.0])
        groups = torch.tensor([1, 2, 2, 2, 3])
        adv, _ = compute_grpo_advantage(scores, groups, torch.ones(5, 2), eps=0.0)
        assert torch.equal(adv, torch.zeros(5, 2, dtype=F64))

    def test_validation(self):
        mask = torch.ones(2, 3)
        with pytest.raises(ValueError, match="integer"):
            compute_grpo_advantage(t([1.0, 2.0]), t([0.0, 0.0]), mask)
        with pytest.raises(ValueError, match="rows"):
            compute_grpo_advantage(t([1.0, 2.0]), torch.tensor([0, 0]), torch.ones(3, 3))
        with pytest.raises(ValueError, match="nan or inf"):
            compute_grpo_advantage(t([1.0, float("nan")]), torch.tensor([0, 0]), mask)
        with pytest.raises(ValueError, match="eps"):
            compute_grpo_advantage(t([1.0, 2.0]), torch.tensor([0, 0]), mask, eps=-1.0)


# --------------------------------------------------------------------------- KL


class TestKL:
    def test_k1_k3_abs_mse_hand_values(self):
        logprob = t([math.log(0.5), math.log(0.25)])
        ref = t([math.log(0.25), math.log(0.5)])
        # k1 = log(0.5/0.25) = ln 2 ; log(0.25/0.5) = -ln 2
        ln2 = 0.6931471805599453
        assert_close(kl_penalty(logprob, ref, "k1"), t([ln2, -ln2]))
        assert_close(kl_penalty(logprob, ref, "kl"), t([ln2, -ln2]))
        # k3: ratio = ref/p = 0.5 -> (0.5 - 1) - ln 0.5 = ln2 - 0.5 = 0.19314718...
        #     ratio = 2       -> (2 - 1)   - ln 2   = 1 - ln2 = 0.30685281...
        assert_close(kl_penalty(logprob, ref, "k3"), t([0.1931471805599453, 0.3068528194400547]))
        assert_close(kl_penalty(logprob, ref, "low_var_kl"), t([0.1931471805599453, 0.3068528194400547]))
        assert_close(kl_penalty(logprob, ref, "abs"), t([ln2, ln2]))
        # 0.5 * ln2^2 = 0.24022650695910071
        assert_close(kl_penalty(logprob, ref, "mse"), t([0.24022650695910071, 0.24022650695910071]))

    def test_k3_zero_at_equality_and_clamped(self):
        logprob = t([-1.0, 0.0, 0.0])
        ref = t([-1.0, 15.0, -50.0])
        # equal -> 0; log ratio 15 -> e^15 - 16 ~ 3.3e6 -> 10;
        # log ratio -50 clamped to -20 -> e^-20 - 1 + 20 ~ 19 -> 10
        assert_close(kl_penalty(logprob, ref, "k3"), t([0.0, 10.0, 10.0]))

    def test_unknown_kind_raises_naming_it(self):
        with pytest.raises(ValueError, match="'k7'"):
            kl_penalty(t([0.0]), t([0.0]), "k7")
        assert {"k1", "k3", "abs", "mse"} <= KL_PENALTY_KINDS

    def test_fixed_controller(self):
        ctl = FixedKLController(0.05)
        ctl.update(current_kl=100.0, n_steps=1000)
        assert ctl.value == 0.05
        with pytest.raises(ValueError):
            FixedKLController(-0.1)

    def test_adaptive_controller_hand_values(self):
        # target 6, horizon 10000, n_steps 256
        ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
        ctl.update(current_kl=12.0, n_steps=256)  # err = 1 -> clipped 0.2; mult = 1 + 0.2*256/1e4 = 1.00512
        assert ctl.value == pytest.approx(0.100512, rel=1e-12)
        ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
        ctl.update(current_kl=3.0, n_steps=256)  # err = -0.5 -> -0.2; mult = 0.99488
        assert ctl.value == pytest.approx(0.099488, rel=1e-12)
        ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
        ctl.update(current_kl=6.6, n_steps=256)  # err = 0.1 (inside clip); mult = 1.00256
        assert ctl.value == pytest.approx(0.100256, rel=1e-12)
        ctl.update(current_kl=6.0, n_steps=256)  # at target: unchanged
        assert ctl.value == pytest.approx(0.100256, rel=1e-12)

    def test_adaptive_controller_direction_and_validation(self):
        ctl = AdaptiveKLController(init_coef=0.2, target=0.1, horizon=100)
        for _ in range(5):
            before = ctl.value
            ctl.update(current_kl=0.5, n_steps=10)
            assert ctl.value > before
        for _ in range(5):
            before = ctl.value
            ctl.update(current_kl=0.01, n_steps=10)
            assert ctl.value < before
        ctl.update(current_kl=torch.tensor(0.3).item(), n_steps=0)  # no samples: no change
        with pytest.raises(ValueError, match="current_kl"):
            ctl.update(current_kl=float("nan"), n_steps=1)
        with pytest.raises(ValueError, match="target"):
            AdaptiveKLController(init_coef=0.1, target=0.0, horizon=1)
        with pytest.raises(ValueError, match="horizon"):
            AdaptiveKLController(init_coef=0.1, target=1.0, horizon=0)

    def test_apply_kl_penalty_hand_values(self):
        scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
        ref = torch.zeros(2, 3, dtype=F64)
        logprob = t([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])  # k1 = logprob - 0
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
        rewards, mean_kl = apply_kl_penalty(scores, logprob, ref, mask, kl_coef=0.5, kind="k1")
        # rewards = scores - 0.5 * kl on valid tokens; padding keeps its score (0)
        assert_close(rewards, t([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]]))
        # per-sequence means 0.2 and 0.45 -> 0.325
        assert_close(mean_kl, scalar(0.325))
        with pytest.raises(ValueError, match="kl_coef"):
            apply_kl_penalty(scores, logprob, ref, mask, kl_coef=-1.0)
        with pytest.raises(ValueError, match="'nope'"):
            apply_kl_penalty(scores, logprob, ref, mask, kl_coef=0.1, kind="nope")


# --------------------------------------------------------------------------- aggregation


class TestAggregate:
    LOSS = t([[1.0, 2.0, 3.0], [4.0, 100.0, float("nan")]])
    MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])

    def test_modes_differ_on_unequal_lengths(self):
        # token-mean: (1+2+3+4)/4 = 2.5; seq-mean-token-sum: (6 + 4)/2 = 5; seq-mean-token-mean: (2 + 4)/2 = 3
        assert_close(aggregate_loss(self.LOSS, self.MASK, "token-mean"), scalar(2.5))
        assert_close(aggregate_loss(self.LOSS, self.MASK, "seq-mean-token-sum"), scalar(5.0))
        assert_close(aggregate_loss(self.LOSS, self.MASK, "seq-mean-token-mean"), scalar(3.0))
        assert sorted(LOSS_AGG_MODES) == ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]

    def test_equal_lengths_token_mean_equals_seq_mean_token_mean(self):
        loss = t([[1.0, 2.0], [3.0, 6.0]])
        mask = torch.ones(2, 2)
        assert_close(aggregate_loss(loss, mask, "token-mean"), scalar(3.0))
        assert_close(aggregate_loss(loss, mask, "seq-mean-token-mean"), scalar(3.0))

    def test_empty_sequence_left_out_of_sequence_means(self):
        loss = t([[1.0, 3.0], [9.0, 9.0]])
        mask = torch.tensor([[1, 1], [0, 0]])
        assert_close(aggregate_loss(loss, mask, "seq-mean-token-sum"), scalar(4.0))
        assert_close(aggregate_loss(loss, mask, "seq-mean-token-mean"), scalar(2.0))
        assert_close(aggregate_loss(loss, torch.zeros(2, 2), "seq-mean-token-mean"), scalar(0.0))

    def test_gradient_token_mean(self):
        loss = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).requires_grad_()
        aggregate_loss(loss, self.MASK, "token-mean").backward()
        assert loss.grad is not None
        assert_close(loss.grad, t([[0.25, 0.25, 0.25], [0.25, 0.0, 0.0]]))

    def test_unknown_mode_raises(self):
        with pytest.raises(ValueError, match="'seq-sum'"):
            aggregate_loss(self.LOSS, self.MASK, "seq-sum")


# --------------------------------------------------------------------------- policy loss


class TestPolicyLoss:
    def test_clip_fraction_and_loss_hand_values(self):
        # tokens (A, r): (+1, 1.5) clipped to 1.2 -> loss -1.2, clipped
        #                (+1, 0.5) unclipped (min-of-objective keeps 0.5) -> -0.5
        #                (-1, 0.5) clipped to 0.8 -> +0.8, clipped
        #                (-1, 1.1) inside the range -> +1.1
        #                padding with r = 100, would be clipped, must not count
        ratios = [1.5, 0.5, 0.5, 1.1, 100.0]
        logprob = t([[math.log(r) for r in ratios]])
        old = torch.zeros(1, 5, dtype=F64)
        adv = t([[1.0, 1.0, -1.0, -1.0, 1.0]])
        mask = torch.tensor([[1, 1, 1, 1, 0]])
        loss, clipfrac, approx_kl, clipfrac_lower = policy_loss(old, logprob, adv, mask, 0.2, 0.2)
        # (-1.2 - 0.5 + 0.8 + 1.1) / 4 = 0.05
        assert_close(loss, scalar(0.05))
        assert_close(clipfrac, scalar(0.5))
        assert_close(clipfrac_lower, scalar(0.0))
        # mean(old - new) = -(ln 1.5 + 2 ln 0.5 + ln 1.1)/4 = -(0.405465 - 1.386294 + 0.095310)/4
        assert_close(approx_kl, scalar(0.8855187635211994 / 4))

    def test_dual_clip_caps_negative_advantage(self):
        # A = -1, r = 5: max(5, 1.2) = 5, capped at 3 * 1 = 3
        # A = -2, r = 1.1: loss 2.2 < cap 6, untouched
        # A = +1, r = 5: no dual clip for positive A; clipped to -1.2
        logprob = t([[math.log(5.0), math.log(1.1), math.log(5.0)]]).requires_grad_()
        old = torch.zeros(1, 3, dtype=F64)
        adv = t([[-1.0, -2.0, 1.0]])
        loss, clipfrac, _, clipfrac_lower = policy_loss(old, logprob, adv, torch.ones(1, 3), 0.2, 0.2, 3.0)
        assert_close(loss, scalar((3.0 + 2.2 - 1.2) / 3.0))
        assert_close(clipfrac, scalar(1.0 / 3.0))  # only the A=+1 token
        assert_close(clipfrac_lower, scalar(1.0 / 3.0))  # only the A=-1, r=5 token
        loss.backward()
        # d/dlogprob of -A * r is -A * r; capped and clipped tokens get 0:
        # [0, 2 * 1.1 / 3, 0]
        assert logprob.grad is not None
        assert_close(logprob.grad, t([[0.0, 2.2 / 3.0, 0.0]]))

    def test_asymmetric_clip_higher(self):
        # A = +1, r = 1.25: clip_high 0.28 leaves it unclipped (-1.25), clip_high 0.2 clips (-1.2)
        logprob = t([[math.log(1.25)]])
        old = torch.zeros(1, 1, dtype=F64)
        adv = t([[1.0]])
        mask = torch.ones(1, 1)
        assert_close(policy_loss(old, logprob, adv, mask, 0.2, 0.28)[0], scalar(-1.25))
        assert_close(policy_loss(old, logprob, adv, mask, 0.2, 0.2)[0], scalar(-1.2))

    def test_loss_agg_mode_passed_through(self):
        # ratio 1 everywhere: per-token loss = -A
        old = torch.zeros(2, 2, dtype=F64)
        adv = t([[1.0, 3.0], [2.0, 0.0]])
        mask = torch.tensor([[1, 1], [1, 0]])
        # token-mean: -(1+3+2)/3 = -2 ; seq-mean-token-sum: -(4 + 2)/2 = -3
        assert_close(policy_loss(old, old.clone(), adv, mask, loss_agg_mode="token-mean")[0], scalar(-2.0))
        assert_close(policy_loss(old, old.clone(), adv, mask, loss_agg_mode="seq-mean-token-sum")[0], scalar(-3.0))

    def test_validation(self):
        x = torch.zeros(1, 2, dtype=F64)
        m = torch.ones(1, 2)
        with pytest.raises(ValueError, match="clip_ratio_c"):
            policy_loss(x, x, x, m, clip_ratio_c=1.0)
        with pytest.raises(ValueError, match="clip_low"):
            policy_loss(x, x, x, m, clip_low=1.0)
        with pytest.raises(ValueError, match="'bogus'"):
            policy_loss(x, x, x, m, loss_agg_mode="bogus")
        with pytest.raises(ValueError, match="shape mismatch"):
            policy_loss(x, torch.zeros(1, 3, dtype=F64), x, m)


# --------------------------------------------------------------------------- value loss


class TestValueLoss:
    def test_hand_values(self):
        # token 0: v=1.5, old=1.0, R=2.0, clip 0.2 -> v_clip=1.2; (1.5-2)^2=0.25, (1.2-2)^2=0.64 -> 0.64, clipped
        # token 1: v=old=0, R=1 -> both 1 -> 1, not clipped
        # token 2: v=1.5, old=1.0, R=1.0 -> 0.25 vs (1.2-1)^2=0.04 -> 0.25, not clipped
        # token 3: padding
        values = t([[1.5, 0.0, 1.5, 50.0]]).requires_grad_()
        old = t([[1.0, 0.0, 1.0, 0.0]])
        ret = t([[2.0, 1.0, 1.0, -50.0]])
        mask = torch.tensor([[1, 1, 1, 0]])
        loss, clipfrac = value_loss(values, old, ret, mask, cliprange_value=0.2)
        # 0.5 * (0.64 + 1 + 0.25) / 3 = 0.315
        assert_close(loss, scalar(0.315))
        assert_close(clipfrac, scalar(1.0 / 3.0))
        loss.backward()
        # grad of 0.5 * (v - R)^2 / 3 is (v - R) / 3 for the unclipped branch; 0 for the clipped one
        assert values.grad is not None
        assert_close(values.grad, t([[0.0, -1.0 / 3.0, 0.5 / 3.0, 0.0]]))

    def test_validation(self):
        x = torch.zeros(1, 2, dtype=F64)
        m = torch.ones(1, 2)
        with pytest.raises(ValueError, match="cliprange_value"):
            value_loss(x, x, x, m, cliprange_value=-0.1)
        with pytest.raises(ValueError, match="'x'"):
            value_loss(x, x, x, m, loss_agg_mode="x")


# --------------------------------------------------------------------------- logits


class TestLogits:
    def test_entropy_hand_values(self):
        logits = t([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -float("inf"), -float("inf")]]])
        # uniform over 4 -> ln 4 = 1.3862943611198906
        # p = [1/4, 3/4] -> 0.25 ln 4 + 0.75 ln(4/3) = 0.5623351446188083
        expected = t([[1.3862943611198906, 0.5623351446188083]])
        assert_close(entropy_from_logits(logits), expected)
        # shift invariance with huge logits (a naive exp overflows)
        assert_close(entropy_from_logits(logits + 1e4), expected)

    def test_entropy_grad_finite_with_neg_inf(self):
        logits = t([[[0.0, 1.0, -float("inf")]]]).requires_grad_()
        entropy_from_logits(logits).sum().backward()
        assert logits.grad is not None
        assert torch.isfinite(logits.grad).all()

    def test_entropy_bf16_upcasts(self):
        out = entropy_from_logits(torch.zeros(2, 3, 8, dtype=torch.bfloat16))
        assert out.dtype == torch.float32 and out.shape == (2, 3)
        assert_close(out, torch.full((2, 3), math.log(8.0)))

    def test_logprobs_hand_values(self):
        logits = t([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
        labels = torch.tensor([[1, 0]])
        # softmax = [0.25, 0.75]
        expected = t([[math.log(0.75), math.log(0.25)]])
        assert_close(logprobs_from_logits(logits, labels), expected)
        assert_close(logprobs_from_logits(logits + 1e4, labels), expected)

    def test_logprobs_validation(self):
        with pytest.raises(ValueError, match="labels shape"):
            logprobs_from_logits(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
        with pytest.raises(ValueError, match="integer"):
            logprobs_from_logits(torch.zeros(1, 2, 3), torch.zeros(1, 2))
