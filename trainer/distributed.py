"""torchrun support: process group setup, rank helpers, device placement."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pin_gpus(gpu_uuids: tuple[str, ...]) -> None:
    """Sets CUDA_VISIBLE_DEVICES to GPU UUIDs; must run before CUDA is initialised.

    UUIDs survive a restart on a host where device numbers changed.
    """
    if gpu_uuids:
        if torch.cuda.is_initialized():
            raise RuntimeError("run.gpu_uuids must be applied before CUDA is initialised")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)


def init_distributed(device: str) -> DistInfo:
    """Joins the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, NCCL on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return DistInfo(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0"))
    )


def pick_device(requested: str, info: DistInfo) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        torch.cuda.set_device(info.local_rank)
        return torch.device("cuda", info.local_rank)
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.world_size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def rank_slice(rows: int, info: DistInfo) -> slice:
    """This rank's contiguous share of ``rows`` (equal shares; the config checks divisibility)."""
    if rows % info.world_size:
        raise ValueError(f"{rows} rows do not split evenly over {info.world_size} ranks")
    share = rows // info.world_size
    return slice(info.rank * share, (info.rank + 1) * share)


def all_gather_rows(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's equally shaped ``tensor`` concatenated along dim 0, in rank order."""
    if info.world_size <= 1:
        return tensor
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(info.world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def all_gather_objects(items: list, info: DistInfo) -> list:  # type: ignore[type-arg]
    """Every rank's list concatenated in rank order (pickled by torch; only our own strings and floats)."""
    if info.world_size <= 1:
        return items
    import torch.distributed as dist

    parts: list = [None] * info.world_size  # type: ignore[type-arg]
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def broadcast_object(obj: object, info: DistInfo) -> object:
    """Rank 0's ``obj`` on every rank (pickled by torch; only our own small values: strings, ints, tuples)."""
    if info.world_size <= 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
