"""Run ids (for journals written on behalf of other trainers: verl bridge, HF callback) and run genesis."""

from __future__ import annotations

import hashlib
import json
import re
import secrets

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


# -- the run's genesis: what binds a run's archive records to this run, not to another of the same id --
GENESIS_DOMAIN = b"warden-run-genesis-v1\0"


def new_genesis_nonce() -> str:
    """A fresh random nonce for the first ``run.started`` of a run id (128 bits, hex)."""
    return secrets.token_hex(16)


def run_genesis(nonce: str, config_digest: str | None) -> str:
    """The run's genesis digest: SHA-256 over the nonce and the config digest (domain-separated).

    Two chains of the same run id signed by the same key differ here unless they share the nonce,
    which lives only in this run's journal and checkpoints."""
    text = f"{nonce}\0{config_digest or ''}".encode()
    return hashlib.sha256(GENESIS_DOMAIN + text).hexdigest()


_NONCE = re.compile(r"[0-9a-f]{32}")


def valid_genesis_nonce(value: object) -> bool:
    return isinstance(value, str) and _NONCE.fullmatch(value) is not None
