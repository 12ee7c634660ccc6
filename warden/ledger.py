"""The journal as the index of what exists: which checkpoints a run has announced and not retired
(and the run's genesis nonce, from the same one read of the journal).

Every checkpoint a trainer writes is announced with ``checkpoint.saved``; every checkpoint
retention removes is announced with ``checkpoint.pruned`` (before the removal by Warden's
trainer, after it by the integrations, which see a library's rotation only once it happened).
What remains is what must exist. :func:`build_ledger` folds a run's events into that set (pure);
:func:`reconcile` compares it with the steps found on disk (pure); :func:`read_ledger` reads a
journal. The trainer's ``--resume`` and the signer both use this one rule, so "gone without its
retention event" means the same thing everywhere: a violation, never a silent fallback.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from warden.errors import quote_untrusted
from warden.journal import CHECKPOINT_SAVED, RUN_STARTED, JournalReader
from warden.journal import Event as JournalEvent
from warden.payloads import CHECKPOINT_PRUNED, CheckpointPruned, CheckpointSaved, PayloadError
from warden.runid import valid_genesis_nonce


@dataclass(frozen=True)
class Announced:
    """A checkpoint the journal says exists: its step, path as announced, and root digest (if any)."""

    step: int
    path: str
    root_digest: str | None
    seq: int


@dataclass(frozen=True)
class Ledger:
    """What a run's journal says exists (``live``, by step) and what it retired (``pruned`` steps)."""

    run_id: str
    live: dict[int, Announced] = field(default_factory=dict)
    pruned: frozenset[int] = frozenset()
    unreadable: int = 0
    newest_saved_at: float | None = None
    """Wall-clock time (UTC seconds) of the newest ``checkpoint.saved``: an integration announces a
    library's rotation right after that event, so once it is old no retention event is on its way."""
    genesis_nonce: str | None = None
    """The ``genesis_nonce`` of the run's first ``run.started`` (``warden.runid.run_genesis``)."""

    @property
    def newest(self) -> Announced | None:
        return self.live[max(self.live)] if self.live else None


def build_ledger(events: Iterable[JournalEvent], run_id: str | None) -> Ledger:
    """Folds ``run_id``'s (None: every run's) ``checkpoint.saved`` and ``checkpoint.pruned`` events,
    in journal order. Pure.

    A saved event re-announces its step (the newest announcement wins); a pruned event retires
    it. Events whose payload does not parse are counted in ``unreadable`` and otherwise ignored.
    """
    live: dict[int, Announced] = {}
    pruned: set[int] = set()
    unreadable = 0
    newest: float | None = None
    nonce: str | None = None
    for event in events:
        if run_id is not None and event.run_id != run_id:
            continue
        if event.type == RUN_STARTED and nonce is None:
            candidate = event.data.get("genesis_nonce")
            nonce = candidate if valid_genesis_nonce(candidate) else None
        if event.type not in (CHECKPOINT_SAVED, CHECKPOINT_PRUNED):
            continue
        try:
            if event.type == CHECKPOINT_SAVED:
                saved = CheckpointSaved.from_data(event.data)
                if event.step is None or saved.complete is False:
                    continue
                live[event.step] = Announced(event.step, saved.path, saved.root_digest, event.seq)
                pruned.discard(event.step)
                newest = event_time(event.time)
            else:
                retired = CheckpointPruned.from_data(event.data)
                live.pop(retired.step, None)
                pruned.add(retired.step)
        except PayloadError:
            unreadable += 1
    return Ledger(run_id or "", live, frozenset(pruned), unreadable, newest, nonce)


def event_time(value: str) -> float:
    """An event's RFC 3339 time as UTC seconds (0.0 when unreadable: as old as can be)."""
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()


def read_ledger(journal_path: str, run_id: str | None) -> Ledger:
    """The ledger of ``run_id`` in the journal at ``journal_path`` (empty when there is none)."""
    reader = JournalReader(journal_path)
    return build_ledger((event for event, _ in reader.read_available()), run_id)


@dataclass(frozen=True)
class Reconciliation:
    """Announced checkpoints not on disk (``missing``) and steps on disk newer than every announcement."""

    missing: tuple[Announced, ...]
    unannounced: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return not self.missing


def reconcile(ledger: Ledger, on_disk: Iterable[int]) -> Reconciliation:
    """Compares what the journal says exists with the steps found on disk. Pure."""
    present = set(on_disk)
    missing = tuple(ledger.live[s] for s in sorted(ledger.live) if s not in present)
    unannounced = tuple(sorted(s for s in present if s not in ledger.live and s not in ledger.pruned))
    return Reconciliation(missing, unannounced)


def describe_missing(missing: Iterable[Announced], limit: int = 5) -> str:
    """``step-N (root sha256:...)`` for the first ``limit`` missing checkpoints, for messages."""
    items = list(missing)
    shown = []
    for a in items[:limit]:
        digest = f", root {a.root_digest[:16]}..." if a.root_digest else ""
        shown.append(f"step {a.step} ({quote_untrusted(a.path, 160)}{digest})")
    text = ", ".join(shown)
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")
