"""What the trainer announced and what the signer signed, kept across restarts.

The signer signs a checkpoint of the run's own root only when a ``checkpoint.saved``
event announced its manifest root digest and the bytes on disk hash to it. This module
remembers, per checkpoint path, the announcement (step, run id, root digest, file count),
the root digest actually signed and a refusal reason, in ``<state_dir>/announced.json``
(atomic JSON, at most :data:`MAX_RECORDS` entries, oldest dropped first). After a
restart the signer still knows that a checkpoint was signed, so a ``.sig`` deleted while
it was down is a ``signature_missing`` violation, not a checkpoint to sign again.

:func:`audit` is the pure rule that turns (record, what is on disk) into a violation
reason or None; the sidecar does the I/O.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from warden.safeio import atomic_write_bytes
from warden.signing.manifest import Announced, SignedStatement

ANNOUNCED_FILE = "announced.json"
MAX_RECORDS = 4096
_HEX = frozenset("0123456789abcdef")

# Violation reasons (label values of warden_signer_violations / warden_signer_violating_checkpoints).
UNANNOUNCED = "unannounced"
SIGNATURE_MISSING = "signature_missing"
SIGNATURE_REPLACED = "signature_replaced"
DIGEST_MISMATCH = "digest_mismatch"
FILE_COUNT_MISMATCH = "file_count_mismatch"
NO_DIGEST = "no_digest"
UNSAFE_PATH = "unsafe_path"
"""A ``step-N`` / ``checkpoint-N`` / ``global_step_N`` entry that is not a real directory (a symlink...)."""
REMOVED_WITHOUT_RETENTION = "removed_without_retention"
"""An announced checkpoint gone from disk while the journal has no ``checkpoint.pruned`` for it."""
SERIALIZATION_MISMATCH = "serialization_mismatch"
"""The trainer announced its digest in another serialization than the signer's policy signs."""
REFUSAL_REASONS = (DIGEST_MISMATCH, FILE_COUNT_MISMATCH, NO_DIGEST, SERIALIZATION_MISMATCH)
VIOLATION_REASONS = (
    UNANNOUNCED,
    SIGNATURE_MISSING,
    SIGNATURE_REPLACED,
    UNSAFE_PATH,
    REMOVED_WITHOUT_RETENTION,
    *REFUSAL_REASONS,
)


def is_hex_digest(value: object) -> bool:
    """True for a lowercase 64-digit hex string."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


@dataclass(frozen=True)
class Record:
    """One checkpoint path: what was announced, what was signed, why it was refused."""

    step: int
    run_id: str | None = None
    root_digest: str | None = None
    file_count: int | None = None
    signed_digest: str | None = None
    refused: str | None = None
    shard_size: int | None = None  # the announcement's shard serialization; None: files
    names_digest: str | None = None  # the announcement's names digest (binds the file names)

    @property
    def announced(self) -> Announced | None:
        """The announcement to sign against, if the event carried one."""
        if self.root_digest is None or self.file_count is None:
            return None
        return Announced(self.root_digest, self.file_count, self.shard_size, self.names_digest)

    @classmethod
    def from_dict(cls, raw: Any) -> Record | None:
        """Parses one stored record; None when it is not well-formed (the file is ours, but be strict)."""
        if not isinstance(raw, dict) or isinstance(raw.get("step"), bool) or not isinstance(raw.get("step"), int):
            return None
        strings = {k: raw.get(k) for k in ("run_id", "refused")}
        digests = {k: raw.get(k) for k in ("root_digest", "signed_digest")}
        count = raw.get("file_count")
        if any(v is not None and not isinstance(v, str) for v in strings.values()):
            return None
        if any(v is not None and not is_hex_digest(v) for v in digests.values()):
            return None
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            return None
        shard_size, names = raw.get("shard_size"), raw.get("names_digest")
        if shard_size is not None and (isinstance(shard_size, bool) or not isinstance(shard_size, int)):
            return None
        if names is not None and not is_hex_digest(names):
            return None
        return cls(raw["step"], strings["run_id"], digests["root_digest"], count, digests["signed_digest"],
                   strings["refused"], shard_size, names)  # fmt: skip


class AnnouncementStore:
    """``{checkpoint path: Record}`` in ``<state_dir>/announced.json``, written atomically on each change."""

    def __init__(self, path: str, limit: int = MAX_RECORDS) -> None:
        self.path = path
        self.limit = limit
        self._records: dict[str, Record] = {}
        self.load_error: str | None = None
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
            for key, value in raw.get("checkpoints", {}).items():
                record = Record.from_dict(value)
                if isinstance(key, str) and record is not None:
                    self._records[key] = record
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, RecursionError) as exc:
            self.load_error = f"{path}: unreadable, starting empty: {str(exc)[:200]}"

    def get(self, path: str) -> Record | None:
        return self._records.get(path)

    def under(self, root: str) -> Iterator[tuple[str, Record]]:
        """Records of checkpoints directly under ``root``."""
        for path, record in list(self._records.items()):
            if os.path.dirname(path) == root:
                yield path, record

    def items(self) -> Iterator[tuple[str, Record]]:
        """Every record, oldest first."""
        yield from list(self._records.items())

    def directories(self) -> set[str]:
        """The directories announced checkpoints live in (their roots, watched or not)."""
        return {os.path.dirname(path) for path in self._records}

    def signed(self) -> Iterator[tuple[str, Record]]:
        """Records of checkpoints this signer signed (or adopted), oldest first."""
        for path, record in list(self._records.items()):
            if record.signed_digest is not None:
                yield path, record

    def put(self, path: str, record: Record, save: bool = True) -> Record:
        """Stores ``record`` as the newest entry (dropping the oldest beyond the limit) and saves,
        unless ``save`` is False (then the next change saves it)."""
        if self._records.get(path) == record:
            return record
        self._records.pop(path, None)
        self._records[path] = record
        while len(self._records) > self.limit:
            del self._records[next(iter(self._records))]
        if save:
            self._save()
        return record

    def announce(self, path: str, step: int, run_id: str | None, announced: Announced | None) -> Record:
        """Records a ``checkpoint.saved``; a new digest for the same path forgets the old signature.

        Kept in memory until the outcome (signed, refused) is saved with it: the event's cursor
        advances only once it is handled, so after a crash it is announced again; saving here put an
        fsync before every hash, behind the trainer's writeback of the next checkpoint."""
        old = self._records.get(path)
        digest = announced.root_digest if announced else None
        count = announced.file_count if announced else None
        shards = announced.shard_size if announced else None
        names = announced.names_digest if announced else None
        same = (
            (old.root_digest, old.file_count, old.shard_size, old.names_digest, old.run_id, old.step) if old else None
        )
        if same == (digest, count, shards, names, run_id, step):
            assert old is not None
            return old
        return self.put(path, Record(step, run_id, digest, count, shard_size=shards, names_digest=names), save=False)

    def mark_signed(self, path: str, record: Record, digest: str) -> Record:
        return self.put(path, replace(record, signed_digest=digest, refused=None))

    def mark_refused(self, path: str, record: Record, reason: str) -> Record:
        return self.put(path, replace(record, refused=reason))

    def forget(self, path: str) -> None:
        if self._records.pop(path, None) is not None:
            self._save()

    def _save(self) -> None:
        document = {"version": 1, "checkpoints": {p: asdict(r) for p, r in self._records.items()}}
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(document, indent=1).encode("utf-8"))


def statement_problem(
    name: str, step: int, record: Record | None, statement: SignedStatement, run_ids: set[str]
) -> str | None:
    """Why a validly signed statement does not belong at ``name`` (step ``step``); None when it does.

    With a record: the signed digest (or else the announced one) and its run id must match.
    Without one: the statement must be this run's (a run id seen in the journal) for this step.
    """
    provenance = statement.provenance
    if statement.manifest.name != name:
        return f"it signs checkpoint {statement.manifest.name[:200]!r}, not {name!r}"
    if provenance.step is not None and provenance.step != step:
        return f"it signs step {provenance.step}, not {step}"
    expected_run = record.run_id if record is not None and record.run_id else None
    if expected_run is not None and provenance.run_id != expected_run:
        return f"it names run {str(provenance.run_id)[:200]!r}, the trainer announced {expected_run!r}"
    if record is None:
        if provenance.run_id not in run_ids:
            return f"it names run {str(provenance.run_id)[:200]!r}, not one of this run directory's"
        return None
    wanted = record.signed_digest or record.root_digest
    if wanted is not None and statement.subject_digest != wanted:
        return f"it signs root sha256:{statement.subject_digest}, the signer signed/announced sha256:{wanted}"
    return None


def audit(record: Record | None, signature_present: bool, unannounced_for: float, grace: float) -> str | None:
    """The violation of a checkpoint directory of the run's own root whose ``.sig`` is absent or
    already judged; None when nothing is wrong (yet).

    - no ``.sig``, signed before: ``signature_missing`` (deleted: never signed again);
    - no ``.sig``, refused: the refusal reason;
    - no ``.sig``, never announced, older than ``grace``: ``unannounced``;
    - announced and not signed yet: None (the event handler is on it).
    """
    if signature_present:
        return None
    if record is None:
        return UNANNOUNCED if unannounced_for >= grace else None
    if record.signed_digest is not None:
        return SIGNATURE_MISSING
    return record.refused
