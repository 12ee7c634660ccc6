"""The ``shards`` serialization (and ``files``/blake3): hashing, statements, the tamper matrix,
announcements and the policy fields. Interop with model_signing is in test_signing_interop.py."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from tests.warden.signing.signing_helpers import CHECKPOINT_FILES, Keys, copy_checkpoint, make_keys, write_tree
from warden.signer.policy import SignerPolicy
from warden.signing import Provenance, sign_checkpoint, verify_checkpoint
from warden.signing.dsse import decode_bundle, encode_bundle, sign_payload
from warden.signing.errors import (
    AnnouncementMismatch,
    CheckpointChanged,
    PayloadMismatch,
    UnsafePathError,
    UnsupportedSignature,
)
from warden.signing.hashing import FileEntry, hash_files, hash_shards, plan_jobs, scan_tree, shard_bounds
from warden.signing.manifest import (
    Serialization,
    announce_tree,
    announced_root,
    build_manifest,
    parse_statement,
    shard_resources,
)

SHARD = 1 << 20
SHARDS = Serialization("shards", "sha256", SHARD)
BLAKE3 = Serialization("files", "blake3")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module", params=[SHARDS, BLAKE3], ids=["shards", "blake3"])
def template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Path:
    root = write_tree(tmp_path_factory.mktemp("template") / "step-000000050", CHECKPOINT_FILES)
    sign_checkpoint(root, keys.private, Provenance(run_id="r", step=50), serialization=request.param)
    return root


@pytest.fixture()
def ckpt(tmp_path: Path, template: Path) -> Path:
    return copy_checkpoint(template, tmp_path / "step-000000050")


@pytest.fixture()
def shard_ckpt(tmp_path: Path, keys: Keys) -> Path:
    """A checkpoint signed in shards mode only (for the tests about shard statements)."""
    root = write_tree(tmp_path / "step-000000050", CHECKPOINT_FILES)
    sign_checkpoint(root, keys.private, Provenance(run_id="r", step=50), serialization=SHARDS)
    return root


def statement_of(path: Path) -> dict:
    return json.loads(decode_bundle(Path(str(path) + ".sig").read_bytes()).payload)


def test_shard_bounds_are_model_signings() -> None:
    assert shard_bounds(0, 4) == ()
    assert shard_bounds(8, 4) == ((0, 4), (4, 8))
    assert shard_bounds(9, 4) == ((0, 4), (4, 8), (8, 9))
    with pytest.raises(ValueError):
        shard_bounds(3, 0)


def test_a_large_file_becomes_many_parallel_jobs_largest_first() -> None:
    files = [FileEntry("big", 10 * SHARD + 5), FileEntry("small", 10)]
    jobs = plan_jobs(files, SHARD)
    assert len(jobs) == 12 and jobs[0].entry.name == "big" and jobs[-1].size == 5
    whole = plan_jobs(files, SHARD, whole_files=True)
    assert len(whole) == 14 and whole[0].whole_file and whole[0].entry.name == "big" and whole[0].bounds == ()
    assert sum(j.size for j in whole) == 2 * sum(f.size for f in files)  # whole files in their own tasks


def test_shard_digests_are_sha256_of_the_byte_ranges_and_whole_files_come_from_the_same_read(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(3 * SHARD + 123)
    write_tree(tmp_path / "m", {"w.bin": data, "e": b""})
    scan = scan_tree(tmp_path / "m")
    found = hash_shards(scan.root, scan.files, SHARD, whole_files=True, max_workers=3)
    assert found.shards == {
        ("w.bin", s, e): hashlib.sha256(data[s:e]).digest() for s, e in shard_bounds(len(data), SHARD)
    }
    assert found.files == {"w.bin": hashlib.sha256(data).digest(), "e": hashlib.sha256(b"").digest()}
    assert hash_files(scan.root, scan.files) == found.files


def test_a_file_that_grows_after_the_scan_is_changed(tmp_path: Path) -> None:
    write_tree(tmp_path / "m", {"w.bin": b"x" * (2 * SHARD)})
    scan = scan_tree(tmp_path / "m")
    with open(tmp_path / "m" / "w.bin", "ab") as fh:
        fh.write(b"more")
    with pytest.raises(CheckpointChanged):
        hash_shards(scan.root, scan.files, SHARD)


def test_statement_lists_shards_in_model_signing_order(ckpt: Path) -> None:
    predicate = statement_of(ckpt)["predicate"]
    if predicate["serialization"]["method"] != "shards":
        assert {r["algorithm"] for r in predicate["resources"]} == {"blake3"}
        return
    assert predicate["serialization"]["shard_size"] == SHARD
    names = [r["name"] for r in predicate["resources"]]
    assert names[:4] == [
        "a/b/c/deep.bin:0:4",
        "a.b:0:33",
        "actor/config.json:0:20",
        "actor/model.safetensors:0:1048576",
    ]
    assert "actor/model.safetensors:3145728:3145745" in names
    assert not any(n.startswith("actor/empty") for n in names)  # model_signing lists no shard for it
    assert {r["algorithm"] for r in predicate["resources"]} == {f"sha256-sharded-{SHARD}"}


def test_clean_checkpoint_verifies(ckpt: Path, keys: Keys) -> None:
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.ok, result.report()
    assert result.actual_root_digest == result.signed_root_digest


def test_a_change_in_the_middle_of_a_large_file_names_the_file(ckpt: Path, keys: Keys) -> None:
    target = ckpt / "actor/model.safetensors"
    with open(target, "r+b") as fh:
        fh.seek(SHARD + SHARD // 2)
        byte = fh.read(1)
        fh.seek(SHARD + SHARD // 2)
        fh.write(bytes([byte[0] ^ 1]))
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["files_mismatch"]
    assert [d.name for d in result.modified] == ["actor/model.safetensors"]
    assert not result.missing and not result.extra


@pytest.mark.parametrize(
    ("attack", "modified", "missing", "extra"),
    [
        ("truncate", ["actor/model.safetensors"], [], []),
        ("append", ["critic/model.safetensors"], [], []),
        ("delete", [], ["trainer_state.json"], []),
        ("add", [], [], ["actor/new.bin"]),
        ("rename", [], ["a.b"], ["a.c"]),
    ],
)
def test_tamper_matrix(
    ckpt: Path, keys: Keys, attack: str, modified: list[str], missing: list[str], extra: list[str]
) -> None:
    if attack == "truncate":
        os.truncate(ckpt / "actor/model.safetensors", 2 * SHARD)  # on a shard boundary
    elif attack == "append":
        with open(ckpt / "critic/model.safetensors", "ab") as fh:
            fh.write(b"\0")
    elif attack == "delete":
        (ckpt / "trainer_state.json").unlink()
    elif attack == "add":
        (ckpt / "actor/new.bin").write_bytes(b"payload")
    else:
        (ckpt / "a.b").rename(ckpt / "a.c")
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["files_mismatch"]
    assert [d.name for d in result.modified] == modified
    assert [d.name for d in result.missing] == missing
    assert [d.name for d in result.extra] == extra


def test_symlink_is_refused_in_shard_mode(ckpt: Path, keys: Keys, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(CHECKPOINT_FILES["a.b"])
    (ckpt / "a.b").unlink()
    (ckpt / "a.b").symlink_to(outside)
    result = verify_checkpoint(ckpt, keys.trusted())
    assert "unsafe_path" in result.codes
    with pytest.raises(UnsafePathError):
        sign_checkpoint(ckpt, keys.private, serialization=SHARDS)


def test_a_shard_name_off_the_shard_grid_is_a_payload_mismatch(shard_ckpt: Path, keys: Keys) -> None:
    statement = statement_of(shard_ckpt)
    resources = statement["predicate"]["resources"]
    index = next(i for i, r in enumerate(resources) if r["name"].endswith(f":{SHARD}:{2 * SHARD}"))
    resources[index]["name"] = resources[index]["name"].replace(f":{SHARD}:{2 * SHARD}", f":{SHARD + 7}:{2 * SHARD}")
    with pytest.raises(PayloadMismatch):
        parse_statement(json.dumps(statement).encode())


def test_model_signings_float_shard_size_is_read_and_a_bad_one_is_unsupported(shard_ckpt: Path, keys: Keys) -> None:
    ckpt = shard_ckpt
    statement = statement_of(ckpt)
    statement["predicate"]["serialization"]["shard_size"] = float(SHARD)
    assert parse_statement(json.dumps(statement).encode()).manifest.serialization == SHARDS
    for bad in (0, 1.5, "1048576", True):
        statement["predicate"]["serialization"]["shard_size"] = bad
        sig = Path(str(ckpt) + ".sig")
        sig.write_bytes(encode_bundle(sign_payload(json.dumps(statement).encode(), keys.private)))
        with pytest.raises(UnsupportedSignature, match="serialization method 'shards'"):
            verify_checkpoint(ckpt, keys.trusted())


def test_announcement_stays_per_file_sha256_and_is_checked_from_the_same_read(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "step-000000060", CHECKPOINT_FILES)
    announced = announced_root({n: hashlib.sha256(c).hexdigest() for n, c in CHECKPOINT_FILES.items()})
    assert announce_tree(root) == announced  # what hf.py / the verl bridge announce
    result = sign_checkpoint(root, keys.private, Provenance(run_id="r"), serialization=SHARDS, expected=announced)
    assert result.root_digest != announced.root_digest  # the signed root is the shard root
    statement = parse_statement(decode_bundle(Path(result.signature_path).read_bytes()).payload)
    assert statement.provenance.files_root_digest == announced.root_digest
    assert statement.provenance.run_id == "r"
    assert verify_checkpoint(root, keys.trusted()).ok

    (root / "a.b").write_bytes(b"changed after the trainer announced")
    with pytest.raises(AnnouncementMismatch) as info:
        sign_checkpoint(root, keys.private, serialization=SHARDS, expected=announced)
    assert info.value.reason == "digest_mismatch" and info.value.expected == announced.root_digest
    (root / "a.b").unlink()
    (root / "a.b").write_bytes(CHECKPOINT_FILES["a.b"])
    (root / "actor/empty2").write_bytes(b"")  # invisible to shards, but the announcement counts files
    with pytest.raises(AnnouncementMismatch, match="refused to sign"):
        sign_checkpoint(root, keys.private, serialization=SHARDS, expected=announced)


def test_blake3_announcement_is_checked_too(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "step-000000070", CHECKPOINT_FILES)
    announced = announce_tree(root)
    result = sign_checkpoint(root, keys.private, serialization=BLAKE3, expected=announced)
    statement = parse_statement(decode_bundle(Path(result.signature_path).read_bytes()).payload)
    assert statement.provenance.files_root_digest == announced.root_digest
    assert statement.manifest.serialization == BLAKE3


def test_files_mode_is_unchanged_by_default(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "step-000000080", CHECKPOINT_FILES)
    announced = announce_tree(root)
    result = sign_checkpoint(root, keys.private, expected=announced)
    assert result.root_digest == announced.root_digest
    predicate = statement_of(root)["predicate"]
    assert predicate["serialization"]["method"] == "files" and "files_root_digest" not in predicate.get("warden", {})


def test_names_with_a_colon_cannot_be_shards(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "m", {"a:b": b"1"})
    with pytest.raises(UnsupportedSignature, match="':'"):
        sign_checkpoint(root, keys.private, serialization=SHARDS)


def test_build_manifest_root_matches_shard_resources(tmp_path: Path) -> None:
    data = random.Random(5).randbytes(2 * SHARD + 1)
    write_tree(tmp_path / "m", {"x": data})
    scan = scan_tree(tmp_path / "m")
    manifest = build_manifest("m", shard_resources(hash_shards(scan.root, scan.files, SHARD).shards), (), SHARDS)
    expected = hashlib.sha256(
        b"".join(hashlib.sha256(data[s:e]).digest() for s, e in shard_bounds(len(data), SHARD))
    ).digest()
    assert manifest.root_digest == expected and manifest.file_count == 1


def test_policy_fields() -> None:
    assert SignerPolicy().signing_serialization() == Serialization()
    assert SignerPolicy(serialization="shards", shard_size=SHARD).signing_serialization() == SHARDS
    assert SignerPolicy(hash_algorithm="blake3").signing_serialization() == BLAKE3
    for bad in (
        {"serialization": "tiles"},
        {"serialization": "shards", "shard_size": 1000},
        {"serialization": "shards", "hash_algorithm": "blake3"},
        {"hash_algorithm": "md5"},
    ):
        with pytest.raises(ValueError):
            SignerPolicy(**bad)  # type: ignore[arg-type]
