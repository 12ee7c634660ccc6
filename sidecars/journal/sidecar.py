"""Indexes every event once (``<state_dir>/index.jsonl``) and exports the journal's health.

The index is the idempotent side effect that proves exactly-once processing: an event
already in it (a replay after a crash) is not appended or counted again.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from prometheus_client import Counter, Gauge

from sidecars.journal.policy import JournalPolicy
from sidecars.runtime import Outcome, Sidecar, SidecarContext
from warden.journal import EVENT_TYPES, Event


def _event_unix_time(event: Event) -> float:
    return dt.datetime.strptime(event.time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


class JournalSidecar(Sidecar[JournalPolicy]):
    name = "journal"
    description = "indexes the event journal and reports a run that has gone quiet"
    default_port = 9466
    policy_schema = JournalPolicy
    handles = EVENT_TYPES
    needs_run_dir = True

    def __init__(self, ctx: SidecarContext) -> None:
        super().__init__(ctx)
        os.makedirs(ctx.state_dir, exist_ok=True)
        self.index_path = os.path.join(ctx.state_dir, "index.jsonl")
        self._seen = self._load_index()
        self._fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._last_event_time: float | None = None
        self._finished = False
        reg = ctx.registry
        self.events = Counter("warden_journal_events", "Distinct journal events seen, by type.", ["type"], registry=reg)
        self.last_event = Gauge(
            "warden_journal_last_event_timestamp_seconds", "Time written in the newest event.", registry=reg
        )
        self.last_step = Gauge("warden_journal_last_step", "Step of the newest event that has one.", registry=reg)
        self.stale = Gauge("warden_journal_stale", "1 when no event arrived within the policy's limit.", registry=reg)

    def _load_index(self) -> set[int]:
        seen: set[int] = set()
        try:
            with open(self.index_path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        seen.add(int(json.loads(line)["seq"]))
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn tail from a crash: that event will be replayed
        except FileNotFoundError:
            pass
        return seen

    def handle(self, event: Event) -> Outcome:
        if event.seq not in self._seen:
            entry = {"seq": event.seq, "type": event.type, "step": event.step, "time": event.time}
            os.write(self._fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
            os.fsync(self._fd)
            self._seen.add(event.seq)
            self.events.labels(event.type).inc()
        self._finished = event.type == "run.finished"
        self._last_event_time = _event_unix_time(event)
        self.last_event.set(self._last_event_time)
        if event.step is not None:
            self.last_step.set(event.step)
        return Outcome.OK

    def check(self) -> Outcome:
        if self._last_event_time is None or self._finished:
            self.stale.set(0)
            return Outcome.OK
        quiet = self.ctx.clock() - self._last_event_time
        self.stale.set(1 if quiet > self.policy.stale_after_seconds else 0)
        return Outcome.OK

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
