#!/usr/bin/env python3
"""Checkpoint hashing/signing benchmark: Warden vs its anchors, side by side in one run.

Builds a checkpoint-shaped tree of ``--size-mb`` MiB (two large shards, medium tensor
files, optimizer shards, many small JSON-like files) in a temporary directory, warms the
page cache, then times each entry in ``--repeat`` interleaved rounds and keeps its best:

- all-thread ceiling: N threads of plain hashlib SHA-256 over N equal slices of the same
  bytes (N = the CPUs this process may use): what N cores can do, whatever the file sizes;
- per-file ceiling: N threads of ``hashlib.file_digest(sha256)``, one file per task: the bound
  of any per-file digest (model_signing's ``files``), set by the largest files;
- 1 thread of plain hashlib, ``sha256sum`` (one process, and ``xargs -P N``);
- Warden in ``files``, ``shards`` (each ``--shard-sizes``) and ``files``/blake3 mode: hash
  only, sign (hash + DSSE bundle), verify, and sign against a trainer announcement;
- model_signing: ``sign key`` / ``verify key`` CLI (files only: its 1.1.1 CLI has no shard
  option; includes its ~0.4 s start-up) and its API in files and shards mode;
- ``--cold``: the page cache is dropped (``POSIX_FADV_DONTNEED``) before each timed run of a
  plain 16 MiB-read pass (the disk's speed) and of Warden's verify in both modes.

Prints seconds, GB/s and the ratios to both ceilings (1.00 = as fast as the ceiling).
This is not a test: the numbers depend on the machine; only the ratios mean something.

    .venv/bin/python bench/bench_hashing.py --size-mb 2048
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import ModuleType

from warden.signing import load_private_key, load_trusted_keys, sign_checkpoint, verify_checkpoint
from warden.signing.hashing import default_workers, hash_files, hash_shards, hash_tree, scan_tree
from warden.signing.keys import generate_keypair
from warden.signing.manifest import Serialization, announce_tree, shards_root

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


def slices(paths: list[Path], parts: int) -> list[list[tuple[Path, int, int]]]:
    """The bytes of ``paths`` cut into ``parts`` equal slices of (path, start, end) ranges."""
    sizes = [(p, p.stat().st_size) for p in paths]
    total = sum(size for _, size in sizes)
    share = -(-total // parts)
    out: list[list[tuple[Path, int, int]]] = [[]]
    room = share
    for path, size in sizes:
        start = 0
        while start < size:
            take = min(room, size - start)
            out[-1].append((path, start, start + take))
            start += take
            room -= take
            if room == 0:
                out.append([])
                room = share
    return [part for part in out if part]


def sha256_slices(parts: list[list[tuple[Path, int, int]]]) -> None:
    """The all-thread ceiling: one thread per slice, hashlib over pread chunks of 1 MiB."""

    def one(part: list[tuple[Path, int, int]]) -> None:
        buf = bytearray(MIB)
        view = memoryview(buf)
        for path, start, end in part:
            digest = hashlib.sha256()
            fd = os.open(path, os.O_RDONLY)
            try:
                pos = start
                while pos < end:
                    count = os.preadv(fd, [view[: min(MIB, end - pos)]], pos)
                    digest.update(view[:count])
                    pos += count
            finally:
                os.close(fd)

    with ThreadPoolExecutor(len(parts)) as pool:
        list(pool.map(one, parts))


def drop_cache(paths: list[Path]) -> None:
    """Evicts ``paths`` from the page cache (clean pages only; no effect on tmpfs)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(paths: list[Path]) -> None:
    """Reads every file once with 16 MiB reads, no hashing: the storage's speed when cold."""
    buf = bytearray(16 * MIB)
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def best_of(repeat: int, action: Callable[[], object]) -> float:
    """Minimum wall time of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def optional_module(name: str, rows: str) -> ModuleType | None:
    """``name`` imported, or None after one line saying which rows are left out (never a traceback)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        print(
            f"  {name} is not installed ({exc}; pip install {name.partition('.')[0]}): {rows} left out", file=sys.stderr
        )
        return None


def run(cmd: list[str], cwd: Path | None = None) -> None:
    """Runs a command and fails loudly if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {done.stdout}{done.stderr}")


def model_signing_entries(
    ckpt: Path, work: Path, key: Path, pub: Path, shard_size: int
) -> dict[str, Callable[[], object]]:
    """Benchmarks of model_signing's CLI and API, as far as they are installed."""
    cli = shutil.which("model_signing", path=os.path.dirname(sys.executable)) or shutil.which("model_signing")
    entries: dict[str, Callable[[], object]] = {}
    sig = work / "ms.sig"
    if cli and subprocess.run([cli, "--help"], capture_output=True, check=False).returncode != 0:
        print(f"  {cli} does not start (a dependency missing?): its CLI rows are left out", file=sys.stderr)
        cli = None
    if cli:
        entries["model_signing sign key (CLI, files)"] = lambda: run(
            [cli, "sign", "key", str(ckpt), "--private_key", str(key), "--signature", str(sig)]
        )
        entries["model_signing verify key (CLI, files)"] = lambda: run(
            [cli, "verify", "key", str(ckpt), "--signature", str(sig), "--public_key", str(pub)]
        )
    ms_hashing = optional_module("model_signing.hashing", "its API rows")
    if ms_hashing is None:
        return entries
    entries["model_signing API hash, files"] = lambda: ms_hashing.Config().hash(ckpt)
    for size in sorted({shard_size, 1_000_000_000}):
        entries[f"model_signing API hash, shards {size / MIB:.0f} MiB"] = partial(
            lambda size: ms_hashing.Config().use_shard_serialization(shard_size=size).hash(ckpt), size
        )
    return entries


def measure(ckpt: Path, work: Path, workers: int, repeat: int, shard_sizes: list[int], cold: bool) -> dict[str, float]:
    """Runs every benchmark; the all-thread ceiling first. Returns {name: best seconds}."""
    files = all_files(ckpt)
    keys = generate_keypair(work / "keys")
    private, trusted = load_private_key(keys.private_key), load_trusted_keys(keys.public_key)
    scan = scan_tree(ckpt)
    parts = slices(sorted(files), workers)
    announced = announce_tree(ckpt)
    main_shard = shard_sizes[0]
    shards = Serialization("shards", "sha256", main_shard)
    entries: dict[str, Callable[[], object]] = {
        f"ceiling, all threads: hashlib x{workers} slices": lambda: sha256_slices(parts),
        f"ceiling, per file: hashlib x{workers} threads": lambda: plain_sha256(files, workers),
        "hashlib, 1 thread": lambda: plain_sha256(files, 1),
        "warden hash, files": lambda: hash_tree(ckpt, max_workers=workers),
    }
    if all(shutil.which(tool) for tool in ("find", "xargs", "sha256sum")):
        entries[f"sha256sum (xargs -P {workers})"] = lambda: run(
            ["sh", "-c", f"find . -type f -print0 | xargs -0 -P {workers} -n 16 sha256sum >/dev/null"], cwd=ckpt
        )
    else:
        print("  find, xargs or sha256sum is not on PATH: the sha256sum row is left out", file=sys.stderr)
    for size in shard_sizes:
        entries[f"warden hash, shards {size / MIB:.0f} MiB"] = partial(
            hash_shards, scan.root, scan.files, size, max_workers=workers
        )
    if optional_module("blake3", "the blake3 row") is not None:
        entries["warden hash, files blake3"] = lambda: hash_files(
            scan.root, scan.files, algorithm="blake3", max_workers=workers
        )
    for label, method in (("files", Serialization()), (f"shards {main_shard / MIB:.0f} MiB", shards)):
        sig = work / f"warden-{method.method}.sig"
        entries[f"warden sign, {label}"] = partial(
            sign_checkpoint, ckpt, private, signature_path=sig, max_workers=workers, serialization=method
        )
        entries[f"warden verify, {label}"] = partial(
            verify_checkpoint, ckpt, trusted, signature_path=sig, max_workers=workers
        )
    entries["warden sign, shards + announcement"] = lambda: sign_checkpoint(
        ckpt, private, signature_path=work / "ann.sig", max_workers=workers, serialization=shards, expected=announced
    )
    # what a trainer with checkpoint.serialization: shards announces (computed here once, untimed):
    # the signer compares it with the manifest it signs, without hashing every file whole as well
    sharded = hash_shards(scan.root, scan.files, main_shard, max_workers=workers).shards
    announced_shards = shards_root(sharded, main_shard, [f.name for f in scan.files])
    entries["warden sign, shards + shards announcement"] = lambda: sign_checkpoint(
        ckpt,
        private,
        signature_path=work / "ann-shards.sig",
        max_workers=workers,
        serialization=shards,
        expected=announced_shards,
    )
    entries.update(model_signing_entries(ckpt, work, Path(keys.private_key), Path(keys.public_key), main_shard))
    if cold:
        for name, action in (
            ("cold: read 16 MiB chunks, 1 thread (disk)", lambda: read_all(files)),
            ("cold: warden verify, files", entries["warden verify, files"]),
            (
                f"cold: warden verify, shards {main_shard / MIB:.0f} MiB",
                entries[f"warden verify, shards {main_shard / MIB:.0f} MiB"],
            ),
        ):
            entries[name] = action
    # Insertion order puts each "sign" before its "verify", so signatures exist when verified.
    times: dict[str, list[float]] = {name: [] for name in entries}
    for round_ in range(repeat):  # interleaved rounds, so a noisy moment hits every entry alike
        for name, action in entries.items():
            if name.startswith("cold:"):
                drop_cache(files)
            times[name].append(best_of(1, action))
        if cold:
            plain_sha256(files, workers)  # warm again for the next round
        print(f"  round {round_ + 1}/{repeat} done", file=sys.stderr, flush=True)
    return {name: min(values) for name, values in times.items()}


def report(results: dict[str, float], total_bytes: int, file_count: int, workers: int) -> None:
    """Prints the table with throughput and ratios to the ceiling."""
    values = iter(results.values())
    all_threads, per_file = next(values), next(values)
    print(f"\n{total_bytes / MIB:.0f} MiB in {file_count} files, warm page cache, {workers} hashing threads")
    print(f"{'benchmark':<48} {'seconds':>8} {'GB/s':>7} {'x all-thr':>10} {'x per-file':>10}")
    for name, seconds in results.items():
        speed = total_bytes / seconds / 1e9
        print(f"{name:<48} {seconds:8.3f} {speed:7.2f} {all_threads / seconds:10.2f} {per_file / seconds:10.2f}")
    print("x columns: ceiling time / this time (1.00 = as fast as that ceiling, higher is faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2048, help="total size of the tree (MiB)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="threads for ceiling and Warden")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; the best time is reported")
    parser.add_argument("--tmp", default=None, help="where to create the tree (default: $TMPDIR)")
    parser.add_argument(
        "--shard-sizes",
        default="268435456,67108864,1000000000",
        help="comma-separated shard sizes (bytes) for Warden's shards mode; the first is used for sign/verify",
    )
    parser.add_argument("--cold", action="store_true", help="also time verification with the page cache dropped")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warden-bench-", dir=args.tmp))
    try:
        ckpt = work / "step-000000050"
        files = layout(args.size_mb)
        print(f"writing {len(files)} files ({args.size_mb} MiB) under {ckpt}", file=sys.stderr, flush=True)
        build_tree(ckpt, files)
        plain_sha256(all_files(ckpt), args.workers)  # warm the page cache
        sizes = [int(x) for x in args.shard_sizes.split(",")]
        results = measure(ckpt, work, args.workers, args.repeat, sizes, args.cold)
        report(results, sum(size for _, size in files), len(files), args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
