"""Why a rollout is slow: one table of causes, the facts they read, and the number to change. Pure.

The table :data:`CAUSES` is the truth. Each cause has a Python reading of :class:`Facts` (used by
``warden diagnose``) and the same condition as PromQL over the trainer's gauges, from which
:func:`recording_rules` generates ``alerts/rules/rollout-causes.yml`` (a test regenerates and compares,
another feeds both sides the same random facts and demands the same causes). The rules have no
``for:``: a cause is named at the first evaluation after the scrape of the slow step's gauges.

Every fact is a gauge of the *last* step or rollout (``warden_trainer_last_step_*``,
``warden_trainer_rank_rollout_seconds``, ``warden_rollout_*_max``, ``warden_rollout_preemptions_last``),
so no rate window has to fill first. Thresholds are parameters (module constants, named in the output).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Parameters. A phase is "the cause" when it takes at least STEP_SHARE of the step and MIN_SECONDS;
# a rank is slow at SLOW_RANK_RATIO x the fastest and MIN_SECONDS more; the KV cache is full at
# KV_FULL; the GPUs idle below GPU_IDLE_PERCENT (DCGM's utilisation, the busiest GPU).
STEP_SHARE = 0.25
MIN_SECONDS = 0.5
SLOW_RANK_RATIO = 1.5
KV_FULL = 0.95
GPU_IDLE_PERCENT = 20.0

RECORD = "warden_rollout_slow_cause"
GROUP = "warden-rollout-cause-now"

# Metric names the rules read (exported by trainer/metrics.py and trainer/rollout_vllm.py; DCGM).
STEP = "warden_trainer_last_step_seconds"
PHASE = "warden_trainer_last_step_phase_seconds"
RANK = "warden_trainer_rank_rollout_seconds"
RUNNING_MAX = "warden_rollout_requests_running_max"
WAITING_MAX = "warden_rollout_requests_waiting_max"
MAX_NUM_SEQS = "warden_rollout_max_num_seqs"
KV_MAX = "warden_rollout_kv_cache_usage_max_ratio"
PREEMPTED = "warden_rollout_preemptions_last"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"


@dataclass(frozen=True)
class Facts:
    """The last step of one trainer, as its gauges or its journal tell it. None: not known."""

    step: int | None = None
    step_s: float | None = None
    data_s: float | None = None
    generation_s: float | None = None
    reward_s: float | None = None
    rank_rollout_s: tuple[float, ...] = ()  # each rank's own generation + scoring, rank order
    max_num_seqs: float | None = None  # vLLM engine only
    running_max: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_max: float | None = None  # 0..1
    preemptions_last: float | None = None
    gpu_util_max: float | None = None  # percent, the busiest GPU (DCGM)
    sources: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Finding:
    """A cause that holds: ``value`` is what the recording rule records, ``advice`` what to change."""

    cause: str
    title: str
    setting: str
    measure: str
    value: float
    advice: str

    def to_data(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "setting": self.setting,
            "measure": self.measure,
            "value": self.value,
            "advice": self.advice,
        }


@dataclass(frozen=True)
class Cause:
    name: str
    title: str
    setting: str  # the setting the advice changes (a label of the recorded series)
    measure: str  # what the recorded value is
    expr: str  # PromQL: a series per trainer where the cause holds, valued as ``value``
    value: Callable[[Facts], float | None]  # None: does not hold (or not known)
    advice: Callable[[Facts, float], str]


def _share(part: float | None, facts: Facts) -> float | None:
    whole = facts.step_s
    if part is None or whole is None or whole <= 0 or part < MIN_SECONDS:
        return None
    share = part / whole
    return share if share >= STEP_SHARE else None


def _queueing(f: Facts) -> float | None:
    m, run, wait = f.max_num_seqs, f.running_max, f.waiting_max
    if m is None or run is None or wait is None:
        return None
    return run + wait if wait > 0 and m > 0 and run >= m else None


def _kv_full(f: Facts) -> float | None:
    kv, pre = f.kv_cache_usage_max, f.preemptions_last
    if kv is None or pre is None:
        return None
    return pre if pre > 0 and kv >= KV_FULL else None


def _slow_rank(f: Facts) -> float | None:
    ranks = f.rank_rollout_s
    if len(ranks) < 2:
        return None
    hi, lo = max(ranks), min(ranks)
    ratio = hi / lo if lo > 0 else math.inf
    return ratio if ratio >= SLOW_RANK_RATIO and hi - lo >= MIN_SECONDS else None


def _gpu_idle(f: Facts) -> float | None:
    util = f.gpu_util_max
    if util is None or f.step_s is None:
        return None
    return util if util < GPU_IDLE_PERCENT else None


def _n(value: float | None) -> str:
    """A count or size as text (``32``, not ``32.0``)."""
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _queueing_advice(f: Facts, value: float) -> str:
    return (
        f"up to {_n(f.waiting_max)} request(s) waited while {_n(f.running_max)} ran at max_num_seqs: "
        f"raise rollout.max_num_seqs from {_n(f.max_num_seqs)} to >= {_n(value)} (KV cache permitting)"
    )


def _kv_advice(f: Facts, value: float) -> str:
    fits = max(1, math.floor((f.running_max or f.max_num_seqs or 1) * 0.9))
    return (
        f"the KV cache peaked at {f.kv_cache_usage_max or 0:.0%} and vLLM preempted {_n(value)} request(s) "
        f"(recomputed): raise rollout.gpu_memory_utilization or rollout.kv_cache_gib, or lower "
        f"rollout.max_num_seqs from {_n(f.max_num_seqs)} to <= {fits}"
    )


def _phase_advice(what: str, part: Callable[[Facts], float | None], change: str) -> Callable[[Facts, float], str]:
    def advice(f: Facts, value: float) -> str:
        return f"{what} took {part(f) or 0:.2f} s of the {f.step_s or 0:.2f} s step ({value:.0%}): {change}"

    return advice


def _slow_rank_advice(f: Facts, value: float) -> str:
    ranks = f.rank_rollout_s
    slow = ranks.index(max(ranks))
    return (
        f"rank {slow} took {max(ranks):.2f} s for its generation and scoring, the fastest {min(ranks):.2f} s "
        f"({value:.1f}x), and every rank waits for it: check rank {slow}'s node (GPU clocks, thermals, "
        f"another job, its mounts) or restart without it"
    )


def _gpu_idle_advice(f: Facts, value: float) -> str:
    return (
        f"the busiest GPU is {value:.0f}% utilised (< {GPU_IDLE_PERCENT:.0f}%): the engine waits for work; "
        f"look at data loading and reward scoring above, or raise ppo.train_batch_size / rollout.n"
    )


def _phase_expr(phase: str) -> str:
    part = f'sum without (phase) ({PHASE}{{phase="{phase}"}})'
    return f"({part} / {STEP} >= {STEP_SHARE}) and ({part} >= {MIN_SECONDS}) and ({STEP} > 0)"


_HI = f"max without (rank) ({RANK})"
_LO = f"min without (rank) ({RANK})"

CAUSES: tuple[Cause, ...] = (
    Cause(
        "queueing_at_max_num_seqs",
        "Requests queue at max_num_seqs",
        "rollout.max_num_seqs",
        "max_num_seqs that would run every request",
        f"({RUNNING_MAX} + {WAITING_MAX}) and ({WAITING_MAX} > 0) and ({MAX_NUM_SEQS} > 0)"
        f" and ({RUNNING_MAX} >= {MAX_NUM_SEQS})",
        _queueing,
        _queueing_advice,
    ),
    Cause(
        "kv_cache_full",
        "KV cache full: requests preempted",
        "rollout.gpu_memory_utilization",
        "requests preempted in the last rollout",
        f"({PREEMPTED} > 0) and ({KV_MAX} >= {KV_FULL})",
        _kv_full,
        _kv_advice,
    ),
    Cause(
        "data_loading",
        "Data loading",
        "data",
        "share of the step",
        _phase_expr("data"),
        lambda f: _share(f.data_s, f),
        _phase_advice(
            "loading the batch",
            lambda f: f.data_s,
            "the prompt pipeline is the bottleneck: data.train_files on a slow or hung mount (WardenPath*), "
            "or too few loader workers (verl: data.dataloader_num_workers)",
        ),
    ),
    Cause(
        "reward_scoring",
        "Reward scoring",
        "reward.functions",
        "share of the step",
        _phase_expr("reward"),
        lambda f: _share(f.reward_s, f),
        _phase_advice(
            "decoding and scoring",
            lambda f: f.reward_s,
            "the reward function or reward model is the bottleneck: make reward.functions faster (batch it, "
            "cache it, a smaller reward model) before touching generation",
        ),
    ),
    Cause(
        "slow_rank",
        "One rank is slow",
        "the slow rank's node",
        "slowest rank / fastest rank",
        f"({_HI} / {_LO} >= {SLOW_RANK_RATIO}) and ({_HI} - {_LO} >= {MIN_SECONDS})",
        _slow_rank,
        _slow_rank_advice,
    ),
    Cause(
        "gpu_idle",
        "GPUs idle",
        "ppo.train_batch_size",
        "utilisation of the busiest GPU (%)",
        f"{STEP} * 0 + on () group_left () (max({GPU_UTIL}) < {GPU_IDLE_PERCENT})",
        _gpu_idle,
        _gpu_idle_advice,
    ),
)


def diagnose(facts: Facts) -> list[Finding]:
    """The causes that hold for ``facts``, in table order (pure)."""
    out = []
    for cause in CAUSES:
        value = cause.value(facts)
        if value is not None:
            out.append(
                Finding(cause.name, cause.title, cause.setting, cause.measure, value, cause.advice(facts, value))
            )
    return out


def recording_rules() -> dict[str, Any]:
    """The rule file (as YAML data) with one recording rule per cause, labelled with the cause."""
    rules = [
        {
            "record": RECORD,
            "expr": cause.expr,
            "labels": {"cause": cause.name, "setting": cause.setting, "measure": cause.measure},
        }
        for cause in CAUSES
    ]
    return {"groups": [{"name": GROUP, "rules": rules}]}


RULES_HEADER = """\
# GENERATED from warden/diagnose/causes.py (CAUSES): do not edit; regenerate with
#   python -m warden.diagnose --write-rules alerts/rules/rollout-causes.yml
# One series per cause that holds for a trainer's last step, no `for:`: the cause is named at the
# first evaluation after the slow step's gauges are scraped. `warden diagnose` reads the same table.
# The paging alerts (warden-rollout-causes in trainer.yml) keep their `for:` durations.
"""


def rules_text() -> str:
    """The text of ``alerts/rules/rollout-causes.yml``."""
    import yaml

    return RULES_HEADER + yaml.safe_dump(recording_rules(), sort_keys=False, width=100_000)
