"""The journal as the anchor of ``warden audit verify-run --run-dir``: what the trainer emitted.

Store contents alone cannot prove that the newest records existed: on a
``file://`` store (or an S3 bucket without versioning) whoever can write the store can
delete the newest records and write back an older head, leaving a shorter chain that is
perfectly consistent. An independent witness is needed. :class:`JournalAnchor` is that
witness: the trainer's journal (``<run dir>/events.jsonl``, ``--run-dir``) lists every
``reward.snapshot`` step; a journal step newer than the store's newest record, and older
than a grace period (uploads in flight), is reported ``rolled_back``. It proves "the store
lost what the trainer emitted" against an attacker who can write the store but not the
run directory (e.g. a shared bucket or NFS export, with the run directory on the
training host); it proves nothing against someone who can rewrite both, nor when the
archiver legitimately fell behind for longer than the grace (its spool still holds the
records: the message says so). On versioned S3 stores (Object Lock buckets are
versioned) the retained versions are the anchor: records cannot be removed, only hidden
by delete markers, which the listing shows, and older head versions are compared by
their signed step (one GET per distinct retained head version; :mod:`warden.archive.verify`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from warden.archive.findings import Break, ranges
from warden.archive.record import Head
from warden.errors import ConfigError
from warden.ledger import event_time
from warden.payloads import PayloadError, RunStarted
from warden.runid import run_genesis

DEFAULT_GRACE_SECONDS = 600.0


@dataclass(frozen=True)
class JournalAnchor:
    """The steps of a run's ``reward.snapshot`` events and when they were emitted (UTC seconds), and
    the run's genesis as its first ``run.started`` defines it (None when the journal has none)."""

    source: str
    steps: dict[int, float]
    genesis: str | None = None

    @classmethod
    def from_run_dir(cls, run_dir: str, run_id: str) -> JournalAnchor:
        """Reads ``<run_dir>/events.jsonl``; raises ConfigError when there is none."""
        from warden.journal import JournalReader

        path = os.path.join(run_dir, "events.jsonl")
        if not os.path.isfile(path):
            raise ConfigError(f"--run-dir {run_dir}: no journal (events.jsonl) there")
        steps: dict[int, float] = {}
        genesis: str | None = None
        for event, _ in JournalReader(path).read_available():
            if event.run_id != run_id:
                continue
            if event.type == "reward.snapshot" and event.step is not None:
                steps[event.step] = event_time(event.time)
            elif event.type == "run.started" and genesis is None:
                genesis = genesis_of(event.data)
        return cls(path, steps, genesis)


def genesis_of(data: dict) -> str | None:
    """The archive genesis a ``run.started`` payload defines: the digest of its genesis nonce and
    config digest (:func:`warden.runid.run_genesis`), or the bare config digest for a journal written
    before the nonce existed; None when the payload does not parse or has neither."""
    try:
        started = RunStarted.from_data(data)
    except PayloadError:
        return None
    if started.genesis_nonce:
        return run_genesis(started.genesis_nonce, started.config_digest)
    return started.config_digest


def anchor_findings(
    anchor: JournalAnchor, present: Iterable[int], head: Head | None, now: float, grace: float
) -> tuple[list[Break], list[int]]:
    """Findings of ``anchor`` against the store: (breaks, journal steps within the grace period).

    A journal step newer than both the newest record present and the head, emitted more
    than ``grace`` seconds ago, is ``rolled_back``. Journal steps inside the stored chain
    but absent from it were skipped by the archiver itself (the signed chain links across
    them, e.g. a refused event): the chain walk judges those, not the anchor.
    """
    breaks = []
    if anchor.genesis and head is not None and head.genesis and head.genesis != anchor.genesis:
        breaks.append(
            Break(
                None,
                "altered",
                f"the stored chain starts from genesis {head.genesis[:16]}…, but this run's journal "
                f"({anchor.source}) defines genesis {anchor.genesis[:16]}…: the run's objects were replaced by "
                "another chain under the same run id",
            )
        )
    newest = max([*present, head.last_step if head else -1], default=-1)
    beyond = sorted(s for s in anchor.steps if s > newest)
    late = [s for s in beyond if now - anchor.steps[s] > grace]
    recent = [s for s in beyond if s not in late]
    if not late:
        return breaks, recent
    message = (
        f"the journal ({anchor.source}) has reward.snapshot events for steps {ranges(late)} "
        f"(more than {grace:.0f} s old), but the store's newest record is step {newest if newest >= 0 else 'none'}: "
        "records were deleted and the head rolled back (or the archiver has been down since: its spool holds them)"
    )
    return [*breaks, Break(late[0], "rolled_back", message)], recent
