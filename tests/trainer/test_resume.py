"""trainer/resume.py check_own_manifest in the shards serialization: the manifest lists each file's
shards, so a shard signature is matched against the trainer's names without hashing anything again."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

pytest.importorskip("torch")

from trainer import checkpoint as ckpt
from trainer import resume
from trainer.resume import check_own_manifest
from trainer.verified_load import Anchor, CheckpointRejected, VerifiedCheckpoint

FILES = {"actor/model.safetensors": os.urandom(1000), "rng.json": b"{}", "trainer_state.json": b'{"step": 4}'}


def written(tmp_path, shard_size):
    path = ckpt.write_checkpoint(str(tmp_path), 4, lambda w: [w.bytes(n, c) for n, c in FILES.items()], shard_size)
    return path.path


def read_back(path) -> dict[str, bytes]:
    names = [*FILES, ckpt.MANIFEST]
    out = {}
    for name in names:
        with open(os.path.join(path, name), "rb") as fh:
            out[name] = fh.read()
    return out


def signed_in_shards(files: dict[str, bytes], shard_size: int) -> VerifiedCheckpoint:
    """What a shards signature over ``files`` vouches for, as a verified checkpoint of those bytes."""
    digests = {
        name: tuple(
            (s, min(s + shard_size, len(data)), hashlib.sha256(data[s : s + shard_size]).hexdigest())
            for s in range(0, len(data), shard_size)
        )
        for name, data in files.items()
    }
    return VerifiedCheckpoint("ckpt", 4, Anchor(digests, "signed", True), {n: memoryview(d) for n, d in files.items()})


class Counting:
    """hashlib as resume sees it, counting the files hashed whole."""

    def __init__(self) -> None:
        self.calls = 0

    def sha256(self, data):
        self.calls += 1
        return hashlib.sha256(data)


@pytest.fixture
def hashed(monkeypatch):
    counting = Counting()
    monkeypatch.setattr(resume, "hashlib", counting)
    return counting


def test_the_shards_manifest_lists_every_files_shards(tmp_path):
    manifest = json.loads(read_back(written(tmp_path, 300))[ckpt.MANIFEST])
    assert manifest["files"] == {n: hashlib.sha256(c).hexdigest() for n, c in FILES.items()}
    weights = FILES["actor/model.safetensors"]
    assert manifest["shards"]["actor/model.safetensors"] == [
        [s, min(s + 300, 1000), hashlib.sha256(weights[s : s + 300]).hexdigest()] for s in range(0, 1000, 300)
    ]
    assert "shards" not in json.loads(read_back(written(tmp_path / "files", None))[ckpt.MANIFEST])


def test_a_shard_signature_matching_the_manifest_is_accepted_without_hashing(tmp_path, hashed):
    check_own_manifest(signed_in_shards(read_back(written(tmp_path, 300)), 300))
    assert hashed.calls == 0


@pytest.mark.parametrize("why", ["older manifest without shards", "signed with another shard size"])
def test_otherwise_the_signed_files_are_hashed_whole(tmp_path, hashed, why):
    files = read_back(written(tmp_path, 300))
    if why.startswith("older"):
        manifest = json.loads(files[ckpt.MANIFEST])
        del manifest["shards"]
        files[ckpt.MANIFEST] = json.dumps(manifest).encode()
    check_own_manifest(signed_in_shards(files, 300 if why.startswith("older") else 128))
    # the small files are one shard either way: only the weights' boundaries differ at 128
    assert hashed.calls == (len(FILES) if why.startswith("older") else 1)


@pytest.mark.parametrize("change", ["a shard digest", "a file renamed", "malformed shards"])
def test_a_manifest_that_disagrees_with_the_signed_shards_is_refused(tmp_path, change):
    files = read_back(written(tmp_path, 300))
    manifest = json.loads(files[ckpt.MANIFEST])
    if change == "a shard digest":
        manifest["shards"]["actor/model.safetensors"][1][2] = "00" * 32
    elif change == "a file renamed":
        files["rng.json.bak"] = files.pop("rng.json")
    else:
        manifest["shards"]["rng.json"] = [[0, "2", "ab"]]
    files[ckpt.MANIFEST] = json.dumps(manifest).encode()
    match = "a shard must be" if change == "malformed shards" else "differ from the trainer's manifest"
    with pytest.raises(CheckpointRejected, match=match):
        check_own_manifest(signed_in_shards(files, 300))
