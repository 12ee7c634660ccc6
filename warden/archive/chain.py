"""Each run's chain head, derived from the spool, with the run's facts in ``<state_dir>/chain.json``.

The head of a run is the step and hash of its newest record, spooled or stored: the
next record links to it. ``chain.json`` holds what does not change per step (genesis,
first step, checkpoint reference) and is written only when those change; the head lives
in memory and is rebuilt on start by :meth:`ChainState.reconcile` from the newest
spooled record or, when every record is stored, from the spool's head file (written
before the records it covers are removed). So one atomic write per record, the spool
file, is the whole commit, and a replayed event finds its step already chained and is
skipped: the chain never forks.

When the state directory is new (or was lost) a run's head is looked up in the store
first (:func:`recover_from_store`): its signed head object, then any records stored
after it. Only a chain signed by this archiver's own key is extended.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any

from warden.archive.errors import ChainRecoveryError, RecordInvalid
from warden.archive.record import ChainLink, head_key, object_hash, step_from_key, step_key, steps_prefix
from warden.archive.signing import verify_head, verify_record
from warden.archive.spool import Spool
from warden.archive.store import Store
from warden.safeio import atomic_write_bytes
from warden.signing.keys import TrustedKeys

STATE_VERSION = 1


@dataclass(frozen=True)
class RunChain:
    """Where run ``run_id`` stands.

    ``genesis`` is the first record's ``prev`` (``genesis_source`` says where it came
    from: ``run.started``, ``store`` or ``run_id``); ``head_step``/``head_hash`` the
    newest spooled or stored record (None before the first); ``checkpoint`` the newest
    ``checkpoint.saved`` reference.
    """

    run_id: str
    genesis: str
    genesis_source: str
    first_step: int | None = None
    head_step: int | None = None
    head_hash: str | None = None
    checkpoint: dict[str, Any] | None = None

    def link(self) -> ChainLink:
        """Where the next record attaches."""
        return ChainLink(self.head_hash or self.genesis, self.head_step)


class ChainState:
    """The :class:`RunChain` of every run, persisted atomically. Thread-safe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._runs: dict[str, RunChain] = self._load()

    def _load(self) -> dict[str, RunChain]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                raw = json.load(fh)
            return {run: RunChain(**fields) for run, fields in raw["runs"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ChainRecoveryError(
                f"{self.path}: unreadable chain state ({exc}); move it aside to rebuild it from the store"
            ) from None

    def _save(self) -> None:
        document = {"version": STATE_VERSION, "runs": {run: asdict(chain) for run, chain in sorted(self._runs.items())}}
        atomic_write_bytes(self.path, json.dumps(document, indent=1, sort_keys=True).encode("utf-8"))

    def get(self, run_id: str) -> RunChain | None:
        with self._lock:
            return self._runs.get(run_id)

    def set(self, chain: RunChain) -> None:
        with self._lock:
            self._runs[chain.run_id] = chain
            self._save()

    def forget_all(self) -> None:
        """Forgets every run (each is then looked up in the store again: :func:`recover_from_store`)."""
        with self._lock:
            self._runs = {}
            self._save()

    def advance(self, run_id: str, step: int, body_hash: str) -> RunChain:
        """Makes the just spooled record of ``step`` (hash ``body_hash``) the head of ``run_id``.

        Saved only for the run's first record (its first step); otherwise memory only:
        the spool file just written is the durable evidence.
        """
        with self._lock:
            chain = self._runs[run_id]
            first = chain.first_step if chain.first_step is not None else step
            self._runs[run_id] = replace(chain, first_step=first, head_step=step, head_hash=body_hash)
            if chain.first_step is None:
                self._save()
            return self._runs[run_id]

    def _raise_head(self, run_id: str, step: int, body_hash: str, source: str) -> bool:
        with self._lock:
            chain = self._runs.get(run_id) or RunChain(run_id, genesis="", genesis_source=source)
            if chain.head_step is not None and step <= chain.head_step:
                return False
            first = chain.first_step if chain.first_step is not None else step
            self._runs[run_id] = replace(chain, first_step=first, head_step=step, head_hash=body_hash)
            return True

    def reconcile(self, spool: Spool, own_key: TrustedKeys) -> list[tuple[str, int]]:
        """Rebuilds each run's head from the spool's head files and newest records; returns what moved it."""
        moved: list[tuple[str, int]] = []
        for run_id in spool.head_runs():
            body = spool.head(run_id)
            if body is None:
                continue
            try:
                head = verify_head(body, own_key, f"{spool.root}/{run_id}/head.json")[0]
            except RecordInvalid as exc:
                raise ChainRecoveryError(f"cannot rebuild the chain head: {exc}") from None
            if self._raise_head(run_id, head.last_step, head.last_hash, "spool"):
                moved.append((run_id, head.last_step))
            spool.drop_stored(run_id, head.last_step)  # stored before a crash cut their removal short
        for entry in spool.pending():
            body_hash = object_hash(spool.read(entry.run_id, entry.step))
            if self._raise_head(entry.run_id, entry.step, body_hash, "spool"):
                moved.append((entry.run_id, entry.step))
        with self._lock:
            self._save()
        return moved


def recover_from_store(store: Store, run_id: str, own_key: TrustedKeys) -> RunChain | None:
    """The chain of ``run_id`` as the store has it, or None when the store has nothing for it.

    Reads the head object, then the newest record stored after it (if any). Raises
    StoreError when the store cannot be read, ChainRecoveryError when what is there is
    not signed by this archiver's key.
    """
    where = f"{store.url} run {run_id}"
    try:
        head_body = store.get(head_key(run_id))
        head = verify_head(head_body, own_key, f"{where} head")[0] if head_body is not None else None
        start = step_key(run_id, head.last_step) if head is not None else None
        later = [k for k in store.list_keys(steps_prefix(run_id), start_after=start) if step_from_key(k) is not None]
        if head is None and not later:
            return None
        genesis = head.genesis if head is not None else None
        first_step = head.first_step if head is not None else None
        if head is None:
            first = verify_record(_must_get(store, later[0]), own_key, f"{where} first record")[0]
            genesis, first_step = first.prev, first.step
        if not later:
            assert head is not None
            step, digest = head.last_step, head.last_hash
        else:
            body = _must_get(store, later[-1])
            step, digest = verify_record(body, own_key, f"{where} newest record")[0].step, object_hash(body)
    except RecordInvalid as exc:
        raise ChainRecoveryError(f"cannot extend the stored chain: {exc}") from None
    return RunChain(run_id, genesis or "", "store", first_step, step, digest)


def _must_get(store: Store, key: str) -> bytes:
    body = store.get(key)
    if body is None:
        raise ChainRecoveryError(f"{store.url}: {key} was listed but cannot be read")
    return body


def default_state_path(state_dir: str) -> str:
    return os.path.join(state_dir, "chain.json")
