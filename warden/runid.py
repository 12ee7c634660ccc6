"""Run ids for journals written on behalf of other trainers (verl bridge, HF callback)."""

from __future__ import annotations

import json
import re

from warden.journal import MAX_LINE_BYTES, Event

_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_run_id(text: str, fallback: str = "run") -> str:
    """``text`` as a run id usable as one key segment (letters, digits, ``.``, ``_``, ``-``).

    Other characters become ``-``; leading punctuation is dropped; at most 128 characters;
    ``fallback`` when nothing is left.
    """
    cleaned = _BAD.sub("-", text).lstrip("._-")[:128].rstrip(".")
    return cleaned or fallback


def journal_run_id(path: str) -> str | None:
    """The run id of a journal's first event; None for a missing, empty or unreadable first line."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(MAX_LINE_BYTES + 1)
    except FileNotFoundError:
        return None
    if not first.endswith(b"\n"):
        return None
    try:
        return Event.from_dict(json.loads(first)).run_id
    except ValueError:
        return None
