"""Metric names of other trainers -> Prometheus-safe names. Pure functions, no I/O.

verl and TRL name metrics like paths (``actor/pg_loss``, ``val-core/openai/gsm8k/reward/mean@4``).
Prometheus names must match ``[a-zA-Z_][a-zA-Z0-9_]*`` (Warden also forbids colons), so
:func:`prometheus_name` rewrites them, one character at a time, by this table:

==============================  ==========  =============================================
character                       becomes     example
==============================  ==========  =============================================
``@``                           ``_at_``    ``mean@4`` -> ``mean_at_4``
``/``                           ``_``       ``actor/pg_loss`` -> ``actor_pg_loss``
``-``                           ``_``       ``val-core`` -> ``val_core``
``.``                           ``_``       ``timing_s/update.actor`` -> ``timing_s_update_actor``
any other character outside     ``_``       ``mfu%`` -> ``mfu_``, ``tööl`` -> ``t__l``
``[A-Za-z0-9_]`` (incl. ``:``)
a leading digit                 ``_`` + it  ``4bit/loss`` -> ``_4bit_loss``
the empty name                  ``_``
==============================  ==========  =============================================

Letters, digits and ``_`` are kept as they are; runs of ``_`` are not collapsed, so the
mapping stays easy to predict. Two names can map to one (``a/b`` and ``a_b``):
:func:`map_metrics` keeps the first in sorted order of the original names and reports
the others as collisions. The bridge exports the mapped names as ``warden_verl_<name>``
gauges and puts them as keys into ``step.completed`` events; :data:`VERL_ALIASES` (and
:data:`HF_ALIASES` for the HF callback) add the names the Warden trainer uses
(``reward_mean``, ``kl``, ...) so dashboards and the demo summary work unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SUBSTITUTIONS: tuple[tuple[str, str], ...] = (("@", "_at_"), ("/", "_"), ("-", "_"), (".", "_"))
_OTHER = re.compile(r"[^A-Za-z0-9_]")
VALID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

# Warden trainer metric name -> verl names that mean it, first present wins.
VERL_ALIASES: dict[str, tuple[str, ...]] = {
    "reward_mean": ("critic/score/mean", "critic/rewards/mean"),
    "reward_max": ("critic/score/max", "critic/rewards/max"),
    "kl": ("actor/reward_kl_penalty", "actor/kl_loss"),
    "kl_coef": ("actor/reward_kl_penalty_coeff", "actor/kl_coef"),
    "policy_loss": ("actor/pg_loss",),
    "value_loss": ("critic/vf_loss",),
    "entropy": ("actor/entropy",),
    "clip_fraction": ("actor/pg_clipfrac",),
    "grad_norm": ("actor/grad_norm",),
    "lr": ("actor/lr",),
}
# The same for HF Trainer / TRL logs (GRPOTrainer, PPOTrainer, plain Trainer).
HF_ALIASES: dict[str, tuple[str, ...]] = {
    "reward_mean": ("reward", "objective/rlhf_reward", "objective/scores"),
    "kl": ("kl", "objective/kl"),
    "policy_loss": ("loss/policy_avg",),
    "value_loss": ("loss/value_avg",),
    "entropy": ("entropy", "policy/entropy_avg"),
    "clip_fraction": ("policy/clipfrac_avg", "clip_ratio/region_mean"),
    "grad_norm": ("grad_norm",),
    "lr": ("learning_rate",),
}
WARDEN_ALIASES = VERL_ALIASES
# The Warden trainer's "timings" object, from verl's timing_s/* (seconds).
TIMING_ALIASES: dict[str, str] = {
    "step_s": "timing_s/step",
    "rollout_s": "timing_s/gen",
    "update_s": "timing_s/update_actor",
}


def prometheus_name(name: str) -> str:
    """``name`` rewritten by the module's table; always matches ``[A-Za-z_][A-Za-z0-9_]*``."""
    out = name
    for char, replacement in SUBSTITUTIONS:
        out = out.replace(char, replacement)
    out = _OTHER.sub("_", out)
    if not out:
        return "_"
    return "_" + out if out[0] in "0123456789" else out


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class MappedMetrics:
    """Numeric metrics under their mapped names; what was left out and why."""

    values: dict[str, float]
    collisions: tuple[str, ...]
    non_numeric: tuple[str, ...]


def map_metrics(metrics: Mapping[str, object]) -> MappedMetrics:
    """Finite numbers of ``metrics`` keyed by :func:`prometheus_name`.

    Non-numeric values (strings, lists, null for NaN) are listed in ``non_numeric``; an
    original name whose mapped name was already taken (sorted order) in ``collisions``.
    """
    values: dict[str, float] = {}
    collisions: list[str] = []
    skipped: list[str] = []
    for original in sorted(metrics):
        number = finite_number(metrics[original])
        if number is None:
            skipped.append(original)
            continue
        mapped = prometheus_name(original)
        if mapped in values:
            collisions.append(original)
            continue
        values[mapped] = number
    return MappedMetrics(values, tuple(collisions), tuple(skipped))


def warden_aliases(
    metrics: Mapping[str, object], table: Mapping[str, tuple[str, ...]] = VERL_ALIASES
) -> dict[str, object]:
    """The Warden trainer's names found among ``metrics`` (``table``: :data:`VERL_ALIASES` or :data:`HF_ALIASES`)."""
    out: dict[str, object] = {}
    for alias, sources in table.items():
        for source in sources:
            number = finite_number(metrics.get(source))
            if number is not None:
                out[alias] = number
                break
    timings = {k: finite_number(metrics.get(v)) for k, v in TIMING_ALIASES.items()}
    present = {k: v for k, v in timings.items() if v is not None}
    if present:
        out["timings"] = present
    return out


def mapping_table(names: Iterable[str]) -> list[tuple[str, str]]:
    """(original, mapped) for each name, sorted: what the docs' table shows for real keys."""
    return [(name, prometheus_name(name)) for name in sorted(set(names))]
