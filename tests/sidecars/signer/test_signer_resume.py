"""A real trainer run signed by the sidecar; a tampered newest checkpoint makes resume fall back.

Imports the trainer (torch); the tiny offline model trains 4 steps on CPU in about a second.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import yaml
from support import TEST_CONFIG, merge

from sidecars import __version__
from warden import journal as ev

# The trainer (torch, transformers) is the `train` extra; without it these tests skip, never error.
pytest.importorskip("torch", reason="needs the train extra: pip install 'warden[train]'")

# The trainer tests' tiny config, with checkpoints every 2 steps.
CONFIG = merge(TEST_CONFIG, {"checkpoint": {"every_steps": 2, "keep_last": 3}, "max_steps": 4})


@pytest.fixture(scope="module")
def tiny_assets_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("signer-tiny-assets"))


def trainer_config(cache: str, where: str, checkpoint: dict[str, object]):  # type: ignore[no-untyped-def]
    from trainer.config import load_config

    raw = json.loads(json.dumps(CONFIG))
    raw["model"]["tiny"]["cache_dir"] = cache
    raw["checkpoint"].update(checkpoint)
    with open(where, "w", encoding="utf-8") as fh:
        yaml.safe_dump(raw, fh)
    return load_config(where)


def flip_last_byte(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))


def test_resume_falls_back_past_a_tampered_signed_checkpoint(signer_kit, tiny_assets_dir, tmp_path):
    from trainer.core import PPOTrainer

    kit = signer_kit
    run_dir = str(kit.run_dir)
    trainer = PPOTrainer(trainer_config(tiny_assets_dir, str(tmp_path / "a.yaml"), {}), run_dir)
    trainer.train(4)
    run_id = trainer.run_id
    trainer.close()
    done = kit.once(kit.policy(stable_seconds=60))
    assert done.returncode == 0, done.stderr
    two, four = kit.checkpoints / "step-000000002", kit.checkpoints / "step-000000004"
    assert kit.cli_verify(two).returncode == 0 and kit.cli_verify(four).returncode == 0
    newest = kit.statement(four)
    assert (newest.provenance.run_id, newest.provenance.step, newest.provenance.trainer_version) == (
        run_id,
        4,
        __version__,
    )
    assert newest.provenance.parent_root_digest == kit.statement(two).subject_digest

    flip_last_byte(str(four / "critic" / "critic.safetensors"))
    assert kit.cli_verify(four).returncode == 1
    trusted = {"trusted_keys": str(kit.trust_dir)}
    resumed = PPOTrainer(trainer_config(tiny_assets_dir, str(tmp_path / "b.yaml"), trusted), run_dir, resume="auto")
    resumed.close()
    assert resumed.step == 2
    events = [e for e, _ in ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME)).read_available()]
    rejected = [e for e in events if e.type == ev.CHECKPOINT_REJECTED]
    assert len(rejected) == 1 and rejected[0].data["path"] == str(four)
    why = rejected[0].data["why"]  # names the tampered file with its signed and its actual digest
    signed = kit.statement(four).manifest.digests()["critic/critic.safetensors"].hex()
    actual = hashlib.sha256((four / "critic" / "critic.safetensors").read_bytes()).hexdigest()
    assert "critic/critic.safetensors" in why and signed in why and actual in why
    resumed_event = [e for e in events if e.type == ev.RUN_RESUMED][-1]
    assert resumed_event.data["verification"].startswith("signature verified")
