"""Atomic checkpoints: kill -9 at random points never leaves a step-N that is incomplete."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import random
import signal
import time

import numpy as np
import pytest
import torch

from tests.trainer import checkpoint_files
from trainer import checkpoint as ckpt


def _writer_loop(root: str, start_step: int) -> None:
    """Child process: writes checkpoints forever, each a few MB in several files."""
    from safetensors.numpy import save

    step = start_step
    rng = np.random.default_rng(step)
    while True:
        step += 1

        def fill(writer: ckpt.CheckpointWriter, step: int = step) -> None:
            for part in ("actor", "critic"):
                weights = {"w": rng.standard_normal(400_000).astype(np.float32)}
                writer.bytes(f"{part}/model.safetensors", save(weights))
            writer.json(ckpt.STATE, {"step": step})

        ckpt.write_checkpoint(root, step, fill)
        ckpt.prune(root, keep_last=3)


def test_kill_9_during_checkpoint_never_exposes_a_partial_step(tmp_path):
    root = str(tmp_path / "checkpoints")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(7)
    seen_tmp = 0
    newest = 0
    for _trial in range(20):
        proc = ctx.Process(target=_writer_loop, args=(root, newest))
        proc.start()
        time.sleep(rng.uniform(0.02, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        names = os.listdir(root) if os.path.isdir(root) else []
        seen_tmp += any(n.startswith(".tmp-") for n in names)
        complete = ckpt.list_complete(root)
        for ref in complete:
            assert checkpoint_files.verify_manifest(ref.path) == [], ref.path
        # What a resume does first: drop temporaries, then take the newest complete one.
        ckpt.remove_stale_temporaries(root)
        assert not any(n.startswith(".tmp-") for n in os.listdir(root))
        newest = complete[0].step if complete else newest
    assert newest > 0
    assert seen_tmp >= 3, "kills must land while a checkpoint is being written"


def test_state_flattening_round_trips_optimizer_state():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    tensors = {}
    skeleton = ckpt.flatten_state(opt.state_dict(), tensors)
    restored = ckpt.unflatten_state(skeleton, tensors)
    fresh = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters(), lr=5.0)
    fresh.load_state_dict(restored)
    assert fresh.param_groups[0]["lr"] == 1e-3
    for key in (0, 1):
        for name, value in opt.state_dict()["state"][key].items():
            assert torch.equal(value, fresh.state_dict()["state"][key][name])


def test_prune_keeps_the_newest_and_their_signatures(tmp_path):
    root = str(tmp_path)
    for step in (1, 2, 3, 4):
        ckpt.write_checkpoint(root, step, lambda w: w.json("x.json", {}))
        open(os.path.join(root, ckpt.step_dir_name(step) + ".sig"), "w").close()
    removed = ckpt.prune(root, keep_last=2)
    assert sorted(os.path.basename(p) for p in removed) == ["step-000000001", "step-000000002"]
    assert sorted(os.listdir(root)) == ["step-000000003", "step-000000003.sig", "step-000000004", "step-000000004.sig"]


def test_manifest_reports_missing_extra_and_changed(tmp_path):
    path = ckpt.write_checkpoint(str(tmp_path), 5, lambda w: [w.bytes(n, n.encode()) for n in "abc"]).path
    os.unlink(os.path.join(path, "a"))
    (pathlib.Path(path) / "b").write_text("changed")
    (pathlib.Path(path) / "z").write_text("new")
    problems = checkpoint_files.verify_manifest(path)
    assert problems[0] == "a: missing" and problems[1] == "z: not in the manifest"
    assert problems[2].startswith("b: sha256 ")


# -- what a resume trusts (trainer/resume.py, trainer/verified_load.py) ------------------
def _checkpoint_config(tmp_path, checkpoint):
    import yaml
    from support import TEST_CONFIG, merge

    from trainer.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(merge(TEST_CONFIG, {"checkpoint": checkpoint})))
    return lambda: load_config(str(path))


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        ({"trusted_keys": "/keys", "allow_unsigned": True}, "checkpoint.allow_unsigned"),
        ({"allow_unsigned": False}, "checkpoint.allow_unsigned"),
        ({"trusted_keys": "/keys", "require_signature": False}, "checkpoint.require_signature"),
    ],
)
def test_contradictory_trust_settings_are_config_errors(tmp_path, checkpoint, message):
    from warden.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as caught:
        _checkpoint_config(tmp_path, checkpoint)()
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("checkpoint", [{"trusted_keys": "/keys"}, {}])
def test_consistent_trust_settings_load(tmp_path, checkpoint):
    cfg = _checkpoint_config(tmp_path, checkpoint)()
    assert cfg.checkpoint.trusted_keys == checkpoint.get("trusted_keys", "")


def test_relative_trusted_keys_resolve_against_the_config_file_not_the_cwd(tmp_path, monkeypatch):
    """A relative trust path in the cwd could pick up keys an attacker planted where the job starts."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = _checkpoint_config(tmp_path, {"trusted_keys": "keys/team.pub"})()
    assert cfg.checkpoint.trusted_keys == str(tmp_path / "keys" / "team.pub")


def test_tree_problems_name_every_unlisted_entry():
    from trainer.verified_load import tree_problems

    anchored = {"actor/model.safetensors", "trainer_state.json"}
    found_files = {"actor/model.safetensors", "x.json"}
    found_dirs = {"actor", "actor/model-00002.safetensors", "critic"}
    problems = tree_problems(anchored, found_files, found_dirs, {"link": "a symlink"})
    assert problems == [
        "link: a symlink",
        "actor/model-00002.safetensors: an unlisted directory",
        "critic: an unlisted directory",
        "x.json: an unlisted file",
        "trainer_state.json: missing",
    ]
    assert tree_problems(anchored, set(anchored), {"actor"}, {}) == []


@pytest.mark.parametrize(
    ("run", "step", "explicit", "why"),
    [
        ("r", 5, False, None),
        ("other", 5, True, None),
        ("other", 5, False, "a checkpoint of run 'other', not of this run 'r'"),
        ("r", 7, True, "signed step 7 but the directory is step-000000005"),
        ("r", None, False, "the signed provenance has no step"),
        (None, 5, True, "the signed provenance has no run id"),
        ("r", True, False, "the signed provenance has no step"),
    ],
)
def test_provenance_must_match_the_directory_and_the_run(run, step, explicit, why):
    from trainer.resume import check_provenance
    from trainer.verified_load import CheckpointRejected

    if why is None:
        check_provenance(run, step, 5, "r", explicit, "signed")
        return
    with pytest.raises(CheckpointRejected) as caught:
        check_provenance(run, step, 5, "r", explicit, "signed")
    assert caught.value.reason.startswith(why)


def test_verified_bytes_are_what_loads(tmp_path):
    """The loader deserializes the bytes it hashed; changing the file afterwards changes nothing."""
    from safetensors.torch import save_file

    from trainer.verified_load import integrity_anchor, read_verified

    def fill(writer: ckpt.CheckpointWriter) -> None:
        writer.tensors("actor/model.safetensors", {"w": torch.ones(3)})
        ckpt.save_state(writer, "rng", {"t": torch.arange(4)})

    path = ckpt.write_checkpoint(str(tmp_path), 3, fill).path
    verified = read_verified(path, 3, integrity_anchor(path), budget=1 << 20)
    save_file({"w": torch.zeros(3)}, os.path.join(path, "actor", "model.safetensors"))
    assert verified.names("actor", ".safetensors") == ["actor/model.safetensors"]
    assert torch.equal(verified.tensors("actor/model.safetensors")["w"], torch.ones(3))
    assert torch.equal(verified.state("rng")["t"], torch.arange(4))


def test_reading_stops_at_the_budget(tmp_path):
    from trainer.verified_load import CheckpointRejected, integrity_anchor, read_verified

    path = ckpt.write_checkpoint(str(tmp_path), 3, lambda w: w.bytes("big", b"x" * 5000)).path
    with pytest.raises(CheckpointRejected, match="big: 5000 bytes, over the 4000 bytes left in the budget"):
        read_verified(path, 3, integrity_anchor(path), budget=4000)


# -- shard-signed checkpoints (policy serialization: shards) ---------------------------------
def _shard_signed(tmp_path, content: bytes):
    from warden.signing import generate_keypair, load_trusted_keys, sign_checkpoint
    from warden.signing.keys import load_private_key
    from warden.signing.manifest import Serialization

    ckpt_dir = tmp_path / "step-000000004"
    (ckpt_dir / "actor").mkdir(parents=True)
    (ckpt_dir / "actor" / "model.safetensors").write_bytes(content)
    (ckpt_dir / "trainer_state.json").write_text('{"step": 4}')
    keys = generate_keypair(str(tmp_path / "keys"))
    sign_checkpoint(
        str(ckpt_dir), load_private_key(str(keys.private_key)), serialization=Serialization("shards", "sha256", 1024)
    )
    return ckpt_dir, load_trusted_keys(str(keys.public_key))


def test_a_shard_signed_checkpoint_loads_and_a_changed_shard_is_rejected(tmp_path):
    from trainer.verified_load import CheckpointRejected, read_verified, signed_anchor

    content = bytes(range(256)) * 20  # 5 shards of 1 KiB
    ckpt_dir, trusted = _shard_signed(tmp_path, content)
    anchor = signed_anchor(str(ckpt_dir), trusted)
    assert len(anchor.digests["actor/model.safetensors"]) == 5
    loaded = read_verified(str(ckpt_dir), 4, anchor, 1 << 20)
    assert loaded.files["actor/model.safetensors"] == content
    tampered = bytearray(content)
    tampered[3000] ^= 1  # the third shard
    (ckpt_dir / "actor" / "model.safetensors").write_bytes(bytes(tampered))
    with pytest.raises(CheckpointRejected, match=r"bytes 2048\.\.3072 differ from the signed shard"):
        read_verified(str(ckpt_dir), 4, anchor, 1 << 20)
    (ckpt_dir / "actor" / "model.safetensors").write_bytes(content + b"tail")
    with pytest.raises(CheckpointRejected, match="after the last signed shard"):
        read_verified(str(ckpt_dir), 4, anchor, 1 << 20)


def test_a_checkpoint_root_reached_through_a_link_is_the_operators_choice(tmp_path):
    """The root itself may be a link (checkpoints -> /mnt/nfs/...); only what is below it is never followed."""
    real = tmp_path / "mnt" / "checkpoints"
    real.mkdir(parents=True)
    (tmp_path / "checkpoints").symlink_to(real, target_is_directory=True)
    written = ckpt.write_checkpoint(str(tmp_path / "checkpoints"), 7, lambda w: w.bytes("x.json", b"{}"))
    assert (real / "step-000000007" / "x.json").read_bytes() == b"{}"
    assert ckpt.prune(str(tmp_path / "checkpoints"), 0, eligible={7}) == [written.path]
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("shard_size", [None, 7, 4096])
def test_the_announcement_is_what_the_signer_signs_in_either_serialization(tmp_path, shard_size):
    """The trainer's in-memory digest (files, or shards of shard_size) is the root the signer computes
    from the disk in the same serialization: one hash on the signer's side, nothing re-read here."""
    from warden.signing import generate_keypair, load_private_key, sign_checkpoint
    from warden.signing.manifest import FILES_SHA256, SHARDS_METHOD, Serialization

    files = {"actor/model.safetensors": os.urandom(10_000), "empty.json": b"", "rng.json": b"{}"}
    written = ckpt.write_checkpoint(
        str(tmp_path / "ckpt"), 3, lambda w: [w.bytes(n, c) for n, c in files.items()], shard_size
    )
    serialization = FILES_SHA256 if shard_size is None else Serialization(SHARDS_METHOD, "sha256", shard_size)
    key = load_private_key(generate_keypair(tmp_path / "keys").private_key)
    signed = sign_checkpoint(written.path, key, expected=written.announced, serialization=serialization)
    assert signed.root_digest == written.announced.root_digest
    assert written.announced.shard_size == shard_size


def test_an_announcement_in_another_serialization_is_refused_not_signed(tmp_path):
    from warden.signing import generate_keypair, load_private_key, sign_checkpoint
    from warden.signing.errors import AnnouncementMismatch
    from warden.signing.manifest import FILES_SHA256, SHARDS_METHOD, Serialization

    written = ckpt.write_checkpoint(str(tmp_path / "ckpt"), 3, lambda w: w.bytes("a.bin", b"x" * 100), 64)
    key = load_private_key(generate_keypair(tmp_path / "keys").private_key)
    for policy in (FILES_SHA256, Serialization(SHARDS_METHOD, "sha256", 128)):
        with pytest.raises(AnnouncementMismatch) as caught:
            sign_checkpoint(written.path, key, expected=written.announced, serialization=policy)
        assert caught.value.reason == "serialization_mismatch"
    assert not os.path.exists(written.path + ".sig")


def test_a_fill_that_fails_with_a_bug_leaves_no_temporary(tmp_path):
    """Not an OSError: an unsupported dtype (found by this round's red team) once left .tmp-step-N behind."""
    from trainer.tensorfile import TensorFileError

    def fill(writer: ckpt.CheckpointWriter) -> None:
        writer.json("a.json", {})
        writer.tensors("t.safetensors", {"w": torch.zeros(3, dtype=torch.uint16)})

    with pytest.raises(TensorFileError):
        ckpt.write_checkpoint(str(tmp_path), 3, fill)
    assert os.listdir(tmp_path) == []
