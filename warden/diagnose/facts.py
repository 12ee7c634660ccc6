"""The facts of the last step, from a run's journal and from ``/metrics`` endpoints (the I/O edge).

The journal's newest ``step.completed`` gives the time split (``timings``: ``data_s``, ``rollout_s``,
``reward_s``, ``step_s``, ``rank_rollout_s``) and, for the vLLM engine, the scheduler's peaks of that
step's rollout (``scheduler``). A ``/metrics`` scrape gives the same as gauges (newer when the trainer
is between journal writes) and DCGM's GPU utilisation; a fact from a scrape wins over the journal's.
Pure parsing (:func:`facts_from_step`, :func:`facts_from_metrics`, :func:`merge`) is separate from reading.
"""

from __future__ import annotations

import math
import os
import stat
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from warden.diagnose import causes as c
from warden.errors import ConfigError, IncompleteError, quote_untrusted
from warden.journal import JOURNAL_NAME, STEP_COMPLETED, JournalReader

MAX_METRICS_BYTES = 16 * 1024 * 1024
TIMEOUT_S = 5.0


class DiagnoseError(IncompleteError):
    """The facts could not be read (exit 3)."""


class DiagnoseUsageError(ConfigError):
    """A run directory or URL that cannot be one (exit 2)."""


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def facts_from_step(step: int | None, data: Mapping[str, Any]) -> c.Facts:
    """The facts a ``step.completed`` payload carries (anything missing or malformed stays None)."""
    timings = data.get("timings")
    t: Mapping[str, Any] = timings if isinstance(timings, Mapping) else {}
    ranks_raw = t.get("rank_rollout_s")
    ranks = [_number(r) for r in ranks_raw] if isinstance(ranks_raw, list) else []
    sched_raw = data.get("scheduler")
    sched: Mapping[str, Any] = sched_raw if isinstance(sched_raw, Mapping) else {}
    return c.Facts(
        step=step,
        step_s=_number(t.get("step_s")),
        data_s=_number(t.get("data_s")),
        generation_s=_number(t.get("rollout_s")),
        reward_s=_number(t.get("reward_s")),
        rank_rollout_s=tuple(r for r in ranks if r is not None) if None not in ranks else (),
        max_num_seqs=_number(sched.get("max_num_seqs")),
        running_max=_number(sched.get("running_max")),
        waiting_max=_number(sched.get("waiting_max")),
        kv_cache_usage_max=_number(sched.get("kv_cache_usage_max")),
        preemptions_last=_number(sched.get("preemptions_last")),
        sources=("journal",),
    )


_GAUGES = {
    c.STEP: "step_s",
    c.RUNNING_MAX: "running_max",
    c.WAITING_MAX: "waiting_max",
    c.MAX_NUM_SEQS: "max_num_seqs",
    c.KV_MAX: "kv_cache_usage_max",
    c.PREEMPTED: "preemptions_last",
}
_PHASES = {"data": "data_s", "generation": "generation_s", "reward": "reward_s"}


def _rank(label: str) -> bool:
    return label.isascii() and label.isdigit() and len(label) <= 6


def facts_from_metrics(text: str, source: str = "metrics") -> c.Facts:
    """The facts of one exposition text (the trainer's, a DCGM exporter's). Raises DiagnoseError."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, Any] = {}
    ranks: dict[int, float] = {}
    gpu: list[float] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = _number(sample.value)
                if value is None:
                    continue
                if sample.name in _GAUGES:
                    values[_GAUGES[sample.name]] = value
                elif sample.name == c.PHASE and sample.labels.get("phase") in _PHASES:
                    values[_PHASES[sample.labels["phase"]]] = value
                elif sample.name == c.RANK and _rank(sample.labels.get("rank", "")):
                    ranks[int(sample.labels["rank"])] = value
                elif sample.name == c.GPU_UTIL:
                    gpu.append(value)
                elif sample.name == "warden_trainer_last_step":
                    values["step"] = int(value)
    except ValueError as exc:
        raise DiagnoseError(f"{source}: not a Prometheus exposition: {quote_untrusted(str(exc))}") from None
    if ranks:
        values["rank_rollout_s"] = tuple(ranks[r] for r in sorted(ranks))
    if gpu:
        values["gpu_util_max"] = max(gpu)
    return replace(c.Facts(sources=(source,)), **values)


def merge(base: c.Facts, newer: c.Facts) -> c.Facts:
    """``base`` with every fact ``newer`` knows taken from ``newer``."""
    known: dict[str, Any] = {}
    for f in fields(c.Facts):
        value = getattr(newer, f.name)
        if f.name != "sources" and value is not None and value != ():
            known[f.name] = value
    return replace(base, **known, sources=base.sources + newer.sources)


def journal_of(run_dir: str) -> str:
    """``<run_dir>/events.jsonl``, a regular file. Raises DiagnoseUsageError."""
    path = os.path.join(run_dir, JOURNAL_NAME)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise DiagnoseUsageError(f"{path}: no journal there (is --run-dir a run directory?)") from None
    if not stat.S_ISREG(mode):
        raise DiagnoseUsageError(f"{path}: not a regular file, so not a journal")
    return path


def last_step_facts(run_dir: str) -> c.Facts | None:
    """The facts of the journal's newest ``step.completed``; None when it has none."""
    newest = None
    reader = JournalReader(journal_of(run_dir))
    for event, _ in reader.read_available():
        if event.type == STEP_COMPLETED:
            newest = event
    return None if newest is None else facts_from_step(newest.step, newest.data)


def scrape(url: str) -> str:
    """The body of ``url`` (http or https only, at most MAX_METRICS_BYTES). Raises DiagnoseError."""
    if not url.startswith(("http://", "https://")):
        raise DiagnoseUsageError(f"--metrics {quote_untrusted(url)}: not an http(s) URL")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            body = resp.read(MAX_METRICS_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DiagnoseError(f"--metrics {quote_untrusted(url)}: {quote_untrusted(str(exc))}") from None
    if len(body) > MAX_METRICS_BYTES:
        raise DiagnoseError(f"--metrics {quote_untrusted(url)}: more than {MAX_METRICS_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def gather(run_dir: str | None, urls: Iterable[str]) -> c.Facts:
    """The journal's facts, then each scrape's over them. Raises DiagnoseError when nothing is known."""
    facts = c.Facts()
    if run_dir is not None:
        found = last_step_facts(run_dir)
        if found is not None:
            facts = merge(facts, found)
    for url in urls:
        facts = merge(facts, facts_from_metrics(scrape(url), url))
    if facts.step_s is None and facts.max_num_seqs is None:
        where = " and ".join(filter(None, [run_dir and f"{run_dir}'s journal", *urls])) or "nothing"
        raise DiagnoseError(f"no completed step to diagnose in {where}")
    return facts
