"""Cause in seconds, end to end: a real tiny PPO run (HF engine) whose reward function turns slow
mid-run, a real Prometheus scraping it with the generated recording rules, and ``warden diagnose``.

Measured (printed): from the start of the first slow step to Prometheus returning
``warden_rollout_slow_cause{cause="reward_scoring"}``, and to ``warden diagnose`` naming it. The slow
step itself is part of that time: its gauges exist only when it completes. The harness is
tests/causes_live.py (shared with tests/vllm/test_rollout_causes_vllm.py, the vLLM engine).
"""

from __future__ import annotations

import pytest
from causes_live import measure_slowdown

pytestmark = pytest.mark.slow


def test_a_slow_reward_is_named_within_seconds_by_the_rules_and_by_diagnose(tmp_path):
    measure_slowdown(tmp_path, "reward_scoring", "cause: Reward scoring (reward_scoring")


def test_one_slow_rank_of_two_is_named_within_seconds(tmp_path):
    """torchrun, two CPU ranks (gloo); only rank 1's reward function slows: the rank is named."""
    measure_slowdown(tmp_path, "slow_rank", "rank 1 took", ranks=2, env={"SLOW_RANKS": "1"})
