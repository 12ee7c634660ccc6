"""Checkpoint save time: the trainer's writer (serialise in memory, hash those bytes while writing,
no re-read) beside two anchors measured in the same run on the same tensors:

- ``floor``: safetensors ``save_file`` of each file plus fsync, no hashing at all;
- ``write+rehash``: the previous save path: ``save_file`` + fsync, then every file read back and
  hashed for the manifest and the announcement.

Prints seconds (median of the rounds) and each row's ratio to the floor.

    python bench/bench_checkpoint_save.py --size-mb 512 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
from safetensors.torch import save_file

from trainer import checkpoint as ckpt

PARTS = ("actor/model.safetensors", "optim_actor.safetensors", "critic/critic.safetensors", "optim_critic.safetensors")


def make_state(size_mb: int) -> dict[str, dict[str, torch.Tensor]]:
    """Four files of fp32 tensors, ``size_mb`` in all, in 64 tensors each (a model's layout)."""
    per_file = size_mb * 1024 * 1024 // len(PARTS) // 4
    per_tensor = max(1, per_file // 64)
    gen = torch.Generator().manual_seed(0)
    return {part: {f"t{i}": torch.randn(per_tensor, generator=gen) for i in range(64)} for part in PARTS}


def with_writer(root: str, step: int, state: dict[str, dict[str, torch.Tensor]]) -> None:
    def fill(writer: ckpt.CheckpointWriter) -> None:
        for part, tensors in state.items():
            writer.tensors(part, tensors)

    ckpt.write_checkpoint(root, step, fill)


def _save_all(directory: str, state: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    paths = []
    for part, tensors in state.items():
        path = os.path.join(directory, part)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_file(tensors, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        paths.append(path)
    return paths


def floor(root: str, step: int, state: dict[str, dict[str, torch.Tensor]]) -> None:
    _save_all(os.path.join(root, f"floor-{step}"), state)


def write_then_rehash(root: str, step: int, state: dict[str, dict[str, torch.Tensor]]) -> None:
    for path in _save_all(os.path.join(root, f"rehash-{step}"), state):
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, "sha256")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    state = make_state(args.size_mb)
    rows = {"floor": floor, "write+rehash": write_then_rehash, "writer (in-memory digest)": with_writer}
    times: dict[str, list[float]] = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as root:
        names = list(rows)
        for step in range(args.rounds):
            # interleaved and rotated, so load on the machine and writeback hit every row alike
            for name in names[step % len(names) :] + names[: step % len(names)]:
                os.sync()
                start = time.perf_counter()
                rows[name](root, step, state)
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["floor"])
    print(f"checkpoint save, {args.size_mb} MB in {len(PARTS)} files, median of {args.rounds} rounds")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<28} {median:7.3f} s   {median / base:5.2f}x floor")


if __name__ == "__main__":
    main()
