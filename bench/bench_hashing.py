#!/usr/bin/env python3
"""Checkpoint hashing/signing benchmark: Warden vs its anchors, side by side in one run.

Builds a checkpoint-shaped tree of ``--size-mb`` MiB (two large shards, medium tensor
files, optimizer shards, many small JSON-like files) in a temporary directory, warms the
page cache, then times each entry in ``--repeat`` interleaved rounds and keeps its best:

- ceiling: N threads of plain ``hashlib.file_digest(sha256)``, one file per task
  (N = the CPUs this process may use); the lower bound for SHA-256 of these files;
- 1 thread of plain hashlib, ``sha256sum`` (one process, and ``xargs -P N``);
- Warden: hash only, sign (hash + DSSE bundle), verify;
- model_signing: ``sign key`` / ``verify key`` CLI (includes its ~0.4 s start-up) and API.

Prints seconds, GB/s and the ratio to the ceiling (1.00 = as fast as the ceiling).
This is not a test: the numbers depend on the machine; only the ratios mean something.

    .venv/bin/python bench/bench_hashing.py --size-mb 2048
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sidecars.signer import load_private_key, load_trusted_keys, sign_checkpoint, verify_checkpoint
from sidecars.signer.hashing import default_workers, hash_tree
from sidecars.signer.keys import generate_keypair

MIB = 1 << 20


def layout(size_mb: int) -> list[tuple[str, int]]:
    """(name, bytes) of a checkpoint-like tree totalling about ``size_mb`` MiB."""
    total = size_mb * MIB
    files = [(f"actor/model-{i + 1:05d}-of-00002.safetensors", total // 4) for i in range(2)]
    files += [(f"critic/layer-{i:03d}.safetensors", 32 * MIB) for i in range(max(1, total * 3 // 10 // (32 * MIB)))]
    files += [(f"optimizer/rank-{i:03d}.bin", 8 * MIB) for i in range(max(1, total * 15 // 100 // (8 * MIB)))]
    rng = random.Random(0)
    small_budget = total - sum(size for _, size in files)
    while small_budget > 0:
        size = min(small_budget, rng.choice([0, 300, 4096, 65536, 512 * 1024]))
        files.append((f"meta/{len(files):04d}/config.json", size))
        small_budget -= max(size, 1)
    return files


def build_tree(root: Path, files: list[tuple[str, int]]) -> None:
    """Writes ``files`` with distinct pseudo-random content (slices of a random pool)."""
    pool = os.urandom(16 * MIB)
    doubled = pool + pool
    for index, (name, size) in enumerate(files):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        offset = (index * 4099) % len(pool)
        with open(path, "wb") as fh:
            remaining = size
            while remaining:
                piece = doubled[offset : offset + min(remaining, len(pool))]
                fh.write(piece)
                remaining -= len(piece)


def all_files(root: Path) -> list[Path]:
    """Every regular file under ``root``."""
    return [Path(d) / f for d, _, names in os.walk(root) for f in names]


def plain_sha256(paths: list[Path], workers: int) -> None:
    """The ceiling: hashlib.file_digest per file on a thread pool."""

    def one(path: Path) -> bytes:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").digest()

    if workers == 1:
        for path in paths:
            one(path)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, sorted(paths, key=lambda p: -p.stat().st_size)))


def best_of(repeat: int, action: Callable[[], object]) -> float:
    """Minimum wall time of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def run(cmd: list[str], cwd: Path | None = None) -> None:
    """Runs a command and fails loudly if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {done.stdout}{done.stderr}")


def model_signing_entries(ckpt: Path, work: Path, key: Path, pub: Path) -> dict[str, Callable[[], object]]:
    """Benchmarks of model_signing's CLI and API, when it is installed."""
    cli = shutil.which("model_signing", path=os.path.dirname(sys.executable)) or shutil.which("model_signing")
    entries: dict[str, Callable[[], object]] = {}
    sig = work / "ms.sig"
    if cli:
        entries["model_signing sign key (CLI)"] = lambda: run(
            [cli, "sign", "key", str(ckpt), "--private_key", str(key), "--signature", str(sig)]
        )
        entries["model_signing verify key (CLI)"] = lambda: run(
            [cli, "verify", "key", str(ckpt), "--signature", str(sig), "--public_key", str(pub)]
        )
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError:
        return entries
    api_sig = work / "ms-api.sig"
    entries["model_signing hashing.Config().hash (API)"] = lambda: model_signing.hashing.Config().hash(ckpt)
    entries["model_signing sign (API)"] = lambda: (
        model_signing.signing.Config().use_elliptic_key_signer(private_key=key).sign(ckpt, api_sig)
    )
    entries["model_signing verify (API)"] = lambda: (
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(ckpt, api_sig)
    )
    return entries


def measure(ckpt: Path, work: Path, workers: int, repeat: int) -> dict[str, float]:
    """Runs every benchmark; the ceiling first. Returns {name: best seconds}."""
    files = all_files(ckpt)
    keys = generate_keypair(work / "keys")
    private, trusted = load_private_key(keys.private_key), load_trusted_keys(keys.public_key)
    sig = work / "warden.sig"
    entries: dict[str, Callable[[], object]] = {
        f"ceiling: hashlib x{workers} threads": lambda: plain_sha256(files, workers),
        "hashlib, 1 thread": lambda: plain_sha256(files, 1),
        "sha256sum (1 process)": lambda: run(["sha256sum", *map(str, files)]),
        f"sha256sum (xargs -P {workers})": lambda: run(
            ["sh", "-c", f"find . -type f -print0 | xargs -0 -P {workers} -n 16 sha256sum >/dev/null"], cwd=ckpt
        ),
        "warden hash_tree": lambda: hash_tree(ckpt, max_workers=workers),
        "warden sign_checkpoint": lambda: sign_checkpoint(ckpt, private, signature_path=sig, max_workers=workers),
        "warden verify_checkpoint": lambda: verify_checkpoint(ckpt, trusted, signature_path=sig, max_workers=workers),
    }
    entries.update(model_signing_entries(ckpt, work, Path(keys.private_key), Path(keys.public_key)))
    # Insertion order puts each "sign" before its "verify", so signatures exist when verified.
    times: dict[str, list[float]] = {name: [] for name in entries}
    for round_ in range(repeat):  # interleaved rounds, so a noisy moment hits every entry alike
        for name, action in entries.items():
            times[name].append(best_of(1, action))
        print(f"  round {round_ + 1}/{repeat} done", file=sys.stderr, flush=True)
    return {name: min(values) for name, values in times.items()}


def report(results: dict[str, float], total_bytes: int, file_count: int, workers: int) -> None:
    """Prints the table with throughput and ratios to the ceiling."""
    ceiling = next(iter(results.values()))
    print(f"\n{total_bytes / MIB:.0f} MiB in {file_count} files, warm page cache, {workers} hashing threads")
    print(f"{'benchmark':<44} {'seconds':>8} {'GB/s':>7} {'x ceiling':>10}")
    for name, seconds in results.items():
        print(f"{name:<44} {seconds:8.3f} {total_bytes / seconds / 1e9:7.2f} {seconds / ceiling:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2048, help="total size of the tree (MiB)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="threads for ceiling and Warden")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; the best time is reported")
    parser.add_argument("--tmp", default=None, help="where to create the tree (default: $TMPDIR)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warden-bench-", dir=args.tmp))
    try:
        ckpt = work / "step-000000050"
        files = layout(args.size_mb)
        print(f"writing {len(files)} files ({args.size_mb} MiB) under {ckpt}", file=sys.stderr, flush=True)
        build_tree(ckpt, files)
        plain_sha256(all_files(ckpt), args.workers)  # warm the page cache
        results = measure(ckpt, work, args.workers, args.repeat)
        report(results, sum(size for _, size in files), len(files), args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
