"""The cause table: each cause from the facts that make it, the number to change, and hostile inputs."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden.diagnose import causes as c
from warden.diagnose.facts import DiagnoseError, facts_from_metrics, facts_from_step, merge

EXAMPLES = settings(max_examples=int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", 50)), deadline=None)
HEALTHY = c.Facts(
    step=7,
    step_s=2.0,
    data_s=0.01,
    generation_s=1.2,
    reward_s=0.1,
    rank_rollout_s=(1.3, 1.31),
    max_num_seqs=32,
    running_max=16,
    waiting_max=0,
    kv_cache_usage_max=0.5,
    preemptions_last=0,
    gpu_util_max=85,
)


def names(facts: c.Facts) -> list[str]:
    return [f.cause for f in c.diagnose(facts)]


def test_a_healthy_step_names_no_cause():
    assert c.diagnose(HEALTHY) == []


@pytest.mark.parametrize(
    ("change", "cause", "words"),
    [
        (
            {"running_max": 32, "waiting_max": 32},
            "queueing_at_max_num_seqs",
            "raise rollout.max_num_seqs from 32 to >= 64",
        ),
        (
            {"kv_cache_usage_max": 0.99, "preemptions_last": 5, "running_max": 20},
            "kv_cache_full",
            "lower rollout.max_num_seqs from 32 to <= 18",
        ),
        ({"data_s": 1.5, "step_s": 3.5}, "data_loading", "loading the batch took 1.50 s of the 3.50 s step (43%)"),
        ({"reward_s": 2.4, "step_s": 4.0}, "reward_scoring", "decoding and scoring took 2.40 s of the 4.00 s step"),
        ({"rank_rollout_s": (1.3, 3.9, 1.2)}, "slow_rank", "rank 1 took 3.90 s"),
        ({"gpu_util_max": 4}, "gpu_idle", "the busiest GPU is 4% utilised"),
    ],
)
def test_each_cause_is_named_with_the_number_to_change(change, cause, words):
    facts = c.Facts(**{**HEALTHY.__dict__, **change})
    (finding,) = c.diagnose(facts)
    assert finding.cause == cause
    assert words in finding.advice, finding.advice


def test_thresholds_are_inclusive_and_floors_apply():
    at = c.Facts(step_s=2.0, data_s=0.5)  # 25 % and 0.5 s: both bounds met exactly
    assert names(at) == ["data_loading"]
    short = c.Facts(step_s=1.0, data_s=0.49)  # 49 % of the step, but under MIN_SECONDS
    assert names(short) == []
    assert names(c.Facts(rank_rollout_s=(1.0, 1.49))) == []  # under SLOW_RANK_RATIO and MIN_SECONDS
    assert names(c.Facts(rank_rollout_s=(0.0, 0.6))) == ["slow_rank"]  # a rank at 0 s: ratio inf
    assert math.isinf(c.diagnose(c.Facts(rank_rollout_s=(0.0, 0.6)))[0].value)


def test_unknown_facts_name_nothing():
    assert c.diagnose(c.Facts()) == []
    assert names(c.Facts(gpu_util_max=1)) == []  # no trainer step known: not the trainer's GPU idling


def test_several_causes_at_once_in_table_order():
    facts = c.Facts(step_s=4, data_s=1.2, reward_s=2.0, max_num_seqs=8, running_max=8, waiting_max=1)
    assert names(facts) == ["queueing_at_max_num_seqs", "data_loading", "reward_scoring"]


def test_facts_from_a_step_event_and_a_scrape_merge_newest_first():
    step = facts_from_step(
        4,
        {
            "timings": {"step_s": 3.0, "data_s": 0.1, "rollout_s": 1.0, "reward_s": 1.8, "rank_rollout_s": [2.8]},
            "scheduler": {"max_num_seqs": 16, "running_max": 16, "waiting_max": 3, "preemptions_last": 0},
        },
    )
    assert (step.step_s, step.reward_s, step.rank_rollout_s, step.waiting_max) == (3.0, 1.8, (2.8,), 3.0)
    text = (
        "# TYPE warden_trainer_last_step_seconds gauge\nwarden_trainer_last_step_seconds 5.0\n"
        '# TYPE warden_trainer_rank_rollout_seconds gauge\nwarden_trainer_rank_rollout_seconds{rank="1"} 4.0\n'
        'warden_trainer_rank_rollout_seconds{rank="0"} 1.0\n'
        '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 3\nDCGM_FI_DEV_GPU_UTIL{gpu="1"} 9\n'
    )
    scraped = facts_from_metrics(text, "http://t/metrics")
    assert scraped.rank_rollout_s == (1.0, 4.0) and scraped.gpu_util_max == 9
    both = merge(step, scraped)
    assert (both.step_s, both.reward_s, both.rank_rollout_s) == (5.0, 1.8, (1.0, 4.0))
    assert both.sources == ("journal", "http://t/metrics")
    assert names(both) == ["queueing_at_max_num_seqs", "reward_scoring", "slow_rank", "gpu_idle"]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
KEYS = st.sampled_from(["timings", "scheduler", "step_s", "rank_rollout_s", "rollout_s", "max_num_seqs"])


@EXAMPLES
@given(st.dictionaries(KEYS, JSONISH | st.dictionaries(KEYS, JSONISH, max_size=4), max_size=4))
def test_a_hostile_step_payload_reads_as_facts_never_an_exception(payload):
    """Whoever writes the journal: wrong types, NaN, negative, nested garbage read as unknown facts."""
    facts = facts_from_step(1, payload)
    for value in (facts.step_s, facts.data_s, facts.reward_s, facts.max_num_seqs, *facts.rank_rollout_s):
        assert value is None or (math.isfinite(value) and value >= 0)
    c.diagnose(facts)


@EXAMPLES
@given(st.text(max_size=300))
def test_a_hostile_exposition_is_facts_or_one_diagnose_error(text):
    try:
        facts = facts_from_metrics(text, "u")
    except DiagnoseError as exc:
        assert str(exc).startswith("u: not a Prometheus exposition")
    else:
        c.diagnose(facts)


def test_the_committed_rule_file_is_the_table_s_output():
    from support import ROOT

    with open(os.path.join(ROOT, "alerts", "rules", "rollout-causes.yml"), encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == c.rules_text(), "stale: python -m warden.diagnose --write-rules alerts/rules/rollout-causes.yml"


def test_the_rules_have_no_for_and_one_per_cause():
    (group,) = c.recording_rules()["groups"]
    assert [r["labels"]["cause"] for r in group["rules"]] == [x.name for x in c.CAUSES]
    assert all("for" not in r and r["record"] == c.RECORD for r in group["rules"])
