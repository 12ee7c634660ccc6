"""verl's per-step rollout dumps -> the top-k samples of a ``reward.snapshot`` event.

With ``trainer.rollout_data_dir=DIR`` verl writes ``DIR/{step}.jsonl`` once per training
step (``RayPPOTrainer._dump_generations``), one JSON object per sample::

    {"input": "<prompt>", "output": "<response>", "gts": "<ground truth>", "score": 1.0,
     "step": 12, "<reward extra info>": ...}

The file is written in place through a buffered text file, so a reader can see it
partial (cut anywhere, even at a line boundary). A dump counts as complete when its last
byte is a newline and one of these says the writer is done with it:

- verl's file logger has a line for this step or a later one, written after the dump
  (the dump is closed before the step's metrics are logged);
- a dump of a later step was written after it (verl writes them one at a time);
- it has not changed for ``stable_seconds``.

Samples are ranked by ``score`` (ties: the earlier line); ``index`` is the line number.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from warden.metric_names import finite_number
from warden.payloads import RewardSnapshot

DUMP_NAME = re.compile(r"^([0-9]+)\.jsonl\Z")


@dataclass(frozen=True)
class DumpFile:
    """One ``{step}.jsonl`` as listed: size and change times from ``stat``."""

    step: int
    path: str
    size: int
    mtime_ns: int
    newest_change: float


def list_dumps(directory: str) -> list[DumpFile]:
    """The dumps in ``directory`` by ascending step; empty when it does not exist (yet)."""
    found = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = DUMP_NAME.match(entry.name)
        if not match:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if entry.is_file(follow_symlinks=False):
            newest = max(st.st_mtime, st.st_ctime)
            found.append(DumpFile(int(match.group(1)), entry.path, st.st_size, st.st_mtime_ns, newest))
    return sorted(found, key=lambda d: d.step)


def later_written(dumps: list[DumpFile]) -> set[int]:
    """Steps for which a dump of a later step was modified at the same time or after."""
    out: set[int] = set()
    newest_after = -1
    for dump in reversed(dumps):
        if newest_after >= dump.mtime_ns:
            out.add(dump.step)
        newest_after = max(newest_after, dump.mtime_ns)
    return out


@dataclass(frozen=True)
class Evidence:
    """What else is known about a dump's writer (see the module docstring)."""

    log_step: int | None = None
    log_mtime_ns: int | None = None
    later_dump: bool = False
    quiet_seconds: float = 0.0
    stable_seconds: float = 30.0


def waiting_reason(dump: DumpFile, evidence: Evidence) -> str | None:
    """Why ``dump`` may still be written to, or None when its writer is known to be done."""
    log = evidence.log_step, evidence.log_mtime_ns
    if log[0] is not None and log[1] is not None and log[0] >= dump.step and log[1] >= dump.mtime_ns:
        return None
    if evidence.later_dump or evidence.quiet_seconds >= evidence.stable_seconds:
        return None
    return (
        f"{dump.path}: may still be written (no log line for step {dump.step} yet, no later dump, "
        f"quiet {evidence.quiet_seconds:.0f}s of {evidence.stable_seconds:.0f}s)"
    )


@dataclass(frozen=True)
class ParsedDump:
    """The rows of a dump; ``torn`` when its last line has no newline yet."""

    rows: list[tuple[int, dict[str, Any]]]
    torn: bool
    bad_lines: int


def parse_dump(content: bytes) -> ParsedDump:
    """Rows (line number, object) of a dump's bytes; lines that are not JSON objects are counted."""
    complete = content[: content.rfind(b"\n") + 1]
    rows: list[tuple[int, dict[str, Any]]] = []
    bad = 0
    for number, raw in enumerate(complete.split(b"\n")[:-1]):
        try:
            obj = json.loads(raw, parse_constant=lambda _name: None)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict):
            rows.append((number, obj))
        else:
            bad += 1
    return ParsedDump(rows, len(complete) != len(content) or not content, bad)


def _cap(text: str, max_chars: int) -> tuple[str, bool]:
    return (text[:max_chars], True) if len(text) > max_chars else (text, False)


def snapshot_payload(parsed: ParsedDump, top_k: int, min_reward: float | None, max_text_chars: int) -> RewardSnapshot:
    """The ``reward.snapshot`` of a dump: ``k``, ``min_reward``, ``samples``; ``offered`` and ``dropped`` in extra.

    A row needs a string ``input`` and ``output`` and a finite ``score``; others are dropped.
    """
    valid: list[tuple[float, int, str, str]] = []
    dropped = parsed.bad_lines
    for index, row in parsed.rows:
        score = finite_number(row.get("score"))
        prompt, response = row.get("input"), row.get("output")
        if score is None or not isinstance(prompt, str) or not isinstance(response, str):
            dropped += 1
            continue
        valid.append((score, index, prompt, response))
    valid.sort(key=lambda v: (-v[0], v[1]))
    if min_reward is not None:
        valid = [v for v in valid if v[0] >= min_reward]
    samples = []
    for score, index, prompt, response in valid[:top_k]:
        prompt_text, cut_prompt = _cap(prompt, max_text_chars)
        response_text, cut_response = _cap(response, max_text_chars)
        samples.append(
            {
                "index": index,
                "prompt": prompt_text,
                "response": response_text,
                "reward": score,
                "truncated": cut_prompt or cut_response,
            }
        )
    return RewardSnapshot(
        samples=tuple(samples),
        k=top_k,
        min_reward=min_reward,
        extra={"offered": len(parsed.rows), "dropped": dropped},
    )
