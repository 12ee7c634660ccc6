"""WardenCallback in a real transformers.Trainer run on a tiny offline model (CPU), then the signer."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from integrations.hf_data import tiny_trainer
from support import ROOT, run_warden

from warden.journal import CHECKPOINT_PRUNED, CHECKPOINT_SAVED, RUN_FINISHED, RUN_RESUMED, RUN_STARTED, STEP_COMPLETED
from warden.ledger import read_ledger

# find_spec, not importorskip: collecting this file must not import transformers.
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("accelerate") is None,
        reason="transformers.Trainer needs accelerate (pip install accelerate)",
    ),
]


def make_trainer(tiny, output_dir, callback, max_steps):
    return tiny_trainer(tiny, output_dir, [callback], max_steps, save_total_limit=2)[0]


def read_events(run_dir):
    from warden.journal import JournalReader

    return [e for e, _ in JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def test_a_trainer_run_with_rotation_and_resume_gets_its_checkpoints_signed(
    tiny, tmp_path, signer_policy, signing_keys, monkeypatch
):
    import transformers

    from trainer.integrations import WardenCallback

    monkeypatch.delenv("WARDEN_RUN_DIR", raising=False)
    output_dir, run_dir = tmp_path / "out", tmp_path / "run"
    make_trainer(tiny, output_dir, WardenCallback(run_dir=str(run_dir), run_id="hf-tiny"), max_steps=4).train()
    events = read_events(run_dir)
    types = [e.type for e in events]
    assert types[0] == RUN_STARTED and types[-1] == RUN_FINISHED
    started = events[0].data
    assert started["source"] == "hf" and started["model_path"] == tiny.model_dir and len(started["config_digest"]) == 64
    assert started["versions"]["transformers"] == transformers.__version__
    steps = [e for e in events if e.type == STEP_COMPLETED]
    assert [e.step for e in steps] == [1, 2, 3, 4]
    assert all(math.isfinite(e.data["loss"]) and e.data["hf_logs"]["loss"] == e.data["loss"] for e in steps)
    assert steps[0].data["lr"] == steps[0].data["hf_logs"]["learning_rate"]
    saved = [e for e in events if e.type == CHECKPOINT_SAVED]
    assert [e.step for e in saved] == [1, 2, 3, 4]
    assert [e.data["path"] for e in saved] == [str(output_dir / f"checkpoint-{s}") for s in (1, 2, 3, 4)]
    finished = events[-1].data
    assert finished["status"] == "completed" and finished["last_step"] == 4 and "train_runtime" in finished["summary"]
    # save_total_limit=2 deleted checkpoint-1 and -2 before on_save: announced as pruned after the fact
    assert sorted(p.name for p in output_dir.iterdir() if p.is_dir()) == ["checkpoint-3", "checkpoint-4"]
    pruned = [e for e in events if e.type == CHECKPOINT_PRUNED]
    assert [(e.step, e.data["reason"]) for e in pruned] == [(1, "save_total_limit 2"), (2, "save_total_limit 2")]
    assert all(e.seq > next(s.seq for s in saved if s.step == e.step + 2) for e in pruned)
    assert read_ledger(str(run_dir / "events.jsonl"), "hf-tiny").live.keys() == {3, 4}
    signer = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signer.returncode == 0, signer.stderr
    assert sorted(p.name for p in output_dir.glob("*.sig")) == ["checkpoint-3.sig", "checkpoint-4.sig"]

    # resume for two more steps: run.resumed, then more checkpoints (rotation deletes 3 and 4, and their .sig stay)
    callback = WardenCallback(run_dir=str(run_dir), trusted_keys=str(signing_keys.pub))
    trainer = make_trainer(tiny, output_dir, callback, max_steps=6)
    trainer.train(resume_from_checkpoint=True)  # checkpoint-4, signed by the signer sidecar: verified
    events = read_events(run_dir)
    resumed = [e for e in events if e.type == RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].data["from_step"] == 4 and resumed[0].run_id == "hf-tiny"
    assert resumed[0].data["checkpoint"] == str(output_dir / "checkpoint-4")
    assert resumed[0].data["verification"].startswith("signature verified")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    signer = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signer.returncode == 0, signer.stderr
    for step in (5, 6):
        verify = run_warden(
            "checkpoint", "verify", str(output_dir / f"checkpoint-{step}"), "--trust", str(signing_keys.pub)
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_only_the_world_process_zero_writes_and_failures_do_not_stop_training(tmp_path, monkeypatch):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.integrations.hf import WardenCallback, step_payload

    monkeypatch.setenv("WARDEN_RUN_DIR", str(tmp_path / "env-run"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    callback = WardenCallback()
    other = TrainerState(is_world_process_zero=False, global_step=3)
    callback.on_log(args, other, TrainerControl(), logs={"loss": 1.0})
    callback.on_save(args, other, TrainerControl())
    assert not (tmp_path / "env-run").exists()
    zero = TrainerState(is_world_process_zero=True, global_step=3)
    callback.on_log(args, zero, TrainerControl(), logs={"loss": float("nan"), "eval_loss": 2.0, "rewards/acc/mean": 1})
    callback.on_save(args, zero, TrainerControl())  # checkpoint-3 is not there: nothing claimed
    callback.close()
    (event,) = read_events(tmp_path / "env-run")
    assert event.run_id.startswith("env-run-") and event.data["kind"] == "eval"
    assert event.data["hf_logs"]["loss"] is None and "loss" not in event.data
    assert event.data["rewards_acc_mean"] == 1.0
    assert step_payload({"reward": 0.5})["reward_mean"] == 0.5
    broken = WardenCallback(run_dir="/proc/warden-cannot-be-here")
    broken.on_log(args, zero, TrainerControl(), logs={"loss": 1.0})  # logged, not raised
    with pytest.raises(OSError):
        WardenCallback(run_dir="/proc/warden-cannot-be-here", strict=True).on_log(
            args, zero, TrainerControl(), logs={"loss": 1.0}
        )


def test_importing_trainer_integrations_is_light():
    code = "import sys, trainer.integrations; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == []
