"""Records of reward snapshots: pure functions, no I/O.

A record is the canonical JSON (sorted keys, no spaces, UTF-8, no NaN) of::

    {"schema": 1, "run_id": R, "step": N, "time": <event time>, "event_seq": S,
     "prev": <hex SHA-256 of the previous stored record of the run, or the genesis digest>,
     "prev_step": <step of that record, null for the first>,
     "checkpoint": {"path": "step-000000050", "step": 50, "root_digest": hex, "file_count": n} | null,
     "selection": {"top_k": K, "min_reward": T | null, "offered": n},
     "samples": [{"index", "prompt", "response", "reward", "truncated", ...}],
     "notes": [what was dropped, truncated or repaired]}

It is the predicate of an in-toto Statement v1 (predicateType :data:`PREDICATE_TYPE`)
whose subject digest is the SHA-256 of that canonical JSON. The stored object is the
DSSE bundle of the statement; the chain hash of a record is the SHA-256 of those stored
bytes (:func:`object_hash`), so the next record vouches for the signature too. The first
record's ``prev`` is the run's genesis: ``run.started``'s ``config_digest``.

Keys: ``runs/<run_id>/steps/<step:012d>.json`` and the per-run head ``runs/<run_id>/head.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warden.payloads import RewardSnapshot

SCHEMA = 1
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://warden.dev/reward-snapshot/v1"
HEAD_PREDICATE_TYPE = "https://warden.dev/reward-snapshot-head/v1"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
STEP_DIGITS = 12
MAX_STEP = 10**STEP_DIGITS - 1
MAX_NOTES = 20
REPLACEMENT = "\ufffd"
SURROGATE_RE = re.compile("[\ud800-\udfff]")


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8, NaN refused: equal values give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


QUOTE_CHARS = 200


def clip(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` cut to about ``limit`` characters for a message: a hostile value never floods a report."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters in all)"


def object_hash(body: bytes) -> str:
    """The chain hash of a stored record: hex SHA-256 of its bytes."""
    return hashlib.sha256(body).hexdigest()


def genesis_for_run(run_id: str) -> str:
    """The genesis used when no ``run.started`` was seen: SHA-256 of ``warden-genesis:<run_id>``."""
    return hashlib.sha256(f"warden-genesis:{run_id}".encode()).hexdigest()


def valid_run_id(run_id: object) -> bool:
    """A run id safe as one path segment of a key: letters, digits, ``.``, ``_``, ``-``."""
    return isinstance(run_id, str) and bool(RUN_ID_RE.match(run_id)) and run_id not in (".", "..")


def steps_prefix(run_id: str) -> str:
    return f"runs/{run_id}/steps/"


def step_key(run_id: str, step: int) -> str:
    """``runs/<run_id>/steps/<step:012d>.json``."""
    return f"{steps_prefix(run_id)}{step:0{STEP_DIGITS}d}.json"


def head_key(run_id: str) -> str:
    """``runs/<run_id>/head.json``: the signed pointer to the newest stored record."""
    return f"runs/{run_id}/head.json"


def step_from_key(key: str) -> int | None:
    """The step of a key under ``steps/``; None for any other name."""
    name = key.rsplit("/", 1)[-1]
    stem, dot, ext = name.partition(".")
    if ext != "json" or not dot or len(stem) != STEP_DIGITS or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem)


# --- samples ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What a record keeps: the ``top_k`` best samples with reward >= ``min_reward``, texts capped."""

    top_k: int
    min_reward: float | None
    max_text_bytes: int


def repair_text(value: str) -> tuple[str, bool]:
    """Replaces lone surrogates (text that is not valid UTF-8) with U+FFFD; says whether it did."""
    repaired, count = SURROGATE_RE.subn(REPLACEMENT, value)
    return repaired, count > 0


def cap_text(value: str, max_bytes: int) -> tuple[str, int]:
    """Cuts ``value`` to at most ``max_bytes`` UTF-8 bytes on a character boundary; returns (text, original bytes)."""
    data = value.encode("utf-8")
    if len(data) <= max_bytes:
        return value, len(data)
    return data[:max_bytes].decode("utf-8", "ignore"), len(data)


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_sample(raw: object, position: int) -> str | None:
    """Why sample ``position`` cannot be kept, or None."""
    if not isinstance(raw, Mapping):
        return f"sample {position}: not an object; dropped"
    index = raw.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return f"sample {position}: 'index' missing or not a non-negative integer; dropped"
    for name in ("prompt", "response"):
        if not isinstance(raw.get(name), str):
            return f"sample {position}: '{name}' missing or not a string; dropped"
    if not _finite_number(raw.get("reward")):
        return f"sample {position}: 'reward' missing or not a finite number; dropped"
    return None


def _clean_sample(raw: Mapping[str, Any], limits: Limits, notes: list[str]) -> dict[str, Any]:
    """One kept sample: texts repaired and capped; truncation and repair recorded in the sample."""
    index = int(raw["index"])
    sample: dict[str, Any] = {"index": index, "reward": float(raw["reward"]), "truncated": raw.get("truncated") is True}
    original: dict[str, int] = {}
    for name in ("prompt", "response"):
        text, repaired = repair_text(raw[name])
        if repaired:
            sample["repaired"] = True
            notes.append(f"sample index {index}: {name} was not valid UTF-8; bad code points replaced by U+FFFD")
        text, size = cap_text(text, limits.max_text_bytes)
        if size > limits.max_text_bytes:
            original[name] = size
            notes.append(f"sample index {index}: {name} truncated from {size} to {limits.max_text_bytes} bytes")
        sample[name] = text
    if original:
        sample["truncated"] = True
        sample["original_bytes"] = original
    return sample


def select_samples(snapshot: RewardSnapshot, limits: Limits) -> tuple[list[dict[str, Any]], int, list[str]]:
    """The kept samples of a ``reward.snapshot`` payload, best reward first (ties: lower index).

    Returns (samples, number of valid samples offered, notes). Never raises: malformed
    samples are dropped and described in the notes.
    """
    notes: list[str] = []
    raw: tuple[Any, ...] = ()
    if snapshot.samples is None:
        notes.append("event has no 'samples' list; archived with no samples")
    else:
        raw = snapshot.samples
    valid: list[Mapping[str, Any]] = []
    for position, item in enumerate(raw):
        problem = _check_sample(item, position)
        if problem is None:
            valid.append(item)
        else:
            notes.append(problem)
    valid.sort(key=lambda s: (-float(s["reward"]), int(s["index"])))
    if limits.min_reward is not None:
        valid = [s for s in valid if float(s["reward"]) >= limits.min_reward]
    kept = [_clean_sample(s, limits, notes) for s in valid[: limits.top_k]]
    return kept, len(raw), notes


def bounded_notes(notes: list[str]) -> list[str]:
    """At most :data:`MAX_NOTES` notes, the rest summarised."""
    if len(notes) <= MAX_NOTES:
        return notes
    return [*notes[: MAX_NOTES - 1], f"... and {len(notes) - MAX_NOTES + 1} more notes"]


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainLink:
    """Where a new record attaches: the previous record's hash and step (None for the first)."""

    prev: str
    prev_step: int | None


def build_record(
    *,
    run_id: str,
    step: int,
    time: str,
    event_seq: int,
    snapshot: RewardSnapshot,
    link: ChainLink,
    limits: Limits,
    checkpoint: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The record of one ``reward.snapshot`` event (see the module docstring)."""
    samples, offered, notes = select_samples(snapshot, limits)
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "step": step,
        "time": time,
        "event_seq": event_seq,
        "prev": link.prev,
        "prev_step": link.prev_step,
        "checkpoint": dict(checkpoint) if checkpoint else None,
        "selection": {"top_k": limits.top_k, "min_reward": limits.min_reward, "offered": offered},
        "samples": samples,
        "notes": bounded_notes(notes),
    }


def statement(predicate: Mapping[str, Any], subject_name: str, predicate_type: str = PREDICATE_TYPE) -> dict[str, Any]:
    """An in-toto Statement v1 around ``predicate``; the subject digest is its canonical JSON's SHA-256."""
    digest = hashlib.sha256(canonical_json(predicate)).hexdigest()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": digest}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def build_head(*, run_id: str, genesis: str | None, first_step: int | None, last_step: int, last_hash: str) -> dict:
    """The head predicate: the newest stored record of the run (every record up to it is stored)."""
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "genesis": genesis,
        "first_step": first_step,
        "last_step": last_step,
        "last_hash": last_hash,
    }


@dataclass(frozen=True)
class Record:
    """The fields of a verified record that the chain and the audit use."""

    run_id: str
    step: int
    prev: str
    prev_step: int | None
    body: Mapping[str, Any]


def _int_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def parse_record(predicate: object) -> Record:
    """Checks the fields the chain relies on; raises ValueError naming the bad field."""
    if not isinstance(predicate, dict):
        raise ValueError("predicate is not an object")
    if predicate.get("schema") != SCHEMA:
        raise ValueError(f"schema is {predicate.get('schema')!r}, expected {SCHEMA}")
    run_id, step, prev, prev_step = (predicate.get(k) for k in ("run_id", "step", "prev", "prev_step"))
    if not valid_run_id(run_id):
        raise ValueError("run_id is missing or not a valid run id")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise ValueError("step is missing or out of range")
    if not isinstance(prev, str) or not re.fullmatch(r"[0-9a-f]{64}", prev):
        raise ValueError("prev is not a hex SHA-256")
    if not _int_or_none(prev_step):
        raise ValueError("prev_step is not a step or null")
    assert isinstance(run_id, str)
    return Record(run_id, step, prev, prev_step if isinstance(prev_step, int) else None, predicate)


@dataclass(frozen=True)
class Head:
    """A verified head: the newest record every earlier record of the run is stored before."""

    run_id: str
    genesis: str | None
    first_step: int | None
    last_step: int
    last_hash: str


def parse_head(predicate: object) -> Head:
    """Checks a head predicate; raises ValueError naming the bad field."""
    if not isinstance(predicate, dict) or predicate.get("schema") != SCHEMA:
        raise ValueError("head predicate is not a schema-1 object")
    run_id, genesis = predicate.get("run_id"), predicate.get("genesis")
    first_step, last_step, last_hash = (predicate.get(k) for k in ("first_step", "last_step", "last_hash"))
    if not valid_run_id(run_id):
        raise ValueError("run_id is missing or not a valid run id")
    if genesis is not None and not isinstance(genesis, str):
        raise ValueError("genesis is not a string")
    if not _int_or_none(first_step) or not isinstance(last_step, int) or isinstance(last_step, bool):
        raise ValueError("first_step/last_step are not steps")
    if not isinstance(last_hash, str):
        raise ValueError("last_hash is not a string")
    assert isinstance(run_id, str)
    return Head(run_id, genesis, first_step if isinstance(first_step, int) else None, last_step, last_hash)
