"""Sign then verify: clean checkpoints pass, and every tampering fails with the right reason."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.warden.signing.signing_helpers import (
    CHECKPOINT_FILES,
    Keys,
    copy_checkpoint,
    make_keys,
    random_tree,
    write_tree,
)
from warden.errors import EXIT_INCOMPLETE, EXIT_VIOLATION
from warden.signing import Provenance, VerificationFailed, sign_checkpoint, verify_checkpoint
from warden.signing.dsse import decode_bundle, encode_bundle, sign_payload
from warden.signing.errors import SignatureMissing, UnsupportedSignature
from warden.signing.keys import load_trusted_keys, trusted_keys_from
from warden.signing.manifest import parse_statement
from warden.signing.verify import read_signed_statement


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def intruder(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("intruder"))


@pytest.fixture(scope="module")
def signed_template(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Path:
    """A signed checkpoint that each test copies (with its .sig) before tampering."""
    root = write_tree(tmp_path_factory.mktemp("template") / "step-000000050", CHECKPOINT_FILES)
    sign_checkpoint(root, keys.private, Provenance(run_id="run-1", step=50, trainer_version="0.1.0"))
    return root


@pytest.fixture()
def ckpt(tmp_path: Path, signed_template: Path) -> Path:
    return copy_checkpoint(signed_template, tmp_path / "checkpoints" / "step-000000050")


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def sig_of(path: Path) -> Path:
    return Path(str(path) + ".sig")


def test_clean_checkpoint_verifies_with_provenance(ckpt: Path, keys: Keys) -> None:
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.ok, result.report()
    assert result.key_id == keys.key_id
    assert result.files_checked == len(CHECKPOINT_FILES)
    assert result.provenance == Provenance(run_id="run-1", step=50, trainer_version="0.1.0")
    assert result.signed_root_digest == result.actual_root_digest
    result.raise_for_problems()


def test_signature_is_written_beside_the_directory_without_temp_files(ckpt: Path) -> None:
    assert sorted(os.listdir(ckpt.parent)) == ["step-000000050", "step-000000050.sig"]
    bundle = json.loads(sig_of(ckpt).read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["verificationMaterial"]["tlogEntries"] == []
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"


def test_bit_flip_in_large_file_is_reported_as_modified_with_digests(ckpt: Path, keys: Keys) -> None:
    target = ckpt / "actor/model.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["files_mismatch"]
    [diff] = result.modified
    assert diff.name == "actor/model.safetensors"
    assert diff.expected == sha(CHECKPOINT_FILES["actor/model.safetensors"])
    assert diff.actual == sha(bytes(data))
    assert f"modified actor/model.safetensors: signed sha256:{diff.expected}, found sha256:{diff.actual}" in (
        result.report()
    )
    with pytest.raises(VerificationFailed) as info:
        result.raise_for_problems()
    assert info.value.exit_code == EXIT_VIOLATION


def test_truncated_file_is_modified(ckpt: Path, keys: Keys) -> None:
    os.truncate(ckpt / "trainer_state.json", 5)
    result = verify_checkpoint(ckpt, keys.trusted())
    assert [d.name for d in result.modified] == ["trainer_state.json"]
    assert result.modified[0].actual == sha(CHECKPOINT_FILES["trainer_state.json"][:5])


def test_deleted_file_is_missing(ckpt: Path, keys: Keys) -> None:
    (ckpt / "critic/model.safetensors").unlink()
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["files_mismatch"]
    assert [(d.name, d.expected) for d in result.missing] == [
        ("critic/model.safetensors", sha(CHECKPOINT_FILES["critic/model.safetensors"]))
    ]
    assert "1 missing" in result.summary()


def test_added_file_is_extra(ckpt: Path, keys: Keys) -> None:
    (ckpt / "actor/backdoor.py").write_bytes(b"import os")
    result = verify_checkpoint(ckpt, keys.trusted())
    assert [(d.name, d.actual) for d in result.extra] == [("actor/backdoor.py", sha(b"import os"))]
    assert "extra    actor/backdoor.py: found sha256:" in result.report()


def test_renamed_file_is_missing_plus_extra(ckpt: Path, keys: Keys) -> None:
    (ckpt / "actor/config.json").rename(ckpt / "actor/config.json.bak")
    result = verify_checkpoint(ckpt, keys.trusted())
    assert [d.name for d in result.missing] == ["actor/config.json"]
    assert [d.name for d in result.extra] == ["actor/config.json.bak"]
    assert result.extra[0].actual == result.missing[0].expected


def test_file_replaced_by_symlink_to_identical_content_is_refused(ckpt: Path, keys: Keys, tmp_path: Path) -> None:
    outside = tmp_path / "outside-state.json"
    outside.write_bytes(CHECKPOINT_FILES["trainer_state.json"])
    (ckpt / "trainer_state.json").unlink()
    os.symlink(outside, ckpt / "trainer_state.json")
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["unsafe_path", "files_mismatch"]
    assert f"{ckpt}/trainer_state.json is a symlink (-> {outside})" in result.problems[0].message
    assert [d.name for d in result.missing] == ["trainer_state.json"]


def _edit_payload(sig: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    edit(statement)
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig.write_text(json.dumps(document))


def test_edited_payload_fails_the_signature(ckpt: Path, keys: Keys) -> None:
    # The attacker changes a file and patches its digest (and the root) into the payload.
    (ckpt / "actor/config.json").write_bytes(b'{"hidden_size": 65}\n')

    def patch(statement: dict[str, Any]) -> None:
        for resource in statement["predicate"]["resources"]:
            if resource["name"] == "actor/config.json":
                resource["digest"] = sha(b'{"hidden_size": 65}\n')

    _edit_payload(sig_of(ckpt), patch)
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["bad_signature"]
    assert "altered after signing" in result.problems[0].message


def test_inconsistent_payload_signed_by_trusted_key_is_payload_mismatch(ckpt: Path, keys: Keys) -> None:
    statement = json.loads(decode_bundle(sig_of(ckpt).read_bytes()).payload)
    statement["predicate"]["resources"].pop()  # the subject digest no longer matches
    bundle = sign_payload(json.dumps(statement).encode(), keys.private)
    sig_of(ckpt).write_bytes(encode_bundle(bundle))
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["payload_mismatch"]
    assert "statement is inconsistent: subject digest is" in result.problems[0].message


def test_resigned_with_untrusted_key_is_wrong_key(ckpt: Path, keys: Keys, intruder: Keys) -> None:
    (ckpt / "actor/backdoor.py").write_bytes(b"evil")
    sign_checkpoint(ckpt, intruder.private)
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["wrong_key"]
    assert f"signed by key {intruder.key_id}, which is not trusted" in result.problems[0].message
    assert verify_checkpoint(ckpt, intruder.trusted()).ok  # the intruder's own key would accept it


def test_untrusted_key_claiming_the_trusted_hint_is_bad_signature(ckpt: Path, keys: Keys, intruder: Keys) -> None:
    sign_checkpoint(ckpt, intruder.private)
    document = json.loads(sig_of(ckpt).read_text())
    document["verificationMaterial"]["publicKey"]["hint"] = keys.key_id
    sig_of(ckpt).write_text(json.dumps(document))
    assert verify_checkpoint(ckpt, keys.trusted()).codes == ["bad_signature"]


def _two_checkpoints(tmp_path: Path, keys: Keys, same_content: bool) -> tuple[Path, Path]:
    first = write_tree(tmp_path / "step-000000050", {"w.bin": b"weights at 50"})
    second = write_tree(tmp_path / "step-000000100", {"w.bin": b"weights at 50" if same_content else b"at 100"})
    sign_checkpoint(first, keys.private, Provenance(step=50))
    sign_checkpoint(second, keys.private, Provenance(step=100))
    return first, second


def test_signature_moved_onto_another_checkpoint_is_subject_mismatch(tmp_path: Path, keys: Keys) -> None:
    first, second = _two_checkpoints(tmp_path, keys, same_content=False)
    shutil.copyfile(sig_of(first), sig_of(second))
    result = verify_checkpoint(second, keys.trusted())
    assert result.codes == ["subject_mismatch", "files_mismatch"]
    assert "signature of checkpoint 'step-000000050', not of 'step-000000100'" in result.problems[0].message
    assert [d.name for d in result.modified] == ["w.bin"]


@pytest.mark.parametrize("same_content", [False, True])
def test_swapped_signatures_fail_both_checkpoints(tmp_path: Path, keys: Keys, same_content: bool) -> None:
    first, second = _two_checkpoints(tmp_path, keys, same_content)
    a, b = sig_of(first).read_bytes(), sig_of(second).read_bytes()
    sig_of(first).write_bytes(b)
    sig_of(second).write_bytes(a)
    for ckpt in (first, second):
        result = verify_checkpoint(ckpt, keys.trusted())
        assert result.codes[0] == "subject_mismatch"
        assert ("files_mismatch" in result.codes) != same_content


def test_trailing_slash_names_the_same_signature_and_subject(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "step-000000007", {"w": b"7"})
    result = sign_checkpoint(f"{root}/", keys.private)
    assert result.signature_path == f"{root}.sig" and result.manifest.name == "step-000000007"
    assert verify_checkpoint(f"{root}/", keys.trusted()).ok


def test_renamed_copy_verifies_only_when_subject_check_is_off(tmp_path: Path, ckpt: Path, keys: Keys) -> None:
    copy = shutil.copytree(ckpt, tmp_path / "checkpoint-50")
    assert verify_checkpoint(copy, keys.trusted(), signature_path=sig_of(ckpt)).codes == ["subject_mismatch"]
    assert verify_checkpoint(copy, keys.trusted(), signature_path=sig_of(ckpt), check_subject=False).ok


def test_malformed_and_missing_signatures(ckpt: Path, keys: Keys) -> None:
    sig_of(ckpt).write_bytes(sig_of(ckpt).read_bytes()[:100])
    result = verify_checkpoint(ckpt, keys.trusted())
    assert result.codes == ["malformed_bundle"] and "not JSON" in result.problems[0].message
    sig_of(ckpt).unlink()
    with pytest.raises(SignatureMissing, match="no signature; sign the checkpoint") as info:
        verify_checkpoint(ckpt, keys.trusted())
    assert info.value.exit_code == EXIT_INCOMPLETE


def test_shard_serialization_is_unsupported_not_valid(ckpt: Path, keys: Keys) -> None:
    statement = json.loads(decode_bundle(sig_of(ckpt).read_bytes()).payload)
    statement["predicate"]["serialization"]["method"] = "shards"
    sig_of(ckpt).write_bytes(encode_bundle(sign_payload(json.dumps(statement).encode(), keys.private)))
    with pytest.raises(UnsupportedSignature, match="serialization method 'shards'"):
        verify_checkpoint(ckpt, keys.trusted())


def test_signature_inside_the_directory_is_ignored(tmp_path: Path, keys: Keys) -> None:
    root = write_tree(tmp_path / "model", {"w": b"1", "sub/x": b"2"})
    sign_checkpoint(root, keys.private, signature_path=root / "sub" / "model.sig")
    statement = parse_statement(decode_bundle((root / "sub/model.sig").read_bytes()).payload)
    assert "sub/model.sig" in statement.manifest.ignore_paths
    assert verify_checkpoint(root, keys.trusted(), signature_path=root / "sub/model.sig").ok


def test_parent_digest_chain_can_be_read_back(tmp_path: Path, keys: Keys) -> None:
    first, second = tmp_path / "step-000000050", tmp_path / "step-000000100"
    write_tree(first, {"w": b"50"})
    write_tree(second, {"w": b"100"})
    parent = sign_checkpoint(first, keys.private, Provenance(run_id="r", step=50))
    sign_checkpoint(second, keys.private, Provenance(run_id="r", step=100, parent_root_digest=parent.root_digest))
    key_id, statement = read_signed_statement(sig_of(second), keys.trusted())
    assert key_id == keys.key_id
    assert statement.provenance.parent_root_digest == parent.root_digest
    assert read_signed_statement(sig_of(first), keys.trusted())[1].subject_digest == parent.root_digest


def test_trust_directory_with_several_keys(tmp_path: Path, keys: Keys, intruder: Keys) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(keys.public_path, trust / "prod.pub")
    shutil.copy(intruder.public_path, trust / "other.pub")
    root = write_tree(tmp_path / "step-1", {"w": b"x"})
    sign_checkpoint(root, intruder.private)
    (trust / "README").write_text("not a key, ignored")
    trusted = load_trusted_keys(trust)
    assert {k.key_id for k in trusted} == {keys.key_id, intruder.key_id}
    result = verify_checkpoint(root, trusted)
    assert result.ok and result.key_id == intruder.key_id
    in_memory = trusted_keys_from([keys.private.public_key()])
    assert verify_checkpoint(root, in_memory).codes == ["wrong_key"]


def test_no_false_positives_on_100_random_checkpoints(tmp_path: Path, keys: Keys) -> None:
    rng = random.Random(20261130)
    trusted = keys.trusted()
    failures = []
    for index in range(100):
        root = write_tree(tmp_path / f"step-{index:09d}", random_tree(rng))
        sign_checkpoint(root, keys.private, Provenance(step=index), max_workers=rng.choice([1, 2]))
        result = verify_checkpoint(root, trusted)
        if not result.ok:
            failures.append(result.report())
    assert failures == []
