"""Verified resume of HF Trainer checkpoints and unique HF run ids, on a real transformers.Trainer.

A run of two steps (a checkpoint per step) is trained once per module; each test copies it and
signs its checkpoints in-process with a key in a tmp dir (warden.signing), as the signer would.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integrations.hf_data import tiny_trainer

from warden.journal import CHECKPOINT_REJECTED, RUN_RESUMED, RUN_STARTED, JournalReader

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("accelerate") is None,
        reason="transformers.Trainer needs accelerate (pip install accelerate)",
    ),
]

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", 10))


def make_trainer(tiny, output_dir, callback, max_steps):
    return tiny_trainer(tiny, output_dir, [callback], max_steps)[0]


def read_events(run_dir):
    return [e for e, _ in JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """``<base>/out`` with checkpoint-1 and -2 (unsigned) and ``<base>/run`` with the journal."""
    from trainer.integrations.hf import WardenCallback

    base = tmp_path_factory.mktemp("hf-trained")
    make_trainer(tiny, base / "out", WardenCallback(run_dir=str(base / "run")), max_steps=2).train()
    return base


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from warden.signing import generate_keypair

    directory = tmp_path_factory.mktemp("keys")
    generate_keypair(directory)
    return directory / "signing.key", directory / "signing.pub"


def signed_copy(trained, keys, dest: Path, run_ids: dict[int, str] | None = None) -> tuple[Path, Path, str]:
    """A copy of the trained run with its checkpoints signed (for the journal's run id unless
    ``run_ids`` names another one per step): (output dir, run dir, run id)."""
    from warden.runid import journal_run_id
    from warden.signing import Provenance, load_private_key, sign_checkpoint

    shutil.copytree(trained, dest)
    out, run = dest / "out", dest / "run"
    run_id = journal_run_id(str(run / "events.jsonl"))
    assert run_id
    key = load_private_key(keys[0])
    for step in (1, 2):
        signed_for = (run_ids or {}).get(step, run_id)
        sign_checkpoint(out / f"checkpoint-{step}", key, Provenance(run_id=signed_for, step=step))
    return out, run, run_id


def checkpoint_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob("*") if p.is_file())


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_good_signed_checkpoint_is_returned_resumed_and_journalled(tiny, trained, keys, tmp_path):
    from trainer.integrations.hf import WardenCallback
    from trainer.integrations.hf_resume import warden_resume_checkpoint

    out, run, run_id = signed_copy(trained, keys, tmp_path / "r")
    path = warden_resume_checkpoint(str(out), trusted_keys=str(keys[1]), run_dir=str(run))
    assert path == str(out / "checkpoint-2")
    trainer = make_trainer(tiny, out, WardenCallback(run_dir=str(run), trusted_keys=str(keys[1])), max_steps=3)
    trainer.train(resume_from_checkpoint=path)
    assert trainer.state.global_step == 3 and (out / "checkpoint-3").is_dir()
    events = read_events(run)
    (resumed,) = [e for e in events if e.type == RUN_RESUMED]
    assert resumed.run_id == run_id  # a resumed run keeps its id
    assert resumed.data["from_step"] == 2 and resumed.data["checkpoint"] == path
    assert resumed.data["verification"].startswith("signature verified") and resumed.data["verified"] is True
    assert not [e for e in events if e.type == CHECKPOINT_REJECTED]
    assert {e.run_id for e in events} == {run_id}


def test_no_checkpoint_is_a_fresh_start(tmp_path, keys):
    from trainer.integrations.hf_resume import warden_resume_checkpoint

    assert warden_resume_checkpoint(str(tmp_path / "out"), trusted_keys=str(keys[1]), run_dir=str(tmp_path)) is None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_flipped_byte_in_any_file_is_skipped_for_the_older_good_one(trained, keys, data):
    from trainer.integrations.hf_resume import warden_resume_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        out, run, _ = signed_copy(trained, keys, Path(tmp) / "r")
        files = checkpoint_files(out / "checkpoint-2")
        target = data.draw(st.sampled_from(files), label="file")
        position = data.draw(st.integers(0, target.stat().st_size - 1), label="position")
        flip(target, position)
        path = warden_resume_checkpoint(str(out), trusted_keys=str(keys[1]), run_dir=str(run))
        assert path == str(out / "checkpoint-1")
        (rejected,) = [e for e in read_events(run) if e.type == CHECKPOINT_REJECTED]
        assert rejected.data["path"] == str(out / "checkpoint-2") and rejected.step == 2
        assert target.name in rejected.data["why"]


def test_a_missing_sig_and_a_sig_of_another_run_are_refused_naming_both(trained, keys, tmp_path):
    from trainer.integrations.hf_resume import HFResumeRefused, warden_resume_checkpoint

    out, run, run_id = signed_copy(trained, keys, tmp_path / "r", run_ids={1: "another-run"})
    (out / "checkpoint-2.sig").unlink()
    with pytest.raises(HFResumeRefused) as refused:
        warden_resume_checkpoint(str(out), trusted_keys=str(keys[1]), run_dir=str(run))
    assert refused.value.paths == (str(out / "checkpoint-2"), str(out / "checkpoint-1"))
    assert str(out / "checkpoint-2") in str(refused.value) and str(out / "checkpoint-1") in str(refused.value)
    rejected = [e for e in read_events(run) if e.type == CHECKPOINT_REJECTED]
    assert [(e.step, e.run_id) for e in rejected] == [(2, run_id), (1, run_id)]
    assert "checkpoint-2.sig: missing" in rejected[0].data["why"]
    assert "another-run" in rejected[1].data["why"]


def tamper_weights(checkpoint: Path, seed: int) -> None:
    """One byte flipped in the tensor data of model.safetensors (HF still loads it), at a seeded place."""
    weights = checkpoint / "model.safetensors"
    raw = weights.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    flip(weights, random.Random(seed).randrange(start, len(raw)))


def test_train_on_a_tampered_checkpoint_raises_before_any_step_unless_opted_out(tiny, trained, keys, tmp_path):
    from trainer.integrations.hf import WardenCallback
    from trainer.integrations.hf_resume import HFResumeRefused

    out, run, run_id = signed_copy(trained, keys, tmp_path / "r")
    tampered = out / "checkpoint-2"
    tamper_weights(tampered, seed=int(os.environ.get("WARDEN_TAMPER_SEED", 7)))
    trainer = make_trainer(tiny, out, WardenCallback(run_dir=str(run), trusted_keys=str(keys[1])), max_steps=3)
    with pytest.raises(HFResumeRefused) as refused:
        trainer.train(resume_from_checkpoint=str(tampered))
    assert str(tampered) in str(refused.value) and "model.safetensors" in str(refused.value)
    assert refused.value.paths == (str(tampered),)
    assert trainer.state.global_step == 2 and not (out / "checkpoint-3").exists()  # no optimizer step
    events = read_events(run)
    assert not [e for e in events if e.type == RUN_RESUMED]
    (rejected,) = [e for e in events if e.type == CHECKPOINT_REJECTED]
    assert rejected.data["path"] == str(tampered) and rejected.run_id == run_id

    # resume_from_checkpoint=True resolves to the same tampered directory: refused too
    again = make_trainer(tiny, out, WardenCallback(run_dir=str(run), trusted_keys=str(keys[1])), max_steps=3)
    with pytest.raises(HFResumeRefused):
        again.train(resume_from_checkpoint=True)
    # no trusted keys at all: refused, not resumed unverified
    with pytest.raises(HFResumeRefused, match="no trusted_keys"):
        make_trainer(tiny, out, WardenCallback(run_dir=str(run)), max_steps=3).train(resume_from_checkpoint=True)
    assert not (out / "checkpoint-3").exists()

    opted_out = make_trainer(tiny, out, WardenCallback(run_dir=str(run), verify_resume=False), max_steps=3)
    opted_out.train(resume_from_checkpoint=str(tampered))
    assert opted_out.state.global_step == 3 and (out / "checkpoint-3").is_dir()
    (resumed,) = [e for e in read_events(run) if e.type == RUN_RESUMED]
    assert resumed.data["verification"] == "skipped: verify_resume=False" and resumed.data["verified"] is False
    assert resumed.data["checkpoint"] == str(tampered) and resumed.run_id == run_id


def test_runs_whose_run_dirs_share_a_name_or_a_parent_get_different_ids(tmp_path, monkeypatch):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.integrations.hf import WardenCallback
    from warden.runid import sanitize_run_id

    monkeypatch.delenv("WARDEN_RUN_ID", raising=False)
    monkeypatch.delenv("WARDEN_RUN_DIR", raising=False)
    ids = []
    for run_dir in (tmp_path / "x" / "run", tmp_path / "y" / "run", tmp_path / "p" / "a", tmp_path / "p" / "b"):
        args = TrainingArguments(output_dir=str(run_dir / "out"), report_to=[], use_cpu=True)
        callback = WardenCallback(run_dir=str(run_dir))
        callback.on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl())
        callback.close()
        (started,) = read_events(run_dir)
        assert started.type == RUN_STARTED and sanitize_run_id(started.run_id) == started.run_id
        assert started.run_id.startswith(run_dir.name + "-")
        ids.append(started.run_id)
        # the same run directory again (a restart): the journal's id is kept
        again = WardenCallback(run_dir=str(run_dir))
        again.on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl())
        again.close()
        assert {e.run_id for e in read_events(run_dir)} == {started.run_id}
    assert len(set(ids)) == 4


def test_the_checkpoint_checked_is_the_one_hf_loaded_not_the_output_dirs_of_that_step(tiny, trained, keys, tmp_path):
    """A tampered copy elsewhere, while the output dir holds a good checkpoint of the same step: the
    callback checks the directory HF was given (found in Trainer._inner_training_loop), not a guess."""
    from trainer.integrations.hf import WardenCallback
    from trainer.integrations.hf_resume import HFResumeRefused

    out, run, _ = signed_copy(trained, keys, tmp_path / "r")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(out / "checkpoint-2", elsewhere / "checkpoint-2")
    shutil.copy(out / "checkpoint-2.sig", elsewhere / "checkpoint-2.sig")
    tamper_weights(elsewhere / "checkpoint-2", seed=3)
    trainer = make_trainer(tiny, out, WardenCallback(run_dir=str(run), trusted_keys=str(keys[1])), max_steps=3)
    with pytest.raises(HFResumeRefused) as refused:
        trainer.train(resume_from_checkpoint=str(elsewhere / "checkpoint-2"))
    assert refused.value.paths == (str(elsewhere / "checkpoint-2"),)
    assert not (out / "checkpoint-3").exists()
