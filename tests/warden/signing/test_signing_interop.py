"""Interoperability with OpenSSF model_signing 1.x, both ways, through its real CLI.

Skipped with a message when model_signing is not installed; fails when CI=true.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.warden.signing.signing_helpers import Keys, make_keys, model_signing_cli, run_model_signing, write_tree
from warden.signing import Provenance, sign_checkpoint, verify_checkpoint
from warden.signing.dsse import decode_bundle
from warden.signing.hashing import hash_tree
from warden.signing.manifest import DEFAULT_IGNORE_PATHS, Serialization, build_manifest, build_statement

FILES = {
    "actor/model.safetensors": bytes(range(256)) * 4096,
    "actor/empty": b"",
    "a/b/x": b"nested",
    "a.b": b"sorts after a/ by components",
    "critic/sub/deeper/state.json": b"{}",
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    model_signing_cli()  # skip early when the tool is missing
    return make_keys(tmp_path_factory.mktemp("keys"))


def verify_with_model_signing(model: Path, sig: Path, keys: Keys) -> tuple[int, str]:
    done = run_model_signing(
        ["verify", "key", str(model), "--signature", str(sig), "--public_key", str(keys.public_path)]
    )
    return done.returncode, done.stdout + done.stderr


def test_model_signing_verifies_our_signature_with_warden_fields(tmp_path: Path, keys: Keys) -> None:
    model = write_tree(tmp_path / "step-000000050", FILES)
    provenance = Provenance(run_id="run-1", step=50, trainer_version="0.1.0", parent_root_digest="ab" * 32)
    result = sign_checkpoint(model, keys.private, provenance)
    statement = json.loads(decode_bundle(Path(result.signature_path).read_bytes()).payload)
    assert statement["predicate"]["warden"]["parent_root_digest"] == "ab" * 32  # extra fields are present
    code, output = verify_with_model_signing(model, Path(result.signature_path), keys)
    assert code == 0 and "Verification succeeded" in output, output

    (model / "a/b/x").write_bytes(b"tampered")
    code, output = verify_with_model_signing(model, Path(result.signature_path), keys)
    assert code != 0 and "a/b/x" in output, output


def test_we_verify_a_model_signing_signature_made_with_a_p256_key(tmp_path: Path, keys: Keys) -> None:
    model = write_tree(tmp_path / "model", FILES)
    sig = tmp_path / "model.sig"
    done = run_model_signing(
        ["sign", "key", str(model), "--private_key", str(keys.private_path), "--signature", str(sig)]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = verify_checkpoint(model, keys.trusted(), signature_path=sig)
    assert result.ok, result.report()
    assert result.files_checked == len(FILES)

    (model / "actor/empty").write_bytes(b"no longer empty")
    result = verify_checkpoint(model, keys.trusted(), signature_path=sig)
    assert [d.name for d in result.modified] == ["actor/empty"]


def test_model_signing_signature_kept_inside_the_model_directory(tmp_path: Path, keys: Keys) -> None:
    model = write_tree(tmp_path / "model", {**FILES, ".gitignore": b"*.tmp"})
    sig = model / "model.sig"
    done = run_model_signing(
        ["sign", "key", str(model), "--private_key", str(keys.private_path), "--signature", str(sig)], cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert verify_checkpoint(model, keys.trusted(), signature_path=sig).ok


def test_same_statement_as_model_signing_api(tmp_path: Path) -> None:
    model_signing_cli()
    ms_hashing = pytest.importorskip("model_signing.hashing")
    from google.protobuf import json_format
    from model_signing._signing import signing as ms_signing

    model = write_tree(tmp_path / "model", FILES)
    payload = ms_signing.Payload(ms_hashing.Config().hash(model))
    theirs = json.loads(json_format.MessageToJson(payload.statement.pb))
    ours = build_statement(build_manifest("model", hash_tree(model), DEFAULT_IGNORE_PATHS))
    assert theirs["subject"] == ours["subject"]  # same root digest, so the same resource order
    assert theirs["predicate"]["resources"] == ours["predicate"]["resources"]
    assert theirs["predicateType"] == ours["predicateType"] and theirs["_type"] == ours["_type"]
    theirs_serialization = dict(theirs["predicate"]["serialization"])
    ours_serialization = dict(ours["predicate"]["serialization"])
    assert sorted(theirs_serialization.pop("ignore_paths")) == ours_serialization.pop("ignore_paths")
    assert theirs_serialization == ours_serialization


# --- shards (and files/blake3): model_signing 1.1.1's CLI has no option for either on `sign key`
# and its `verify key` always re-hashes as files/sha256, so it rejects every shard signature (its
# own too); its verifying API reads the serialization from the signature. Both are pinned here.

SHARD = 1 << 20
MODES = {"shards": Serialization("shards", "sha256", SHARD), "blake3": Serialization("files", "blake3")}
BIG = {**FILES, "actor/model-00001-of-00002.safetensors": bytes(range(251)) * 20_000}  # ~4.8 shards


def _ms_api_verify(model: Path, sig: Path, keys: Keys) -> str | None:
    """None when model_signing's verifying API accepts ``sig`` for ``model``, else its error."""
    verifying = pytest.importorskip("model_signing.verifying")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=keys.public_path).verify(model, sig)
    except (ValueError, TypeError) as exc:  # TypeError: its own float shard_size
        return str(exc)
    return None


def _ms_api_sign(model: Path, sig: Path, keys: Keys, **shard_args: object) -> None:
    ms_hashing = pytest.importorskip("model_signing.hashing")
    ms_signing = pytest.importorskip("model_signing.signing")
    config = ms_hashing.Config()
    config = config.use_shard_serialization(**shard_args) if "shard_size" in shard_args else config
    if shard_args.get("hashing_algorithm") == "blake3":
        config = ms_hashing.Config().use_file_serialization(hashing_algorithm="blake3")
    ms_signing.Config().use_elliptic_key_signer(private_key=keys.private_path).set_hashing_config(config).sign(
        model, sig
    )


@pytest.mark.parametrize("mode", ["shards", "blake3"])
def test_model_signing_api_verifies_our_shard_and_blake3_signatures(tmp_path: Path, keys: Keys, mode: str) -> None:
    model = write_tree(tmp_path / "step-000000050", BIG)
    method = MODES[mode]
    result = sign_checkpoint(model, keys.private, Provenance(run_id="run-1", step=50), serialization=method)
    sig = Path(result.signature_path)
    assert _ms_api_verify(model, sig, keys) is None
    code, output = verify_with_model_signing(model, sig, keys)  # the 1.1.1 CLI: files/sha256 only
    assert code != 0 and "Signature mismatch" in output, output

    target = model / "actor/model-00001-of-00002.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # in the middle of the large file
    target.write_bytes(bytes(data))
    error = _ms_api_verify(model, sig, keys)
    assert error is not None and "actor/model-00001-of-00002.safetensors" in error
    ours = verify_checkpoint(model, keys.trusted(), signature_path=sig)
    assert [d.name for d in ours.modified] == ["actor/model-00001-of-00002.safetensors"]


@pytest.mark.parametrize("mode", ["shards", "blake3"])
def test_we_verify_model_signing_shard_and_blake3_signatures(tmp_path: Path, keys: Keys, mode: str) -> None:
    model = write_tree(tmp_path / "model", BIG)
    sig = tmp_path / "model.sig"
    args = {"shard_size": SHARD} if mode == "shards" else {"hashing_algorithm": "blake3"}
    _ms_api_sign(model, sig, keys, **args)
    statement = json.loads(decode_bundle(sig.read_bytes()).payload)
    if mode == "shards":
        # model_signing 1.1.1 writes the shard size as a float, which its own verifier then refuses
        assert statement["predicate"]["serialization"]["shard_size"] == float(SHARD)
        assert "cannot be interpreted as an integer" in (_ms_api_verify(model, sig, keys) or "")
    result = verify_checkpoint(model, keys.trusted(), signature_path=sig)
    assert result.ok, result.report()
    ours = sign_checkpoint(
        model,
        keys.private,
        signature_path=tmp_path / "ours.sig",
        serialization=MODES[mode],
    )
    assert ours.root_digest == statement["subject"][0]["digest"]["sha256"]  # same resources, same root

    (model / "a/b/x").write_bytes(b"tampered")
    result = verify_checkpoint(model, keys.trusted(), signature_path=sig)
    assert [d.name for d in result.modified] == ["a/b/x"]
