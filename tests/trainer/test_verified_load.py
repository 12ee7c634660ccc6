"""trainer/verified_load.py: the parallel verified read gives digest_problem's verdicts, reads each
file once into its own buffer, and refuses a file that changes length while it is read."""

from __future__ import annotations

import hashlib
import itertools
import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from trainer import verified_load
from trainer.verified_load import (
    Anchor,
    CheckpointRejected,
    VerifiedCheckpoint,
    digest_problem,
    layout_problem,
    read_verified,
)

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "25"))
PREFIX = "files differ from the signature: "


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@st.composite
def vouched(draw, content: bytes):
    """What an anchor vouches for ``content``: its sha256, or shards cut at random points."""
    if draw(st.booleans()):
        return sha(content)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(content) - 1)), max_size=6)) - {len(content)})
    bounds = [0, *cuts, len(content)] if content else []
    return tuple((s, e, sha(content[s:e])) for s, e in itertools.pairwise(bounds))


@st.composite
def tampered(draw, expected):
    """``expected`` with, sometimes, its layout or one digest changed."""
    kind = draw(st.sampled_from(["none", "digest", "drop", "overrun", "overlap"]))
    if isinstance(expected, str):
        return expected if kind == "none" else sha(b"other")
    shards = list(expected)
    if not shards or kind == "none":
        return expected
    index = draw(st.integers(0, len(shards) - 1))
    start, end, digest = shards[index]
    if kind == "digest":
        shards[index] = (start, end, sha(b"other"))
    elif kind == "drop":
        del shards[index]
    elif kind == "overrun":
        shards[index] = (start, end + draw(st.integers(1, 5)), digest)
    else:
        shards[index] = (max(0, start - 1), end, digest)
    return tuple(shards)


@st.composite
def changed(draw, content: bytes) -> bytes:
    """``content`` as a storage writer may leave it: as is, a byte flipped, cut or extended."""
    kind = draw(st.sampled_from(["none", "flip", "cut", "extend"]))
    if kind == "flip" and content:
        at = draw(st.integers(0, len(content) - 1))
        return content[:at] + bytes([content[at] ^ 1]) + content[at + 1 :]
    if kind == "cut" and content:
        return content[: draw(st.integers(0, len(content) - 1))]
    if kind == "extend":
        return content + draw(st.binary(min_size=1, max_size=9))
    return content


@st.composite
def checkpoints(draw):
    """{name: (bytes on disk, what the anchor vouches for)} for 1 to 3 files."""
    out = {}
    for name in draw(st.lists(st.sampled_from(["a.bin", "b/c.bin", "b/d.json"]), min_size=1, max_size=3, unique=True)):
        content = draw(st.binary(max_size=300))
        out[name] = (draw(changed(content)), draw(tampered(draw(vouched(content)))))
    return out


def possible_problems(name: str, data: bytes, expected) -> set[str]:
    """Every message read_verified may give for this file (empty when it verifies): the layout problem,
    else the mismatch of any shard that differs (which one is found first depends on the threads)."""
    if digest_problem(name, data, expected) is None:
        return set()
    if isinstance(expected, str):
        return {digest_problem(name, data, expected)}
    layout = layout_problem(name, len(data), expected)
    if layout is not None:
        return {layout}
    return {f"{name}: bytes {s}..{e} differ from the signed shard" for s, e, h in expected if sha(data[s:e]) != h}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=checkpoints(),
    workers=st.sampled_from([1, 2, 4]),
    chunk=st.sampled_from([1, 7, 64, 1 << 20]),
    piece=st.sampled_from([1, 50, 1 << 20]),
    lend=st.booleans(),
)
def test_parallel_verification_gives_digest_problems_verdicts(tmp_path_factory, files, workers, chunk, piece, lend):
    """The same verdicts whether files are read into fresh buffers or into lent ones (the staging arena
    at resume, here every file of at least a byte): accepted bytes are then the arena's."""
    from trainer.staging import HostArena

    root = tmp_path_factory.mktemp("ckpt")
    for name, (data, _) in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    anchor = Anchor({name: expected for name, (_, expected) in files.items()}, "test", signed=True)
    possible = set().union(*(possible_problems(name, data, expected) for name, (data, expected) in files.items()))
    arena = HostArena(4096, pinned=False) if lend else None
    with (
        mock.patch.object(verified_load, "READ_CHUNK", chunk),
        mock.patch.object(verified_load, "PIECE_BYTES", piece),
        mock.patch.object(verified_load, "MAPPED_BYTES", 1 if lend else verified_load.MAPPED_BYTES),
    ):
        try:
            lender = arena.lend if arena is not None else None
            loaded = read_verified(str(root), 1, anchor, budget=1 << 20, workers=workers, buffers=lender)
        except CheckpointRejected as exc:
            assert possible, f"refused a checkpoint digest_problem accepts: {exc.reason}"
            assert exc.reason.startswith(PREFIX) and exc.reason[len(PREFIX) :] in possible
            return
    assert not possible, f"accepted a checkpoint digest_problem refuses: {possible}"
    assert {name: bytes(buffer) for name, buffer in loaded.files.items()} == {n: d for n, (d, _) in files.items()}
    if arena is not None:
        import torch

        in_arena = [arena.owns(torch.frombuffer(b, dtype=torch.uint8)) for b in loaded.files.values() if len(b)]
        assert loaded.lent and all(in_arena)


def _signed_in_shards(tmp_path, content: bytes, shard: int) -> Anchor:
    (tmp_path / "w.bin").write_bytes(content)
    bounds = range(0, len(content) + shard, shard)
    shards = tuple((s, min(s + shard, len(content)), sha(content[s : s + shard])) for s in bounds if s < len(content))
    return Anchor({"w.bin": shards}, "test", signed=True)


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_file_that_changes_length_while_read_is_refused(tmp_path, monkeypatch, change):
    content = os.urandom(1000)
    anchor = _signed_in_shards(tmp_path, content, 100)
    real = os.preadv
    calls = []

    def preadv(fd, buffers, offset):
        if not calls:
            with open(tmp_path / "w.bin", "ab") as fh:
                if change == "grow":
                    fh.write(b"more")
                else:
                    fh.truncate(500)
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(verified_load, "READ_CHUNK", 64)
    monkeypatch.setattr(os, "preadv", preadv)
    with pytest.raises(CheckpointRejected, match="grew while read" if change == "grow" else "shrank while read"):
        read_verified(str(tmp_path), 1, anchor, budget=1 << 20, workers=2)


def test_the_first_failure_stops_the_other_reads(tmp_path, monkeypatch):
    """One worker, ten tasks: the first shard differs, so no byte of the nine others is read."""
    content = bytearray(os.urandom(1000))
    anchor = _signed_in_shards(tmp_path, bytes(content), 100)
    content[3] ^= 1
    (tmp_path / "w.bin").write_bytes(bytes(content))
    real, offsets = os.preadv, []

    def preadv(fd, buffers, offset):
        offsets.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(verified_load, "PIECE_BYTES", 100)
    monkeypatch.setattr(verified_load, "READ_CHUNK", 50)
    monkeypatch.setattr(os, "preadv", preadv)
    with pytest.raises(CheckpointRejected, match=r"w\.bin: bytes 0\.\.100 differ from the signed shard"):
        read_verified(str(tmp_path), 1, anchor, budget=1 << 20, workers=1)
    assert offsets == [0, 50]


def test_many_files_are_read_in_batches_and_every_descriptor_is_closed(tmp_path, monkeypatch):
    files = {f"f{i}.bin": os.urandom(i * 10) for i in range(7)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.setattr(verified_load, "OPEN_BATCH", 2)
    before = len(os.listdir("/proc/self/fd"))
    loaded = read_verified(str(tmp_path), 1, Anchor({n: sha(d) for n, d in files.items()}, "t", True), 1 << 20)
    assert len(os.listdir("/proc/self/fd")) == before
    assert {n: bytes(b) for n, b in loaded.files.items()} == files
    assert not any(buffer.readonly for buffer in loaded.files.values())


def test_a_file_that_is_not_safetensors_is_a_rejection(tmp_path):
    verified = VerifiedCheckpoint(str(tmp_path), 1, Anchor({}, "t", True), {"w.safetensors": memoryview(b"junk")})
    with pytest.raises(CheckpointRejected, match=r"w\.safetensors: not a safetensors file"):
        verified.tensors("w.safetensors")
