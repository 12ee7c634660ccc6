"""FSDP2 (``parallel.strategy: fsdp2``): sharded training under torchrun and its tiled checkpoints.

The slow tests launch real torchrun ranks (gloo on CPU) through ``sidecars.cli train``, as
test_distributed.py does: 2 FSDP2 ranks against one plain process on the first steps' metrics, the
2-rank checkpoint resumed on 2 ranks and on 1, and a flipped byte in a rank's tile file refused.
The tiling rules (:func:`trainer.fsdp.assemble`) are checked with generated inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from support import ROOT, TEST_CONFIG, merge

from trainer import fsdp
from trainer.config import ParallelConfig, TrainerConfig, validate
from warden import journal as ev
from warden.errors import ConfigError

KEYS = (
    "reward_mean",
    "kl",
    "policy_loss",
    "value_loss",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "grad_norm",
    "response_length/mean",
    "response_tokens",
)
STEP_1 = "step-000000001"


# -- tiles (pure) ---------------------------------------------------------------------------------
@given(rows=st.integers(0, 40), world=st.integers(1, 9))
def test_chunk_rows_are_torch_chunk_pieces(rows, world):
    whole = torch.arange(rows)
    pieces = list(torch.chunk(whole, world)) if rows else []
    for rank in range(world):
        start, count = fsdp.chunk_rows(rows, rank, world)
        expected = pieces[rank] if rank < len(pieces) else whole[:0]
        assert whole[start : start + count].tolist() == expected.tolist()


def _tiles(whole, world):
    out = []
    for rank in range(world):
        start, count = fsdp.chunk_rows(whole.shape[0], rank, world)
        out.append(fsdp.Tile(whole[start : start + count], start, tuple(whole.shape)))
    return out


shapes = st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, world=st.integers(1, 5), seed=st.integers(0, 2**16), reverse=st.booleans())
def test_tiles_of_any_world_reassemble_the_tensor(shape, world, seed, reverse):
    whole = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    tiles = _tiles(whole, world)
    got = fsdp.assemble({"t": tiles[::-1] if reverse else tiles})["t"]
    assert torch.equal(got, whole)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(2, 12), world=st.integers(2, 4), data=st.data())
def test_a_moved_dropped_or_doubled_tile_is_refused(rows, world, data):
    whole = torch.randn(rows, 3)
    tiles = [t for t in _tiles(whole, world) if t.tensor.shape[0]]
    victim = data.draw(st.integers(0, len(tiles) - 1))
    how = data.draw(st.sampled_from(["shift", "drop", "double", "shape"]))
    if how == "shift":
        moved = tiles[victim].offset + data.draw(st.sampled_from([-1, 1]))
        tiles[victim] = dataclasses.replace(tiles[victim], offset=moved)
    elif how == "drop":
        del tiles[victim]
    elif how == "double":
        tiles.append(tiles[victim])
    else:
        tiles[victim] = dataclasses.replace(tiles[victim], shape=(rows + 1, 3))
    with pytest.raises(fsdp.TilingError):
        fsdp.assemble({"t": tiles})


def test_a_zero_dim_tensor_is_one_tile():
    step = torch.tensor(3.0)
    assert torch.equal(fsdp.assemble({"s": [fsdp.Tile(step, 0, ())]})["s"], step)
    with pytest.raises(fsdp.TilingError):
        fsdp.assemble({"s": [fsdp.Tile(step, 0, ()), fsdp.Tile(step, 0, ())]})


@pytest.mark.parametrize(
    "names",
    [
        ["shards/rank-0-of-2.json", "shards/rank-0-of-2.safetensors", "shards/rank-1-of-2.json"],
        ["shards/rank-0-of-1.json", "shards/rank-0-of-1.safetensors", "shards/rank-1-of-2.json"],
        ["shards/rank-00-of-1.json", "shards/rank-00-of-1.safetensors"],
        ["shards/rank-0-of-1.json", "shards/rank-0-of-1.safetensors", "shards/extra.bin"],
    ],
)
def test_tile_files_must_be_exactly_ranks_0_to_w(names):
    from trainer.verified_load import CheckpointRejected

    with pytest.raises(CheckpointRejected):
        fsdp.tile_world(names)


def test_config_refuses_fsdp2_where_it_does_not_run():
    base = TrainerConfig(parallel=ParallelConfig("fsdp2"))
    validate(base)
    for changed, key in (
        (dataclasses.replace(base, parallel=ParallelConfig("fsdp")), "parallel.strategy"),
        (dataclasses.replace(base, model=dataclasses.replace(base.model, dtype="float16")), "model.dtype"),
        (dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, engine="vllm")), "rollout.engine"),
        (
            dataclasses.replace(base, checkpoint=dataclasses.replace(base.checkpoint, async_save="on")),
            "checkpoint.async_save",
        ),
    ):
        with pytest.raises(ConfigError, match=key):
            validate(changed)


# -- torchrun ---------------------------------------------------------------------------------------
def _run(cmd, ok=True):
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert (result.returncode == 0) == ok, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _train(config, run_dir, procs, *extra):
    launcher = [sys.executable]
    if procs > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    return [*launcher, "-m", "sidecars.cli", "train", "--config", config, "--run-dir", str(run_dir), *extra]


def _steps(run_dir):
    events = [e for e, _ in ev.JournalReader(str(run_dir / "events.jsonl")).read_available()]
    return {e.step: e.data for e in events if e.type == ev.STEP_COMPLETED}


def _worst(a, b):
    return max(abs(a[k] - b[k]) for k in KEYS)


@pytest.fixture(scope="module")
def runs(tiny_cache, tmp_path_factory):
    """One plain process and 2 FSDP2 ranks, 2 steps each with a checkpoint after every step."""
    cache, _ = tiny_cache
    base = tmp_path_factory.mktemp("fsdp2")
    raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}, "max_steps": 2})
    raw = merge(raw, {"checkpoint": {"every_steps": 1}})
    import yaml

    plain, sharded = base / "plain.yaml", base / "fsdp2.yaml"
    plain.write_text(yaml.safe_dump(raw))
    sharded.write_text(yaml.safe_dump(merge(raw, {"parallel": {"strategy": "fsdp2"}})))
    _run(_train(str(plain), base / "one", 1))
    _run(_train(str(sharded), base / "two", 2))
    return base, str(plain), str(sharded)


def _whole_from_tiles(checkpoint):
    """Each tensor rebuilt from the tile files by reading them here (safetensors + JSON, not fsdp)."""
    out = {}
    for rank in range(2):
        stem = checkpoint / "shards" / f"rank-{rank}-of-2"
        index = json.loads((stem.parent / (stem.name + ".json")).read_text())["tiles"]
        for name, tensor in load_file(str(stem.parent / (stem.name + ".safetensors"))).items():
            whole = out.setdefault(name, torch.zeros(index[name]["shape"], dtype=tensor.dtype))
            if whole.dim():
                whole[index[name]["offset"] : index[name]["offset"] + tensor.shape[0]] = tensor
            else:
                out[name] = tensor
    return out


@pytest.mark.slow
def test_two_fsdp2_ranks_match_one_process(runs):
    base, _, _ = runs
    one, two = _steps(base / "one"), _steps(base / "two")
    for step in (1, 2):
        worst = _worst(one[step], two[step])
        print(f"fsdp2 x2 vs one process, step {step}: max abs diff {worst:.3g}")
        assert worst < 1e-5, (step, {k: (one[step][k], two[step][k]) for k in KEYS})
    # Each rank wrote its tiles; rank 0's manifest lists them with the digests of the bytes on disk.
    ckpt = base / "two" / "checkpoints" / STEP_1
    manifest = json.loads((ckpt / "manifest.sha256.json").read_text())["files"]
    tiles = sorted(n for n in manifest if n.startswith("shards/"))
    assert tiles == [f"shards/rank-{r}-of-2.{x}" for r in (0, 1) for x in ("json", "safetensors")]
    import hashlib

    for name in tiles:
        assert hashlib.sha256((ckpt / name).read_bytes()).hexdigest() == manifest[name]
    assert not [n for n in os.listdir(base / "two" / "checkpoints") if n.startswith(".")]  # staging removed
    # The weights after the first update, rebuilt from both ranks' rows, are the plain run's (AdamW moves
    # an element by about lr whatever its gradient, so a wrong row or share would show as ~3e-3).
    whole = _whole_from_tiles(ckpt)
    plain = load_file(str(base / "one" / "checkpoints" / STEP_1 / "actor" / "model.safetensors"))
    assert max(float((plain[k] - whole[f"actor/{k}"]).abs().max()) for k in plain) < 1e-4
    assert any(whole[k].shape[0] > 1 for k in whole if k.startswith("optim_actor/"))  # moments are tiles too


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2, 1])
def test_a_two_rank_checkpoint_resumes_on_two_and_on_one(runs, procs, tmp_path):
    base, _, sharded = runs
    checkpoint = str(base / "two" / "checkpoints" / STEP_1)
    _run(_train(sharded, tmp_path / "resumed", procs, "--resume", checkpoint))
    resumed, uninterrupted = _steps(tmp_path / "resumed"), _steps(base / "two")
    assert sorted(resumed) == [2]
    worst = _worst(resumed[2], uninterrupted[2])
    print(f"resumed on {procs} vs uninterrupted 2 ranks, step 2: max abs diff {worst:.3g}")
    assert worst < 1e-5, {k: (resumed[2][k], uninterrupted[2][k]) for k in KEYS}
    started = [e for e, _ in ev.JournalReader(str(tmp_path / "resumed" / "events.jsonl")).read_available()]
    assert [e.data["world_size_changed"] for e in started if e.type == ev.RUN_RESUMED] == [procs != 2]


@pytest.mark.slow
def test_one_process_restores_exactly_the_tiles_saved(runs, tmp_path, monkeypatch):
    """Resumed in this process (one rank, no sharding): the actor's weights and AdamW moments are
    bit for bit the tensors both ranks' tile files hold."""
    from trainer.config import load_config
    from trainer.core import PPOTrainer

    base, _, sharded = runs
    checkpoint = base / "two" / "checkpoints" / STEP_1
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    trainer = PPOTrainer(load_config(sharded), str(tmp_path / "run"), resume=str(checkpoint), serve_metrics=False)
    try:
        whole = _whole_from_tiles(checkpoint)
        for name, tensor in fsdp.model_tensors(trainer.actor).items():
            assert torch.equal(tensor.detach(), whole[f"actor/{name}"]), name
        moments = fsdp.optimizer_moments(trainer.actor_opt)
        assert moments and all(torch.equal(v, whole[f"optim_actor/{k}"]) for k, v in moments.items())
    finally:
        trainer.close()


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_flipped_byte_in_a_tile_is_refused_at_resume(runs, tmp_path):
    base, _, sharded = runs
    copy = tmp_path / "copied" / STEP_1
    shutil.copytree(base / "two" / "checkpoints" / STEP_1, copy)
    tile = copy / "shards" / "rank-1-of-2.safetensors"
    _flip(tile, tile.stat().st_size // 2)  # inside the tensor data, past the header
    refused = _run(_train(sharded, tmp_path / "resumed", 2, "--resume", str(copy)), ok=False)
    assert "shards/rank-1-of-2.safetensors" in refused.stdout + refused.stderr
    events = [e for e, _ in ev.JournalReader(str(tmp_path / "resumed" / "events.jsonl")).read_available()]
    assert [e.data["path"] for e in events if e.type == ev.CHECKPOINT_REJECTED] == [str(copy)]
    assert ev.STEP_COMPLETED not in [e.type for e in events]


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(rank=st.integers(0, 1), kind=st.sampled_from(["json", "safetensors"]), where=st.integers(0, 2**20))
def test_any_flipped_tile_byte_fails_verification(runs, tmp_path_factory, rank, kind, where):
    """What every rank checks before loading (trainer.resume.accept) refuses a tile with any byte flipped."""
    from trainer import checkpoint as ckpt
    from trainer.resume import accept
    from trainer.verified_load import CheckpointRejected

    base, _, _ = runs
    copy = tmp_path_factory.mktemp("flip") / STEP_1
    shutil.copytree(base / "two" / "checkpoints" / STEP_1, copy)
    accept(ckpt.CheckpointRef(1, str(copy)), None, "any", True, 1 << 30)  # intact: accepted
    name = f"shards/rank-{rank}-of-2.{kind}"
    _flip(copy / name, where)
    with pytest.raises(CheckpointRejected, match=name.replace(".", r"\.")):
        accept(ckpt.CheckpointRef(1, str(copy)), None, "any", True, 1 << 30)


@pytest.mark.slow
def test_the_announcement_covers_every_ranks_tiles_and_a_signed_checkpoint_resumes(runs, tmp_path):
    """The signer signs only what the trainer announced (``expected``): the 2-rank checkpoint's bytes on
    disk, every rank's tiles included, hash to rank 0's announcement; signed, it resumes on 2 ranks
    with trusted keys, and a tile changed after signing is refused."""
    import yaml

    from warden.payloads import CheckpointSaved
    from warden.signing import Provenance, generate_keypair, sign_checkpoint
    from warden.signing.keys import load_private_key

    base, _, sharded = runs
    saved = [e for e, _ in ev.JournalReader(str(base / "two" / "events.jsonl")).read_available()]
    first = next(e for e in saved if e.type == ev.CHECKPOINT_SAVED and e.step == 1)
    announced = CheckpointSaved.from_data(first.data).announced
    assert announced is not None
    copy = tmp_path / "copied" / STEP_1
    shutil.copytree(base / "two" / "checkpoints" / STEP_1, copy)
    keys = generate_keypair(str(tmp_path / "keys"))
    provenance = Provenance(run_id=first.run_id, step=1)
    sign_checkpoint(str(copy), load_private_key(str(keys.private_key)), provenance, expected=announced)
    trusting = base / "trusting.yaml"  # next to the checkpoint's config: reward.code_dir is relative to it
    with open(sharded) as fh:
        raw = yaml.safe_load(fh)
    trusting.write_text(yaml.safe_dump(merge(raw, {"checkpoint": {"trusted_keys": str(keys.public_key)}})))
    _run(_train(str(trusting), tmp_path / "resumed", 2, "--resume", str(copy)))
    resumed = [e for e, _ in ev.JournalReader(str(tmp_path / "resumed" / "events.jsonl")).read_available()]
    assert "signature" in next(e for e in resumed if e.type == ev.RUN_RESUMED).data["verification"]
    _flip(copy / "shards" / "rank-1-of-2.json", 10)
    refused = _run(_train(str(trusting), tmp_path / "refused", 2, "--resume", str(copy)), ok=False)
    assert "shards/rank-1-of-2.json" in refused.stdout + refused.stderr


@pytest.mark.slow
def test_bfloat16_grpo_on_fsdp2_matches_ddp_on_the_same_ranks(tiny_cache, tmp_path):
    """Mixed precision as today (float32 masters, bfloat16 autocast) and no critic (GRPO): 2 fsdp2 ranks
    against 2 DDP ranks. Against one process bfloat16 differs by ~1e-4 already with DDP (each rank's
    micro-batches hold other rows), so the same world is the comparison that isolates the sharding."""
    import yaml

    cache, _ = tiny_cache
    raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}, "dtype": "bfloat16"}, "max_steps": 1})
    raw = merge(raw, {"algorithm": {"adv_estimator": "grpo"}, "checkpoint": {"every_steps": 0}})
    metrics = {}
    for strategy in ("ddp", "fsdp2"):
        config = tmp_path / f"{strategy}.yaml"
        config.write_text(yaml.safe_dump(merge(raw, {"parallel": {"strategy": strategy}})))
        _run(_train(str(config), tmp_path / strategy, 2))
        metrics[strategy] = _steps(tmp_path / strategy)[1]
    keys = [k for k in KEYS if k != "value_loss"]
    worst = max(abs(metrics["ddp"][k] - metrics["fsdp2"][k]) for k in keys)
    print(f"bfloat16 GRPO, fsdp2 x2 vs ddp x2, step 1: max abs diff {worst:.3g}")
    assert "value_loss" not in metrics["fsdp2"] and worst < 1e-5, {
        k: (metrics["ddp"][k], metrics["fsdp2"][k]) for k in keys
    }


# -- rank 0 links only what the ranks reported ------------------------------------------------------
def _staged(tmp_path, rank=1):
    tiles = {"actor/w": fsdp.Tile(torch.arange(6.0).reshape(3, 2), 3, (6, 2))}
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return str(root), fsdp.stage_rank_files(str(root), 1, rank, 2, tiles, None)


def _adopt(root, staged):
    from trainer import checkpoint as ckpt

    def fill(writer):
        fsdp.adopt_staged(writer, root, staged)

    return ckpt.write_checkpoint(root, 1, fill)


def test_staged_tiles_are_linked_in_with_the_digests_the_rank_computed(tmp_path):
    import hashlib

    root, staged = _staged(tmp_path)
    assert not staged.error and staged.directory.startswith(".tmp-step-000000001.rank-1.")
    written = _adopt(root, [staged])
    for name in ("shards/rank-1-of-2.json", "shards/rank-1-of-2.safetensors"):
        on_disk = (tmp_path / "root" / "step-000000001" / name).read_bytes()
        assert written.digests[name] == hashlib.sha256(on_disk).hexdigest()
    fsdp.discard_staged(root, staged)
    assert sorted(os.listdir(root)) == ["step-000000001"]


@pytest.mark.parametrize("tamper", ["error", "size", "symlink", "missing"])
def test_rank_0_saves_nothing_when_a_ranks_files_are_not_what_it_reported(tmp_path, tamper):
    from trainer import checkpoint as ckpt

    root, staged = _staged(tmp_path)
    staging = tmp_path / "root" / staged.directory
    if tamper == "error":
        staged = fsdp.StagedTiles(error="rank 1: disk full")
    elif tamper == "size":
        with open(staging / "rank-1-of-2.json", "ab") as fh:
            fh.write(b" ")
    elif tamper == "symlink":
        os.unlink(staging / "rank-1-of-2.json")
        os.symlink(tmp_path / "elsewhere.json", staging / "rank-1-of-2.json")
    else:
        os.unlink(staging / "rank-1-of-2.safetensors")
    with pytest.raises(ckpt.CheckpointError):
        _adopt(root, [staged])
    assert ckpt.list_complete(root) == []  # no checkpoint, and its temporary directory is gone
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-step-000000001.") and ".rank-" not in n]


@pytest.mark.slow
def test_hsdp_two_replicas_of_two_shards_match_one_process_and_resume_on_two(tiny_cache, tmp_path):
    """``parallel.shard_group_size: 2`` on 4 ranks: sharded within each pair, replicated across the
    pairs (one group per node, with 2 ranks a node). Only the first group writes tiles; the checkpoint
    resumes on 2 ranks (one group) with the step the 4 ranks trained."""
    import yaml

    cache, _ = tiny_cache
    raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}, "max_steps": 2})
    raw = merge(raw, {"checkpoint": {"every_steps": 1}, "ppo": {"micro_batch_size": 2}})
    plain, hsdp = tmp_path / "plain.yaml", tmp_path / "hsdp.yaml"
    plain.write_text(yaml.safe_dump(raw))
    hsdp.write_text(yaml.safe_dump(merge(raw, {"parallel": {"strategy": "fsdp2", "shard_group_size": 2}})))
    _run(_train(str(plain), tmp_path / "one", 1))
    _run(_train(str(hsdp), tmp_path / "four", 4))
    one, four = _steps(tmp_path / "one"), _steps(tmp_path / "four")
    for step in (1, 2):
        worst = _worst(one[step], four[step])
        print(f"hsdp 2x2 vs one process, step {step}: max abs diff {worst:.3g}")
        assert worst < 1e-5, (step, {k: (one[step][k], four[step][k]) for k in KEYS})
    checkpoint = tmp_path / "four" / "checkpoints" / STEP_1
    assert sorted(os.listdir(checkpoint / "shards")) == [
        f"rank-{r}-of-2.{x}" for r in (0, 1) for x in ("json", "safetensors")
    ]
    _run(_train(str(hsdp), tmp_path / "resumed", 2, "--resume", str(checkpoint)))
    worst = _worst(_steps(tmp_path / "resumed")[2], four[2])
    print(f"hsdp checkpoint resumed on 2 ranks vs 4, step 2: max abs diff {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize(
    ("configured", "world", "local", "expected"), [(0, 8, 4, 4), (0, 2, 2, 2), (2, 8, 8, 2), (0, 6, 4, None)]
)
def test_shard_group_size_is_a_node_unless_set_and_must_divide_the_world(configured, world, local, expected):
    if expected is None:
        with pytest.raises(ConfigError, match=r"parallel\.shard_group_size"):
            fsdp.shard_group_size(configured, world, local)
    else:
        assert fsdp.shard_group_size(configured, world, local) == expected


def test_a_claimed_shape_beyond_the_rows_held_is_refused_before_allocating():
    tile = fsdp.Tile(torch.ones(2, 3), 0, (10**15, 3))  # 12 PB if allocated first
    with pytest.raises(fsdp.TilingError, match="in no tile"):
        fsdp.assemble({"t": [tile]})


@pytest.mark.parametrize("entry", [[0, 1], "x", {"shape": [2]}, {"shape": [-1], "offset": 0}, {"offset": 0}])
def test_an_index_entry_without_shape_and_offset_is_refused(entry):
    from trainer.verified_load import CheckpointRejected

    index = {"format": fsdp.INDEX_FORMAT, "rank": 0, "world_size": 1, "tiles": {"actor/w": entry}}
    with pytest.raises(CheckpointRejected, match="no shape and offset"):
        fsdp._index_tiles(index, {"actor/w": torch.ones(2)}, 0, 1, "shards/rank-0-of-1")
