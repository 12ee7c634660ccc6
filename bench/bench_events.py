"""Event journal benchmark: emit cost (with and without fsync) and reader throughput.

Anchors, measured side by side in the same run: a bare ``os.write`` of the same bytes
(the floor for emit) and ``json.loads`` over the same lines (the floor for reading).
Goals (issue 2): emit without fsync < 20 us; reader > 100k events/s.

    python bench/bench_events.py [--events 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from warden.journal import Cursor, EventWriter, JournalReader

DATA = {"reward_mean": 0.8125, "kl": 0.0041, "policy_loss": -0.02, "tokens_per_second": 1900.5, "phase": "update"}


def emit_cost(path: str, fsync: bool, n: int) -> float:
    """Median seconds per emit() over n calls."""
    types = frozenset({"step.completed"}) if fsync else frozenset()
    writer = EventWriter(path, "bench", fsync_types=types)
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        writer.emit("step.completed", DATA, step=i)
        samples.append(time.perf_counter() - t0)
    writer.close()
    return statistics.median(samples)


def raw_write_cost(path: str, n: int) -> float:
    line = (json.dumps({"v": 1, "seq": 1, "run_id": "bench", "type": "step.completed", "data": DATA}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        os.write(fd, line)
        samples.append(time.perf_counter() - t0)
    os.close(fd)
    return statistics.median(samples)


def reader_rate(path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    count = sum(1 for _ in JournalReader(path, Cursor()).read_available())
    return count / (time.perf_counter() - t0), count


def json_rate(path: str) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        count = sum(1 for line in fh if json.loads(line))
    return count / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--fsync-samples", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "events.jsonl")
        floor = raw_write_cost(os.path.join(tmp, "raw.jsonl"), 20_000)
        nofsync = emit_cost(big, False, args.events)
        withfsync = emit_cost(os.path.join(tmp, "fsync.jsonl"), True, args.fsync_samples)
        rate, count = reader_rate(big)
        anchor = json_rate(big)
    print(f"{'measure':<34}{'ours':>14}{'anchor':>14}{'ratio':>8}  goal")
    print(
        f"{'emit() no fsync, median':<34}{nofsync * 1e6:>11.1f} us{floor * 1e6:>11.1f} us"
        f"{nofsync / floor:>8.2f}  < 20 us ({'met' if nofsync < 20e-6 else 'MISSED'})"
    )
    print(f"{'emit() with fsync, median':<34}{withfsync * 1e6:>11.1f} us{'':>14}{'':>8}  (disk-bound)")
    print(
        f"{'reader, events/s (' + str(count) + ')':<34}{rate:>14,.0f}{anchor:>14,.0f}{rate / anchor:>8.2f}"
        f"  > 100,000/s ({'met' if rate > 100_000 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
