"""FSDP2 (``parallel.strategy: fsdp2``): the trained models sharded over torchrun's ranks, and
their checkpoint tiles (docs/design.md section 3, "FSDP2").

Sharding: :func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to every decoder
layer (the model's ``_no_split_modules``) and then to the root, within shard groups of
``parallel.shard_group_size`` ranks (a node's, by default) replicated across the groups (HSDP on a 2-D
mesh when there are several); every parameter is split along dim 0 within its group as ``torch.chunk``
splits it (:func:`chunk_rows`).
The rollout samples from its own whole copy (no collective inside ``generate``, whose length
differs between ranks), refreshed after each update from :func:`rollout_source`.

Tiles: a checkpoint of an fsdp2 run holds, per rank R of the first shard group of W ranks,
``shards/rank-R-of-W.safetensors`` (this rank's rows of every parameter, buffer and optimizer moment)
and ``shards/rank-R-of-W.json`` (each tile's global shape and first row). A tensor that is not
sharded (a buffer, or everything in a one-process run) is a single tile written by rank 0. Reading
(:func:`read_tiles`) rebuilds each whole tensor from its tiles and refuses any gap, overlap,
out-of-range row or disagreeing shape, so a resume at any world size gets exactly the tensors that
were saved; :func:`copy_full_into` and :func:`localize_optimizer_state` then keep this rank's rows.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainer.verified_load import CheckpointRejected, VerifiedCheckpoint
from warden.errors import ConfigError, quote_untrusted

log = logging.getLogger("warden.trainer")

SHARDS_DIR = "shards"
INDEX_FORMAT = "warden-fsdp2-tiles/1"
TILE_FILE = re.compile(r"shards/rank-([0-9]+)-of-([0-9]+)\.(json|safetensors)")
GROUPS = ("actor", "critic", "optim_actor", "optim_critic")
"""Tensor name prefixes in a tile file: model weights, then optimizer moments ``optim_X/<index>/<key>``."""


class TilingError(ValueError):
    """Tiles that do not make up whole tensors (a gap, an overlap, shapes that disagree)."""


def tile_stem(rank: int, world: int) -> str:
    return f"{SHARDS_DIR}/rank-{rank}-of-{world}"


# -- sharding ---------------------------------------------------------------------------------
def shard_group_size(configured: int, world: int, local_world: int) -> int:
    """Ranks per shard group: ``parallel.shard_group_size``, 0 meaning one group per node (torchrun's
    LOCAL_WORLD_SIZE). Pure; ConfigError unless it divides the world."""
    size = configured or local_world or world
    if size < 1 or world % size:
        raise ConfigError(
            f"parallel.shard_group_size: {size} rank(s) per shard group do not divide the world of {world} "
            "(0: one group per node)"
        )
    return size


def make_mesh(device: torch.device, world: int, group: int) -> Any:
    """All ranks in one shard group (FSDP), or ``world / group`` replicas of groups of ``group``
    consecutive ranks (HSDP: sharded within a group, gradients all-reduced across the replicas)."""
    from torch.distributed.device_mesh import init_device_mesh

    if group == world:
        return init_device_mesh(device.type, (world,))
    return init_device_mesh(device.type, (world // group, group), mesh_dim_names=("replicate", "shard"))


@dataclass(frozen=True)
class ShardLayout:
    """Where this rank sits: its replica, its place in its shard group and the group's size."""

    replica: int = 0
    shard: int = 0
    shards: int = 1


def layout_of(mesh: Any) -> ShardLayout:
    if mesh.ndim == 1:
        return ShardLayout(0, mesh.get_local_rank(), mesh.size())
    return ShardLayout(mesh.get_local_rank(0), mesh.get_local_rank(1), mesh.size(1))


def layer_class_names(model: torch.nn.Module) -> set[str]:
    """Class names of the blocks each get their own FSDP group: the ``_no_split_modules`` of every
    transformers model inside ``model`` (a critic's backbone too)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def shard_model(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """``fully_shard`` on each decoder layer, then on ``model`` (in place; returns it)."""
    from torch.distributed.fsdp import fully_shard

    layers = layer_class_names(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layers:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: Any) -> bool:
    """Whether ``model``'s parameters are DTensors (sharded by :func:`shard_model`)."""
    from torch.distributed.tensor import DTensor

    return model is not None and any(isinstance(p, DTensor) for p in model.parameters())


class FullParameters:
    """``parameters()`` of a sharded model as whole tensors (one all-gather each, in order): what
    :meth:`trainer.rollout.HFRollout.sync_weights` copies into its own copy. Every rank must iterate."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def parameters(self) -> Iterator[torch.Tensor]:
        for p in self.model.parameters():
            yield p.full_tensor() if hasattr(p, "full_tensor") else p


def rollout_source(model: Any) -> Any:
    """What the rollout engine syncs from: the model itself, or :class:`FullParameters` when sharded."""
    from trainer.models import unwrap

    return FullParameters(model) if is_sharded(model) else unwrap(model)


# -- tiles of this rank ------------------------------------------------------------------------
def chunk_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """(first row, row count) of ``rank``'s piece of ``rows`` as ``torch.chunk`` (FSDP2's Shard(0))
    cuts them: pieces of ceil(rows / world), the last ones shorter or empty. Pure."""
    size = math.ceil(rows / world) if rows else 0
    start = min(rank * size, rows)
    return start, max(0, min(size, rows - start))


@dataclass(frozen=True)
class Tile:
    tensor: torch.Tensor  # this rank's rows (the whole tensor for an unsharded one)
    offset: int  # its first row in the whole tensor
    shape: tuple[int, ...]  # the whole tensor's shape


def _expected_placements(mesh: Any) -> tuple[Any, ...]:
    from torch.distributed.tensor import Replicate, Shard

    return (Shard(0),) if mesh.ndim == 1 else (Replicate(), Shard(0))


def local_tile(value: torch.Tensor) -> Tile:
    """``value``'s rows held here: a DTensor's local shard (checked against :func:`chunk_rows`, so a
    placement other than Shard(0) within the shard group is an error, never a wrong file), else all of it."""
    from torch.distributed.tensor import DTensor

    shape = tuple(value.shape)
    if not isinstance(value, DTensor):
        return Tile(value.detach(), 0, shape)
    local = value.to_local().detach()
    layout = layout_of(value.device_mesh)
    start, count = chunk_rows(shape[0], layout.shard, layout.shards)
    placed = tuple(value.placements) == _expected_placements(value.device_mesh)
    if not placed or tuple(local.shape) != (count, *shape[1:]):
        raise TilingError(f"a DTensor of shape {list(shape)} placed {value.placements} is not Shard(0) in its group")
    return Tile(local, start, shape)


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (a tied one under its first name) and persistent buffers, by name."""
    saved = set(model.state_dict())
    out: dict[str, torch.Tensor] = dict(model.named_parameters())
    out.update({name: b for name, b in model.named_buffers() if name in saved})
    return out


def optimizer_moments(optimizer: Any) -> dict[str, torch.Tensor]:
    """``{"<param index>/<key>": tensor}`` of every state tensor with a dimension (AdamW's moments;
    the 0-dim step counters stay in the optimizer's JSON skeleton)."""
    out = {}
    for index, values in optimizer.state_dict()["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim():
                out[f"{index}/{key}"] = value
    return out


def optimizer_skeleton(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state dict without :func:`optimizer_moments` (those go to the tiles)."""
    saved = optimizer.state_dict()
    state = {
        index: {k: v for k, v in values.items() if not (isinstance(v, torch.Tensor) and v.dim())}
        for index, values in saved["state"].items()
    }
    return {**saved, "state": state}


def rank_tiles(trainer: Any, layout: ShardLayout) -> dict[str, Tile]:
    """Every tile this rank writes: in the first replica, sharded tensors' local rows; unsharded
    tensors on rank 0 only (the first of the first group). Other replicas write nothing."""
    from torch.distributed.tensor import DTensor

    if layout.replica:
        return {}
    sources: dict[str, torch.Tensor] = {}
    for group, model, optimizer in (
        ("actor", trainer.actor, trainer.actor_opt),
        ("critic", trainer.critic, trainer.critic_opt),
    ):
        if model is None:
            continue
        sources.update({f"{group}/{k}": v for k, v in model_tensors(model).items()})
        sources.update({f"optim_{group}/{k}": v for k, v in optimizer_moments(optimizer).items()})
    return {
        name: local_tile(value) for name, value in sources.items() if isinstance(value, DTensor) or layout.shard == 0
    }


def write_tiles(sink: Any, rank: int, world: int, tiles: Mapping[str, Tile], prefix: str = "") -> None:
    """``<prefix>rank-R-of-W.safetensors`` and its ``.json`` index into ``sink`` (a checkpoint sink)."""
    stem = prefix + os.path.basename(tile_stem(rank, world))
    index = {
        "format": INDEX_FORMAT,
        "rank": rank,
        "world_size": world,
        "tiles": {name: {"offset": t.offset, "shape": list(t.shape)} for name, t in sorted(tiles.items())},
    }
    sink.json(f"{stem}.json", index)
    sink.tensors(f"{stem}.safetensors", {name: t.tensor.contiguous() for name, t in tiles.items()})


# -- reading tiles back ------------------------------------------------------------------------
def has_tiles(checkpoint: VerifiedCheckpoint) -> bool:
    return any(name.startswith(f"{SHARDS_DIR}/") for name in checkpoint.files)


def assemble(pieces: Mapping[str, list[Tile]]) -> dict[str, torch.Tensor]:
    """Each whole tensor from its tiles. Pure. Raises TilingError unless the tiles of a name agree on
    the shape and dtype, each holds whole rows ``offset .. offset + rows`` inside it, and together they
    cover every row exactly once (a 0-dim tensor: exactly one tile). The rules are checked before the
    whole tensor is allocated, so a claimed shape is never larger than the rows the files hold."""
    out = {}
    for name, tiles in pieces.items():
        shapes = {t.shape for t in tiles}
        dtypes = {t.tensor.dtype for t in tiles}
        if len(shapes) != 1 or len(dtypes) != 1:
            raise TilingError(
                f"{name}: tiles disagree on the shape {sorted(shapes)} or dtype {sorted(map(str, dtypes))}"
            )
        shape = tiles[0].shape
        if not shape:
            if len(tiles) != 1 or tiles[0].offset != 0 or tiles[0].tensor.dim():
                raise TilingError(f"{name}: a 0-dim tensor needs exactly one 0-dim tile at offset 0")
            out[name] = tiles[0].tensor.clone()
            continue
        placed = _row_order(name, tiles, shape)
        whole = torch.empty(shape, dtype=tiles[0].tensor.dtype)
        for tile in placed:
            whole[tile.offset : tile.offset + tile.tensor.shape[0]] = tile.tensor
        out[name] = whole
    return out


def _row_order(name: str, tiles: list[Tile], shape: tuple[int, ...]) -> list[Tile]:
    """The non-empty tiles in row order, once they are known to cover rows 0..shape[0] exactly once."""
    covered, placed = 0, []
    for tile in sorted(tiles, key=lambda t: (t.offset, t.tensor.shape[0] if t.tensor.dim() else 0)):
        if tile.tensor.dim() != len(shape) or tuple(tile.tensor.shape[1:]) != shape[1:]:
            raise TilingError(f"{name}: a tile of shape {list(tile.tensor.shape)} is no rows of {list(shape)}")
        rows = tile.tensor.shape[0]
        if rows == 0:
            continue  # an empty piece (a rank past the last row) holds nothing
        if tile.offset != covered:
            what = "overlap" if tile.offset < covered else "gap"
            raise TilingError(f"{name}: {what} at row {min(tile.offset, covered)} of {shape[0]}")
        if tile.offset + rows > shape[0]:
            raise TilingError(f"{name}: rows {tile.offset}..{tile.offset + rows} beyond {shape[0]}")
        covered += rows
        placed.append(tile)
    if covered != shape[0]:
        raise TilingError(f"{name}: rows {covered}..{shape[0]} are in no tile")
    return placed


def tile_world(names: list[str]) -> int:
    """The world size W of ``shards/rank-R-of-W.*``, checking that exactly ranks 0..W-1 each have
    both files and nothing else is there. Raises CheckpointRejected."""
    found: dict[tuple[int, int], set[str]] = {}
    for name in names:
        match = TILE_FILE.fullmatch(name)
        if match is None:
            raise CheckpointRejected(f"{quote_untrusted(name, 80)}: not a tile file name")
        rank, world = int(match.group(1)), int(match.group(2))
        if tile_stem(rank, world) != name.rsplit(".", 1)[0]:
            raise CheckpointRejected(f"{quote_untrusted(name, 80)}: not the canonical tile file name")
        found.setdefault((rank, world), set()).add(match.group(3))
    worlds = {w for _r, w in found}
    if len(worlds) != 1:
        raise CheckpointRejected(f"{SHARDS_DIR}/: tiles of world sizes {sorted(worlds)}, expected one")
    world = worlds.pop()
    expected = {(r, world): {"json", "safetensors"} for r in range(world)}
    if found != expected:
        raise CheckpointRejected(f"{SHARDS_DIR}/: expected both files of ranks 0..{world - 1} of {world}")
    return world


def _index_tiles(index: Any, tensors: Mapping[str, torch.Tensor], rank: int, world: int, stem: str) -> dict[str, Tile]:
    """One rank's tiles from its JSON index and safetensors file (names must match exactly)."""
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise CheckpointRejected(f"{stem}.json: not a {INDEX_FORMAT} index")
    if index.get("rank") != rank or index.get("world_size") != world:
        raise CheckpointRejected(f"{stem}.json: says rank {quote_untrusted(index.get('rank'))}, its name {rank}")
    listed = index.get("tiles")
    if not isinstance(listed, dict) or set(listed) != set(tensors):
        raise CheckpointRejected(f"{stem}.json: its tiles are not the tensors of {stem}.safetensors")
    out = {}
    for name, entry in listed.items():
        shape, offset = (entry.get("shape"), entry.get("offset")) if isinstance(entry, dict) else (None, None)
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or type(offset) is not int:
            raise CheckpointRejected(f"{stem}.json: {quote_untrusted(name, 80)}: no shape and offset")
        out[name] = Tile(tensors[name], offset, tuple(shape))
    return out


def read_tiles(checkpoint: VerifiedCheckpoint) -> dict[str, torch.Tensor]:
    """Every whole tensor of a verified checkpoint's tiles, by name. Raises CheckpointRejected."""
    names = sorted(n for n in checkpoint.files if n.startswith(f"{SHARDS_DIR}/"))
    world = tile_world(names)
    pieces: dict[str, list[Tile]] = {}
    for rank in range(world):
        stem = tile_stem(rank, world)
        tiles = _index_tiles(
            checkpoint.json(f"{stem}.json"), checkpoint.tensors(f"{stem}.safetensors"), rank, world, stem
        )
        for name, tile in tiles.items():
            pieces.setdefault(name, []).append(tile)
    unknown = sorted(n for n in pieces if n.split("/", 1)[0] not in GROUPS)
    if unknown:
        raise CheckpointRejected(f"{SHARDS_DIR}/: tiles of no model or optimizer: {quote_untrusted(unknown[:3])}")
    try:
        return assemble(pieces)
    except TilingError as exc:
        raise CheckpointRejected(f"{SHARDS_DIR}/: {quote_untrusted(exc, 300)}") from None


def group(tensors: Mapping[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """The tensors under ``name/``, without the prefix."""
    prefix = f"{name}/"
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def with_moments(skeleton: Any, moments: Mapping[str, torch.Tensor], where: str) -> Any:
    """An optimizer state dict: ``skeleton`` (its JSON part) with the ``<index>/<key>`` moments put back."""
    state = skeleton.get("state") if isinstance(skeleton, dict) else None
    if not isinstance(state, dict):
        raise CheckpointRejected(f"{where}: the optimizer state has no 'state' mapping")
    for name, value in moments.items():
        index, _, key = name.partition("/")
        if (
            not (index.isascii() and index.isdigit())
            or not key
            or not isinstance(state.setdefault(int(index), {}), dict)
        ):
            raise CheckpointRejected(f"{where}: tile {quote_untrusted(name, 80)} names no parameter's state")
        state[int(index)][key] = value
    return skeleton


# -- whole tensors into a (sharded) model ---------------------------------------------------------
def rows_for(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The rows of ``whole`` that ``like`` (a DTensor, or a plain tensor: all of them) holds here."""
    from torch.distributed.tensor import DTensor

    if not isinstance(like, DTensor):
        return whole
    layout = layout_of(like.device_mesh)
    start, count = chunk_rows(whole.shape[0], layout.shard, layout.shards)
    return whole[start : start + count]


@torch.no_grad()
def copy_full_into(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], may_miss: bool) -> None:
    """Copies whole ``weights`` (already checked: names, shapes) into ``model``'s local rows."""
    for name, target in model_tensors(model).items():
        if name not in weights:
            if may_miss:
                continue  # a tied weight, saved under its other name
            raise KeyError(name)
        local = target.to_local() if hasattr(target, "to_local") else target
        local.copy_(rows_for(weights[name], target))


def localize_optimizer_state(optimizer: Any, saved: Any) -> Any:
    """``saved`` (whole moments) with each moment of a DTensor parameter made that parameter's DTensor
    of this rank's rows, as ``load_state_dict`` needs for a sharded model; unchanged otherwise."""
    from torch.distributed.tensor import DTensor

    params = [p for g in optimizer.param_groups for p in g["params"]]
    for index, values in saved["state"].items():
        param = params[index]
        if not isinstance(param, DTensor):
            continue
        for key, value in list(values.items()):
            if isinstance(value, torch.Tensor) and value.dim():
                device = param.to_local().device
                local = rows_for(value, param).to(device=device, dtype=param.dtype).contiguous()
                values[key] = DTensor.from_local(
                    local,
                    param.device_mesh,
                    param.placements,
                    run_check=False,
                    shape=param.shape,
                    stride=param.stride(),
                )
    return saved


def write_configs(sink: Any, out_dir: str, model: Any) -> None:
    """``config.json`` (and ``generation_config.json``) of a transformers model, as
    :func:`trainer.models.save_pretrained_files` writes them: the weights are in the tiles."""
    sink.bytes(f"{out_dir}/config.json", model.config.to_json_string(use_diff=True).encode("utf-8"))
    generation = getattr(model, "generation_config", None)
    if generation is not None and model.can_generate():
        sink.bytes(f"{out_dir}/generation_config.json", generation.to_json_string(use_diff=True).encode("utf-8"))


# -- the parallel save -------------------------------------------------------------------------
@dataclass(frozen=True)
class StagedTiles:
    """A rank's tile files, durable in its private ``.tmp-step-N.rank-R.<random>`` under the root:
    each file's digests of the bytes written, and its size. ``error``: why they could not be written."""

    directory: str = ""
    files: tuple[tuple[str, Any, int], ...] = ()  # (file name, checkpoint.FileDigests, bytes)
    error: str = ""


class _SizedWriter:
    """A :class:`trainer.checkpoint.CheckpointWriter` that also notes each file's size."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.sizes: dict[str, int] = {}

    def json(self, relative: str, obj: Any) -> None:
        from trainer.checkpoint import json_bytes

        self.bytes(relative, json_bytes(obj))

    def bytes(self, relative: str, payload: bytes) -> None:
        self.sizes[relative] = len(payload)
        self.writer.bytes(relative, payload)

    def tensors(self, relative: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        from trainer import tensorfile

        parts = tensorfile.encode(tensors, metadata)
        self.sizes[relative] = sum(p.nbytes for p in parts)
        self.writer.buffers(relative, parts)


def stage_rank_files(
    root: str, step: int, rank: int, world: int, tiles: Mapping[str, Tile], shard_size: int | None
) -> StagedTiles:
    """Writes this rank's tile files (hashed as written, fsynced) into a private directory of its own
    under ``root``, for rank 0 to link into the checkpoint. Never raises for an OSError: the error
    is reported, so every rank still reaches the collective that follows."""
    from trainer import checkpoint as ckpt
    from warden import safeio

    try:
        root_fd = safeio.open_root(root)
    except OSError as exc:
        return StagedTiles(error=f"rank {rank}: {root}: {exc.strerror or exc}")
    try:
        name, fd = safeio.make_private_dir_at(root_fd, f".tmp-{ckpt.step_dir_name(step)}.rank-{rank}")
        writer = ckpt.CheckpointWriter(fd, shard_size=shard_size)
        sized = _SizedWriter(writer)
        try:
            try:
                write_tiles(sized, rank, world, tiles)
            finally:
                writer.finish()
        finally:
            os.close(fd)
        files = []
        for relative, size in sorted(sized.sizes.items()):
            pieces = tuple((s, e, raw) for (n, s, e), raw in sorted(writer.shards.items()) if n == relative)
            files.append((relative, ckpt.FileDigests(writer.digests[relative], pieces), size))
        return StagedTiles(name, tuple(files))
    except (OSError, ckpt.CheckpointError) as exc:
        detail = exc.strerror or exc if isinstance(exc, OSError) else exc
        return StagedTiles(error=f"rank {rank}: tile files not written under {root}: {detail}")
    finally:
        os.close(root_fd)


def adopt_staged(writer: Any, root: str, staged: list[StagedTiles]) -> None:
    """Links every other rank's staged tile files into rank 0's checkpoint being written, under
    ``shards/``, with the digests those ranks computed. Raises CheckpointError."""
    from trainer import checkpoint as ckpt
    from warden import safeio

    root_fd = safeio.open_root(root)
    try:
        for part in staged:
            if part.error:
                raise ckpt.CheckpointError(part.error)
            if not part.directory:
                continue  # a rank of another replica: its rows are the first replica's
            try:
                src = os.open(part.directory, safeio.DIR_FLAGS, dir_fd=root_fd)
            except OSError as exc:
                raise ckpt.CheckpointError(f"{part.directory}: {exc.strerror or exc}") from exc
            try:
                for name, digests, size in part.files:
                    writer.adopt(f"{SHARDS_DIR}/{name}", src, name, digests, size)
            finally:
                os.close(src)
    finally:
        os.close(root_fd)


def discard_staged(root: str, staged: StagedTiles) -> None:
    """Removes a rank's staging directory (its files live on as links in the checkpoint, if saved)."""
    from warden import safeio

    if not staged.directory:
        return
    try:
        root_fd = safeio.open_root(root)
    except OSError as exc:
        log.warning("%s: staged tiles %s not removed: %s", root, staged.directory, exc.strerror or exc)
        return
    try:
        safeio.remove_tree_at(root_fd, staged.directory)
    except OSError as exc:  # left for remove_stale_temporaries at the next start
        log.warning("%s: staged tiles %s not removed: %s", root, staged.directory, exc.strerror or exc)
    finally:
        os.close(root_fd)
