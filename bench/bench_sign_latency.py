#!/usr/bin/env python3
"""Signing latency: from ``checkpoint.saved`` in the journal to the ``.sig`` on disk.

Starts ``warden sidecar run signer`` as a service (journal poll interval ``--poll``),
then per round writes a checkpoint-shaped directory of ``--size-mb`` MiB the way the
trainer does (``.tmp-step-N/``, fsync, rename), measures the anchor (the same
checkpoint hashed and signed in this process by ``sign_checkpoint``, page cache warm,
bundle written to a scratch file; best of 3), appends ``checkpoint.saved`` and times how long the
service takes until ``step-N.sig`` exists. Prints each round, the median, the ratio to
the anchor (1.00 = the service adds nothing to the hash) and the overhead in ms.
This is not a test: the numbers depend on the machine; only the ratios mean something.

    .venv/bin/python bench/bench_sign_latency.py --size-mb 200 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from warden.journal import EventWriter
from warden.payloads import CheckpointSaved
from warden.safeio import fsync_dir
from warden.signing import load_private_key, sign_checkpoint
from warden.signing.keys import generate_keypair
from warden.signing.manifest import announce_tree

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def layout(size_mb: int) -> list[tuple[str, int]]:
    """(name, bytes) of a trainer-like checkpoint of about ``size_mb`` MiB."""
    total = size_mb * MIB
    files = [
        ("actor/model.safetensors", total * 45 // 100),
        ("critic/critic.safetensors", total * 15 // 100),
        ("optim_actor.safetensors", total * 30 // 100),
        ("optim_critic.safetensors", total * 10 // 100),
    ]
    files += [("actor/config.json", 700), ("optim_actor.json", 4000), ("rng.json", 300), ("trainer_state.json", 900)]
    return files


def write_checkpoint(root: Path, step: int, size_mb: int, pool: bytes) -> Path:
    """Writes ``.tmp-step-N/`` with distinct content, fsyncs it and renames it to ``step-N/``."""
    tmp, final = root / f".tmp-step-{step:09d}", root / f"step-{step:09d}"
    doubled = pool + pool
    for index, (name, size) in enumerate(layout(size_mb)):
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        offset = (index * 7919 + step * 104729) % len(pool)
        with open(path, "wb") as fh:
            remaining = size
            while remaining:
                piece = doubled[offset : offset + min(remaining, len(pool))]
                fh.write(piece)
                remaining -= len(piece)
            fh.flush()
            os.fsync(fh.fileno())
    os.rename(tmp, final)
    fsync_dir(str(root))
    return final


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_sidecar(run_dir: Path, policy: Path, poll: float, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "sidecars.cli", "sidecar", "run", "signer", "--run-dir", str(run_dir)]
    cmd += ["--policy", str(policy), "--port", str(port), "--poll-interval", str(poll), "--log-level", "warning"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.05)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the signer sidecar did not start: {log.read_text()[-2000:]}")


def wait_for(path: str, timeout: float) -> float:
    """Busy-polls (1 ms) until ``path`` exists; returns the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {timeout}s")
        time.sleep(0.001)
    return time.monotonic()


def sidecar_sign_seconds(port: int) -> float:
    """Mean seconds the sidecar itself spent per sign (its hash duration histogram)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    values = {}
    for line in body.splitlines():
        if line.startswith("warden_signer_hash_duration_seconds_") and 'operation="sign"' in line:
            name = line.split("{", 1)[0].rsplit("_", 1)[-1]
            values[name] = float(line.rsplit(" ", 1)[1])
    return values.get("sum", 0.0) / max(1.0, values.get("count", 0.0))


def timed_sign(directory: Path, key: object, signature: str) -> float:
    """Seconds for one in-process hash + sign of ``directory`` (the anchor)."""
    t0 = time.monotonic()
    sign_checkpoint(directory, key, signature_path=signature)  # type: ignore[arg-type]
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200, help="checkpoint size in MiB (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="checkpoints to sign (default 5)")
    parser.add_argument("--poll", type=float, default=0.02, help="the sidecar's --poll-interval (default 0.02)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warden-bench-sign-") as scratch:
        base = Path(scratch)
        keys = generate_keypair(base / "keys")
        key = load_private_key(keys.private_key)
        run_dir, root = base / "run", base / "run" / "checkpoints"
        root.mkdir(parents=True)
        policy = base / "signer.yaml"
        policy.write_text(
            f"version: 1\nsigning_key: {keys.private_key}\nstable_seconds: 3600\nreverify_interval_seconds: 0\n"
            "check_interval_seconds: 0.5\nrescan_seconds: 3600\n"
        )
        journal = EventWriter(str(run_dir / "events.jsonl"), "bench-sign")
        proc, port = start_sidecar(run_dir, policy, args.poll, base / "sidecar.log")
        pool = os.urandom(16 * MIB)
        anchors, latencies = [], []
        print(f"checkpoint {args.size_mb} MiB, {args.rounds} rounds, sidecar --poll-interval {args.poll}")
        print(f"{'round':>5} {'anchor s':>9} {'sidecar s':>10} {'ratio':>6} {'overhead ms':>12}")
        try:
            for round_no in range(1, args.rounds + 1):
                step = 2 * round_no
                directory = write_checkpoint(root, step, args.size_mb, pool)
                anchor = min(timed_sign(directory, key, str(base / "anchor.sig")) for _ in range(3))
                # what the trainer announces (it hashes while serialising; not part of the signer's latency)
                saved = CheckpointSaved(path=str(directory), root=str(root)).with_announced(announce_tree(directory))
                t1 = time.monotonic()  # the line is appended inside emit (then fsynced): time from before the call
                journal.emit(saved.TYPE, saved.to_data(), step=step)
                latency = wait_for(str(directory) + ".sig", timeout=300) - t1
                anchors.append(anchor)
                latencies.append(latency)
                ratio = latency / anchor
                print(f"{round_no:>5} {anchor:>9.3f} {latency:>10.3f} {ratio:>6.2f} {(latency - anchor) * 1e3:>12.1f}")
            inside = sidecar_sign_seconds(port)
        finally:
            proc.terminate()
            proc.wait(10)
            journal.close()
        anchor, latency = statistics.median(anchors), statistics.median(latencies)
        print(
            f"median: anchor (in-process sign) {anchor:.3f} s, checkpoint.saved -> .sig {latency:.3f} s, "
            f"ratio {latency / anchor:.2f}, overhead {(latency - anchor) * 1e3:.0f} ms "
            f"({args.size_mb / latency:.0f} MiB/s end to end)"
        )
        print(
            f"inside the sidecar: {inside:.3f} s per hash+sign (mean), so journal wake-up, event handling and the "
            f"atomic .sig write add {(latency - inside) * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
