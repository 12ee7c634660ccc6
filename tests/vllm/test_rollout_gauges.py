"""warden_rollout_*: the pure fold of vLLM's scheduler stats, against fakes of vLLM's stats objects.

Runs in the main environment (no vLLM needed); test_vllm_scheduler_gauges.py checks the real
engine in the vllm stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from trainer.rollout_vllm import RolloutCollector, SchedulerState, _tap_stats, rollout_started, scheduler_state


@dataclass
class FakeSchedulerStats:
    """The attributes of vllm.v1.metrics.stats.SchedulerStats that the gauges read."""

    num_running_reqs: object = 0
    num_waiting_reqs: object = 0
    kv_cache_usage: object = 0.0


@dataclass
class FakeOldSchedulerStats:
    """Older vLLM releases call the KV-cache share gpu_cache_usage."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    gpu_cache_usage: float = 0.0


@dataclass
class FakeIterationStats:
    """The attribute of vllm.v1.metrics.stats.IterationStats that the gauges read."""

    num_preempted_reqs: object = 0


def fold(state, *steps):
    for sched, it in steps:
        state = scheduler_state(state, sched, it)
    return state


def test_queueing_peaks_over_a_rollout_and_starts_over_with_the_next():
    state = SchedulerState(max_num_seqs=2)
    state = fold(
        state,
        (FakeSchedulerStats(2, 6, 0.3), FakeIterationStats(0)),
        (FakeSchedulerStats(2, 4, 0.5), FakeIterationStats(0)),
        (FakeSchedulerStats(0, 0, 0.0), None),
    )
    assert (state.running, state.waiting) == (0, 0)
    assert (state.running_max, state.waiting_max, state.kv_cache_usage_max) == (2, 6, 0.5)
    fresh = rollout_started(state)
    assert (fresh.running_max, fresh.waiting_max, fresh.kv_cache_usage_max) == (0, 0, 0.0)
    assert fresh.max_num_seqs == 2


def test_preemptions_accumulate_and_old_vllm_names_are_read():
    state = fold(
        SchedulerState(),
        (FakeOldSchedulerStats(4, 1, 0.99), FakeIterationStats(3)),
        (None, FakeIterationStats(2)),
    )
    assert state.preemptions == 5 and state.kv_cache_usage == 0.99 and state.running == 4


def test_values_of_the_wrong_type_keep_the_previous_state():
    before = SchedulerState(running=3, waiting=1, kv_cache_usage=0.4, preemptions=7)
    after = scheduler_state(before, FakeSchedulerStats(True, -1, float("nan")), FakeIterationStats("5"))
    assert after == dataclass_replace_peaks(before)
    clipped = scheduler_state(before, FakeSchedulerStats(3, 1, 1.7), None)
    assert clipped.kv_cache_usage == 1.0


def dataclass_replace_peaks(state):
    """``state`` with its peaks raised to its current values (what one fold of unchanged stats gives)."""
    from dataclasses import replace

    return replace(
        state,
        running_max=state.running,
        waiting_max=state.waiting,
        kv_cache_usage_max=state.kv_cache_usage,
    )


def test_the_collector_exports_every_family_from_the_live_state():
    current = {"state": SchedulerState(max_num_seqs=16, max_num_batched_tokens=2048)}
    registry = CollectorRegistry()
    registry.register(RolloutCollector(lambda: current["state"]))
    assert registry.get_sample_value("warden_rollout_requests_waiting") == 0
    current["state"] = fold(current["state"], (FakeSchedulerStats(16, 9, 0.97), FakeIterationStats(4)))
    assert registry.get_sample_value("warden_rollout_requests_waiting") == 9
    assert registry.get_sample_value("warden_rollout_requests_running") == 16
    assert registry.get_sample_value("warden_rollout_max_num_seqs") == 16
    assert registry.get_sample_value("warden_rollout_max_num_batched_tokens") == 2048
    assert registry.get_sample_value("warden_rollout_preemptions_total") == 4
    assert math.isclose(registry.get_sample_value("warden_rollout_kv_cache_usage_max_ratio"), 0.97)
    assert b"warden_rollout_requests_waiting_max 9.0" in generate_latest(registry)


class FakeLoggerManager:
    """vLLM's StatLoggerManager.record(scheduler_stats, iteration_stats, ...)."""

    def __init__(self):
        self.recorded = []

    def record(self, scheduler_stats, iteration_stats, engine_idx=0):
        self.recorded.append((scheduler_stats, iteration_stats, engine_idx))


class FakeLLM:
    def __init__(self):
        self.llm_engine = type("Engine", (), {})()
        self.llm_engine.logger_manager = FakeLoggerManager()


def test_the_tap_sees_each_step_and_vllm_still_records_it():
    llm, seen = FakeLLM(), []
    assert _tap_stats(llm, lambda s, i: seen.append((s, i)))
    sched, it = FakeSchedulerStats(1, 2, 0.1), FakeIterationStats(0)
    llm.llm_engine.logger_manager.record(sched, it, engine_idx=0)
    llm.llm_engine.logger_manager.record(scheduler_stats=None, iteration_stats=it)
    assert seen == [(sched, it), (None, it)]
    assert len(llm.llm_engine.logger_manager.recorded) == 2
    assert not _tap_stats(object(), lambda s, i: None)


def test_preemptions_of_the_last_rollout_start_over_with_each_rollout():
    """warden_rollout_preemptions_last: the preemptions of the current (or last) rollout only."""
    registry = CollectorRegistry()
    current = {"state": SchedulerState(max_num_seqs=4)}
    registry.register(RolloutCollector(lambda: current["state"]))
    current["state"] = fold(rollout_started(current["state"]), (FakeSchedulerStats(4, 2, 1.0), FakeIterationStats(3)))
    assert registry.get_sample_value("warden_rollout_preemptions_last") == 3
    current["state"] = fold(rollout_started(current["state"]), (FakeSchedulerStats(4, 0, 0.5), FakeIterationStats(0)))
    assert registry.get_sample_value("warden_rollout_preemptions_last") == 0
    assert registry.get_sample_value("warden_rollout_preemptions_total") == 3
