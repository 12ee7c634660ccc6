"""``warden events tail``: read or follow a run's journal."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import click

from warden.cliutil import echo, format_option, option, run_dir_option
from warden.errors import IncompleteError
from warden.journal import JOURNAL_NAME, Cursor, Event, JournalFollower, JournalReader


@click.group()
def events() -> None:
    """Read the trainer's event journal."""


def _summary(data: dict[str, Any], limit: int = 6) -> str:
    parts = []
    for key, value in data.items():
        if isinstance(value, bool | int | str) or value is None:
            parts.append(f"{key}={value}")
        elif isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        if len(parts) == limit:
            break
    return " ".join(parts)


def format_event_text(event: Event) -> str:
    """One human line: seq, time, type, step and the first scalar fields of data."""
    step = f"step={event.step}" if event.step is not None else "-"
    return f"#{event.seq:<6} {event.time}  {event.type:<20} {step:<12} {_summary(event.data)}".rstrip()


@events.command("tail")
@run_dir_option()
@option("--follow", "-f", is_flag=True, help="Keep waiting for new events until Ctrl-C.")
@option("--type", "types", multiple=True, help="Only events of this type (repeatable).")
@option("--last", type=int, default=0, help="Show only the last N events (0: all).")
@option("--poll-interval", type=float, default=0.5, show_default=True, help="Seconds between polls with --follow.")
@format_option()
def tail(
    run_dir: str, follow: bool, types: tuple[str, ...], last: int, poll_interval: float, output_format: str
) -> None:
    """Print the events of RUN_DIR/events.jsonl, oldest first.

    Corrupt lines, oversized lines and gaps in seq are reported on stderr and skipped.
    """
    path = os.path.join(run_dir, JOURNAL_NAME)
    if not follow and not os.path.exists(path):
        raise IncompleteError(f"{path}: no journal here; is --run-dir the trainer's run directory?")
    reader = JournalReader(path, Cursor(), on_problem=lambda msg: echo(f"warning: {msg}", err=True))
    wanted = set(types)

    def emit(batch: list[Event]) -> None:
        for event in batch:
            if output_format == "json":
                echo(json.dumps(event.to_dict(), ensure_ascii=False))
            else:
                echo(format_event_text(event))

    def read_batch() -> list[Event]:
        return [e for e, _ in reader.read_available() if not wanted or e.type in wanted]

    batch = read_batch()
    emit(batch[-last:] if last else batch)
    if not follow:
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    follower = JournalFollower(path, poll_interval)
    try:
        while not stop.is_set():
            follower.wait(stop)
            emit(read_batch())
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()
