"""Resumed checkpoints that did not verify, kept across restarts (``<state_dir>/resumed.json``).

A ``run.resumed`` is read once (the cursor moves past it), so when the checkpoint it names
fails verification the signer remembers it here: after a restart the failure still counts in
``warden_signer_invalid_checkpoints`` (the page goes on) and the checkpoint is verified again
on the first check and in every re-verification round, until it verifies (restored) or is gone
(removed with its ``.sig``). :class:`Resumed` is what the logs say about the event: the run, the
step it went on from, the journal seq and the integration that wrote it, quoted
(:func:`warden.errors.quote_untrusted`). The file is atomic JSON, at most :data:`MAX_ENTRIES`
checkpoints, the oldest dropped first; an unreadable file starts empty (logged by the sidecar).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

from warden.errors import quote_untrusted
from warden.safeio import atomic_write_bytes
from warden.signer.policy import LAYOUTS
from warden.signer.watch import Candidate

RESUMED_FILE = "resumed.json"
MAX_ENTRIES = 256

# Results of one run.resumed (label values of warden_signer_resumed_checks_total).
OK = "ok"
"""The checkpoint verified against the trusted keys."""
FAILED = "failed"
"""It did not: changed bytes, a missing or invalid signature, gone, or not a real directory."""
PRUNED = "pruned"
"""Gone since, and the journal says retention removed it (``checkpoint.pruned``), or verl's retention."""
INCOMPLETE = "incomplete"
"""Verification could not finish (a file unreadable, a signature in a serialization Warden cannot check)."""
REFUSED = "refused"
"""The event names a path the signer does not check: outside the watched and announced roots, not a
checkpoint name, control characters, or a payload that does not parse."""
UNNAMED = "unnamed"
"""The event names no checkpoint and the signer knows none of that run at that step."""
RESULTS = (OK, FAILED, PRUNED, INCOMPLETE, REFUSED, UNNAMED)

CHECKPOINT_MISSING = "checkpoint_missing"
"""Verification reason: the resumed checkpoint does not exist and no retention event removed it."""


@dataclass(frozen=True)
class Resumed:
    """One ``run.resumed``: which run went on from which step (``seq``: the journal line)."""

    run_id: str
    step: int | None
    seq: int | None = None
    source: str | None = None

    def describe(self) -> str:
        """``the resumed checkpoint of run 'r' at step 4``, the run id through the one sanitiser."""
        at = f"step {self.step}" if self.step is not None else "an unknown step"
        return f"the resumed checkpoint of run '{quote_untrusted(self.run_id, 200)}' at {at}"

    def fields(self) -> dict[str, Any]:
        """Log fields naming the event."""
        return {
            "trigger": "run.resumed",
            "resumed_run_id": quote_untrusted(self.run_id, 200),
            "resumed_step": self.step,
            "resumed_seq": self.seq,
            "resumed_source": quote_untrusted(self.source, 100) if self.source is not None else None,
        }


@dataclass(frozen=True)
class FailedResume:
    """A resumed checkpoint whose last verification failed, and why (the first problem code)."""

    candidate: Candidate
    resumed: Resumed
    reason: str

    def to_dict(self) -> dict[str, Any]:
        c, r = self.candidate, self.resumed
        return {"step": c.step, "layout": c.layout, "run_id": r.run_id, "from_step": r.step, "seq": r.seq,
                "source": r.source, "reason": self.reason}  # fmt: skip

    @classmethod
    def from_dict(cls, path: object, raw: object) -> FailedResume | None:
        """Parses one stored entry; None when it is not well-formed (the file is ours, but be strict)."""
        if not isinstance(path, str) or not os.path.isabs(path) or not isinstance(raw, dict):
            return None
        step, from_step, seq = raw.get("step"), raw.get("from_step"), raw.get("seq")
        texts = (raw.get("layout"), raw.get("run_id"), raw.get("reason"))
        if not isinstance(step, int) or isinstance(step, bool):
            return None
        if any(v is not None and not _is_int(v) for v in (from_step, seq)):
            return None
        if not all(isinstance(t, str) for t in texts) or raw.get("layout") not in LAYOUTS:
            return None
        source = raw.get("source")
        if source is not None and not isinstance(source, str):
            return None
        resumed = Resumed(raw["run_id"], from_step, seq, source)
        return cls(Candidate(path, step, raw["layout"]), resumed, raw["reason"])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ResumedStore:
    """``{checkpoint path: FailedResume}`` in ``path`` (None: in memory only), written on each change."""

    def __init__(self, path: str | None, limit: int = MAX_ENTRIES) -> None:
        self.path = path
        self.limit = limit
        self._entries: dict[str, FailedResume] = {}
        self.load_error: str | None = None
        if path is None:
            return
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
            for key, value in raw.get("checkpoints", {}).items():
                entry = FailedResume.from_dict(key, value)
                if entry is not None:
                    self._entries[key] = entry
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, RecursionError) as exc:
            self.load_error = f"{path}: unreadable, starting empty: {str(exc)[:200]}"

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str) -> FailedResume | None:
        return self._entries.get(path)

    def entries(self) -> list[FailedResume]:
        """Every failed resumed checkpoint, oldest first."""
        return list(self._entries.values())

    def put(self, entry: FailedResume) -> None:
        """Remembers ``entry`` as the newest (dropping the oldest beyond the limit) and saves."""
        path = entry.candidate.path
        if self._entries.get(path) == entry:
            return
        self._entries.pop(path, None)
        self._entries[path] = entry
        while len(self._entries) > self.limit:
            del self._entries[next(iter(self._entries))]
        self._save()

    def forget(self, path: str) -> None:
        if self._entries.pop(path, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        document = {"version": 1, "checkpoints": {p: e.to_dict() for p, e in self._entries.items()}}
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(document, indent=1).encode("utf-8"))
