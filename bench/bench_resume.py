"""Resume read time: ``read_verified`` + decode of every tensor, beside the hardware's floor measured in
the same run on the same files.

A checkpoint of ``--size-gib`` (four safetensors files of fp32 tensors and the trainer's JSON) is written
with ``write_checkpoint`` twice, in the shards serialization (``--shard-mb``) and in files. Rows:

- (a) ``read_verified + decode``: what a resume does (anchor: the manifest's shards, or its whole-file
  digests), then every tensor and JSON file decoded from the verified buffers;
- (b) ``sequential read``: every file read once into a preallocated buffer, one thread, no hashing;
- (c) ``all-thread sha256``: the same bytes (in memory) hashed in shards of ``--shard-mb`` by a pool
  of ``--workers`` threads;
- ``old``: the previous path, inline: each file read sequentially into ``bytes`` (chunks joined),
  hashed afterwards (its shards, or whole), then ``safetensors.torch.load`` of those bytes.

The floor is (b) + (c): a cold read, then hashing on every core. Cold rows run after the page cache is
dropped (``/proc/sys/vm/drop_caches`` as root, else ``posix_fadvise(DONTNEED)`` of the files, which
evicts their clean pages without privileges; said which); warm rows read from the page cache. Prints
medians of ``--rounds`` (rows interleaved) and each row's ratio to (b) + (c) in the same state.

    python bench/bench_resume.py --size-gib 1 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
from safetensors.torch import load

from trainer import checkpoint as ckpt
from trainer.verified_load import POPULATE_WRITE, Anchor, default_workers, integrity_anchor, read_verified

PARTS = ("actor/model.safetensors", "optim_actor.safetensors", "critic/critic.safetensors", "optim_critic.safetensors")
MIB = 1 << 20
BUDGET = 1 << 50


def write(root: str, step: int, size: int, shard_size: int | None) -> str:
    """A checkpoint of ``size`` bytes of fp32 tensors in PARTS (64 tensors each) plus the trainer's JSON."""
    per_tensor = max(1, size // len(PARTS) // 64 // 4)
    gen = torch.Generator().manual_seed(step)

    def fill(writer: ckpt.CheckpointWriter) -> None:
        for part in PARTS:
            writer.tensors(part, {f"t{i}": torch.rand(per_tensor, generator=gen) for i in range(64)})
        writer.json(ckpt.STATE, {"step": step, "run_id": "bench"})

    return ckpt.write_checkpoint(root, step, fill, shard_size).path


def shard_anchor(path: str) -> Anchor:
    """What a shards signature vouches for: the manifest's shards, and the manifest's own."""
    with open(os.path.join(path, ckpt.MANIFEST), "rb") as fh:
        raw = fh.read()
    pieces = {name: tuple((s, e, h) for s, e, h in shards) for name, shards in json.loads(raw)["shards"].items()}
    pieces[ckpt.MANIFEST] = ((0, len(raw), hashlib.sha256(raw).hexdigest()),)
    return Anchor(pieces, "bench: the manifest's shards", signed=True)


def files_of(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def resume_read(path: str, anchor: Anchor, workers: int) -> None:
    """(a): verify, then decode every file from the verified buffers."""
    verified = read_verified(path, 1, anchor, BUDGET, workers)
    for name in verified.files:
        _ = verified.tensors(name) if name.endswith(".safetensors") else verified.json(name)


def sequential_read(path: str) -> list[memoryview]:
    """(b): each file read once into a preallocated buffer of its size, one thread: a private anonymous
    mapping whose pages are populated in one call (as read_verified's are, per chunk), not zero-filled."""
    out = []
    for name in files_of(path):
        with open(os.path.join(path, name), "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if size else None
            if region is not None:
                with contextlib.suppress(OSError):
                    region.madvise(POPULATE_WRITE)
            view, done = memoryview(region if region is not None else bytearray()), 0
            while done < size:
                done += fh.readinto(view[done:])
        out.append(view)
    return out


def all_thread_sha256(buffers: list[memoryview], shard_size: int, workers: int) -> None:
    """(c): the bytes, already in memory, hashed in shards of ``shard_size`` by ``workers`` threads."""
    views = [b[s : s + shard_size] for b in buffers for s in range(0, max(len(b), 1), shard_size)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda v: hashlib.sha256(v).digest(), views))


def old_path(path: str, anchor: Anchor) -> None:
    """The previous resume read: sequential read into bytes, hash afterwards, safetensors.torch.load."""
    for name in files_of(path):
        chunks = []
        with open(os.path.join(path, name), "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 24):
                chunks.append(chunk)
        data = b"".join(chunks)
        expected = anchor.digests[name]
        if isinstance(expected, str):
            assert hashlib.sha256(data).hexdigest() == expected
        else:
            assert all(hashlib.sha256(data[s:e]).hexdigest() == h for s, e, h in expected)
        _ = load(data) if name.endswith(".safetensors") else json.loads(data)


def drop_cache(paths: list[str]) -> str:
    """Evicts the checkpoints from the page cache; returns how."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for path in paths:
        for name in files_of(path):
            fd = os.open(os.path.join(path, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise DONTNEED (not root: no drop_caches)"


def timed(action: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    gc.collect()
    return elapsed


def one_round(dirs: dict[str, str], anchors: dict[str, Anchor], args: argparse.Namespace, cold: bool) -> dict:
    """Every row once: cold (the cache dropped before each row) or warm (the files in the page cache)."""
    times: dict[str, Any] = {"how": ""}

    def prepare() -> None:
        if cold:
            times["how"] = drop_cache(list(dirs.values()))

    prepare()
    buffers: list[memoryview] = []
    times["b"] = timed(lambda: buffers.extend(sequential_read(dirs["shards"])))
    times["c"] = timed(lambda: all_thread_sha256(buffers, args.shard_mb * MIB, args.workers))
    buffers.clear()
    for mode, path in dirs.items():
        prepare()
        times[f"{mode} a"] = timed(lambda p=path, m=mode: resume_read(p, anchors[m], args.workers))
        prepare()
        times[f"{mode} old"] = timed(lambda p=path, m=mode: old_path(p, anchors[m]))
    return times


def report(rounds: list[dict], state: str) -> None:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    floor = median("b") + median("c")
    rows = [("(b) sequential read", median("b")), ("(c) all-thread sha256", median("c"))]
    print(f"  {state}{' (' + rounds[0]['how'] + ')' if rounds[0]['how'] else ''}")
    for label, value in [*rows, ("(b)+(c) floor", floor)]:
        print(f"    {label:<48} {value:7.3f} s")
    for mode in ("shards", "files"):
        for key, label in (("a", "(a) read_verified + decode"), ("old", "old: read, hash, safetensors.load")):
            value = median(f"{mode} {key}")
            print(f"    {mode + ' ' + label:<48} {value:7.3f} s   {value / floor:5.2f}x floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--shard-mb", type=int, default=256, help="checkpoint.shard_size, in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary one)")
    args = parser.parse_args()
    size = int(args.size_gib * (1 << 30))
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        dirs = {
            "shards": write(os.path.join(root, "shards"), 1, size, args.shard_mb * MIB),
            "files": write(os.path.join(root, "files"), 1, size, None),
        }
        anchors = {"shards": shard_anchor(dirs["shards"]), "files": integrity_anchor(dirs["files"])}
        total = sum(os.path.getsize(os.path.join(dirs["shards"], n)) for n in files_of(dirs["shards"]))
        print(
            f"resume read, {total / (1 << 30):.2f} GiB in {len(files_of(dirs['shards']))} files, shards of "
            f"{args.shard_mb} MiB, {args.workers} workers, {os.cpu_count()} cores, median of {args.rounds} rounds"
        )
        for cold in (True, False):
            if not cold:
                for path in dirs.values():
                    sequential_read(path)  # both checkpoints into the page cache
            rounds = [one_round(dirs, anchors, args, cold) for _ in range(args.rounds)]
            report(rounds, "cold" if cold else "warm")


if __name__ == "__main__":
    main()
