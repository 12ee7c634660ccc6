"""The root digest the trainer (and the HF callback) announce is exactly what the signer signs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.sidecars.signer.signer_helpers import CHECKPOINT_FILES, make_keys, write_tree
from warden.payloads import CheckpointSaved, PayloadError
from warden.signer.announcements import Record, audit, statement_problem
from warden.signing.dsse import sign_checkpoint
from warden.signing.errors import AnnouncementMismatch
from warden.signing.manifest import (
    Announced,
    Manifest,
    Provenance,
    SignedStatement,
    announced_root,
    names_digest,
)


def test_trainer_announcement_equals_what_sign_checkpoint_signs(tmp_path: Path) -> None:
    from trainer import checkpoint as ckpt

    def fill(writer: ckpt.CheckpointWriter) -> None:
        for name, content in CHECKPOINT_FILES.items():
            writer.bytes(name, content)
        ckpt.save_state(writer, "rng", {"seed": 3})

    written = ckpt.write_checkpoint(str(tmp_path / "checkpoints"), 50, fill)
    announced = written.announced
    signed = sign_checkpoint(written.path, make_keys(tmp_path / "keys").private)
    names = names_digest([r.name for r in signed.manifest.resources], [r.name for r in signed.manifest.resources])
    assert announced == Announced(signed.root_digest, len(signed.manifest.resources), None, names)
    assert announced.file_count == len(CHECKPOINT_FILES) + 2  # + rng.json + the trainer's manifest


def test_hf_callback_digest_equals_what_sign_checkpoint_signs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from trainer.integrations.hf import checkpoint_digest

    directory = write_tree(tmp_path / "checkpoint-7", {**CHECKPOINT_FILES, ".git/HEAD": b"ref"})
    signed = sign_checkpoint(directory, make_keys(tmp_path / "keys").private)
    names = names_digest([r.name for r in signed.manifest.resources], [r.name for r in signed.manifest.resources])
    assert checkpoint_digest(str(directory)) == Announced(signed.root_digest, len(CHECKPOINT_FILES), None, names)
    os.symlink("/etc/passwd", directory / "evil")
    assert checkpoint_digest(str(directory)) is None


def test_sign_checkpoint_refuses_bytes_other_than_announced(tmp_path: Path) -> None:
    directory = write_tree(tmp_path / "step-000000002", CHECKPOINT_FILES)
    key = make_keys(tmp_path / "keys").private
    right = announced_root({n: hashlib.sha256(b).hexdigest() for n, b in CHECKPOINT_FILES.items()})
    (directory / "actor" / "config.json").write_bytes(b'{"hidden_size": 65}\n')
    with pytest.raises(AnnouncementMismatch) as info:
        sign_checkpoint(directory, key, expected=right)
    assert info.value.reason == "digest_mismatch" and info.value.expected == right.root_digest
    assert info.value.exit_code == 1
    assert not Path(str(directory) + ".sig").exists()
    actual = sign_checkpoint(directory, key).root_digest
    assert info.value.actual == actual
    with pytest.raises(AnnouncementMismatch) as count:
        sign_checkpoint(directory, key, expected=Announced(actual, len(CHECKPOINT_FILES) + 1))
    assert count.value.reason == "file_count_mismatch"


def test_announcement_parsing_is_strict() -> None:
    digest = "ab" * 32
    assert CheckpointSaved.from_data({"path": "x"}).announced is None
    assert CheckpointSaved.from_data({"path": "x", "root_digest": digest, "file_count": 3}).announced == Announced(
        digest, 3
    )
    for bad in (
        {"root_digest": digest},
        {"root_digest": digest.upper(), "file_count": 3},
        {"root_digest": digest, "file_count": True},
        {"root_digest": digest, "file_count": -1},
        {"root_digest": "x" * 2_000_000, "file_count": 1},
    ):
        with pytest.raises(PayloadError):
            CheckpointSaved.from_data({"path": "x", **bad})


def test_audit_rule() -> None:
    signed = Record(2, "r", "aa" * 32, 3, signed_digest="aa" * 32)
    assert audit(signed, True, 0, 30) is None
    assert audit(signed, False, 0, 30) == "signature_missing"
    assert audit(Record(2, "r", "aa" * 32, 3), False, 100, 30) is None  # announced, being signed
    assert audit(Record(2, "r", None, None, refused="no_digest"), False, 0, 30) == "no_digest"
    assert audit(None, False, 29.9, 30) is None
    assert audit(None, False, 30, 30) == "unannounced"


def test_statement_problem_names_run_step_and_digest() -> None:
    def statement(name: str, run: str | None, step: int | None, digest: str) -> SignedStatement:
        return SignedStatement(Manifest(name, ()), digest, Provenance(run_id=run, step=step))

    record = Record(2, "r", "aa" * 32, 1, signed_digest="aa" * 32)
    good = statement("step-000000002", "r", 2, "aa" * 32)
    name = good.manifest.name

    def problem(other: SignedStatement, known: Record | None = record) -> str:
        return str(statement_problem(name, 2, known, other, {"r"}))

    assert statement_problem(name, 2, record, good, {"r"}) is None
    assert "not 'step-000000002'" in problem(statement("step-000000004", "r", 2, "aa" * 32))
    assert "step 4" in problem(statement(name, "r", 4, "aa" * 32))
    assert "run 'x'" in problem(statement(name, "x", 2, "aa" * 32))
    assert "bb" * 32 in problem(statement(name, "r", 2, "bb" * 32))
    assert statement_problem("step-000000002", 2, None, good, {"r"}) is None
    assert "not one of this run" in str(statement_problem("step-000000002", 2, None, good, {"other"}))
