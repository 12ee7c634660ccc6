"""WardenCallback under torchrun (2 gloo processes on CPU) with a rank that writes its
``rng_state_1.pth`` late: the announcement covers every rank's files and the signer signs
checkpoints that verify, instead of a checkpoint that turns INVALID when the late file lands.
Then verified resume under torchrun: a tampered checkpoint (in a copy of the run) refused on
every rank before the first step; the good one, picked by ``warden_resume_checkpoint`` on each
rank, resumed, verified by the signer on ``run.resumed``, and the signed chain continuing."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from integrations.hf_data import flip_weight_byte
from support import ROOT, free_port, run_warden

from tests.warden.signing.signing_helpers import run_model_signing
from warden.journal import CHECKPOINT_REJECTED, CHECKPOINT_SAVED, RUN_RESUMED, JournalReader

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="transformers.Trainer needs accelerate"),
]
DELAY_SECONDS = 4.0


def torchrun(tiny, output_dir, run_dir, delay, *extra):
    """The worker under ``torchrun --nproc_per_node 2`` (gloo, CPU): the finished process."""
    worker = os.path.join(os.path.dirname(__file__), "hf_torchrun_worker.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), worker,
        tiny.tokenizer_dir, tiny.model_dir, str(output_dir), str(run_dir), str(delay), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT, env=env)


@pytest.mark.slow
def test_rank_zero_announces_only_after_every_rank_wrote_its_files_and_resume_is_verified(
    tiny, tmp_path, signer_policy, signing_keys
):
    from warden.signing import load_trusted_keys, read_signed_statement
    from warden.signing.manifest import announce_tree

    output_dir, run_dir = tmp_path / "out", tmp_path / "run"
    done = torchrun(tiny, output_dir, run_dir, DELAY_SECONDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    events = [e for e, _ in JournalReader(str(run_dir / "events.jsonl")).read_available()]
    saved = [e for e in events if e.type == CHECKPOINT_SAVED]
    assert [e.step for e in saved] == [1, 2]
    for event in saved:
        path = event.data["path"]
        late = os.path.join(path, "rng_state_1.pth")
        # announced after rank 1's late file landed, and the digest covers it and every other file
        announced_at = datetime.datetime.fromisoformat(event.time.replace("Z", "+00:00")).timestamp()
        assert os.stat(late).st_mtime <= announced_at, (path, os.stat(late).st_mtime, event.time)
        on_disk = announce_tree(path)
        assert (event.data["root_digest"], event.data["file_count"]) == (on_disk.root_digest, on_disk.file_count)
        assert "complete" not in event.data and event.data["world_size"] == 2
        assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(os.listdir(path))

    signer = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signer.returncode == 0, signer.stderr
    for step in (1, 2):
        verify = run_warden(
            "checkpoint", "verify", str(output_dir / f"checkpoint-{step}"), "--trust", str(signing_keys.pub)
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr

    # -- a tampered checkpoint (in a copy of the run): every rank refuses it before the first step ----
    trust = str(signing_keys.pub)
    copy = tmp_path / "copy"
    shutil.copytree(output_dir, copy / "out", symlinks=True)
    shutil.copytree(run_dir, copy / "run", symlinks=True, ignore=shutil.ignore_patterns("state"))
    tampered = copy / "out" / "checkpoint-2"
    flip_weight_byte(tampered)
    refused = torchrun(tiny, copy / "out", copy / "run", 0, "4", str(tampered), trust)
    assert refused.returncode != 0, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert refused.stderr.count("HFResumeRefused") >= 2, refused.stderr[-3000:]  # raised on both ranks
    assert "model.safetensors" in refused.stderr and str(tampered) in refused.stderr
    assert not (copy / "out" / "checkpoint-3").exists()
    copied = [e for e, _ in JournalReader(str(copy / "run" / "events.jsonl")).read_available()]
    assert not [e for e in copied if e.type == RUN_RESUMED]
    (rejected,) = [e for e in copied if e.type == CHECKPOINT_REJECTED]  # journalled once, by rank 0
    assert rejected.data["path"] == str(tampered) and rejected.run_id == "hf-ddp"

    # -- the good one: every rank picks it, the run resumes and the signed chain continues -----------
    resumed_run = torchrun(tiny, output_dir, run_dir, 0, "4", "verified", trust)
    assert resumed_run.returncode == 0, resumed_run.stdout[-3000:] + resumed_run.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: resuming from {output_dir / 'checkpoint-2'}" in resumed_run.stdout
    events = [e for e, _ in JournalReader(str(run_dir / "events.jsonl")).read_available()]
    (resumed,) = [e for e in events if e.type == RUN_RESUMED]
    assert (resumed.data["from_step"], resumed.data["checkpoint"]) == (2, str(output_dir / "checkpoint-2"))
    assert resumed.data["verified"] is True and resumed.data["verification"].startswith("signature verified")
    assert [e.step for e in events if e.type == CHECKPOINT_SAVED] == [1, 2, 3, 4]
    assert {e.run_id for e in events} == {"hf-ddp"}
    signer = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signer.returncode == 0, signer.stderr
    checks = [json.loads(line) for line in signer.stderr.splitlines() if '"trigger": "run.resumed"' in line]
    assert checks and all(line["level"] == "info" for line in checks), signer.stderr[-3000:]
    trusted = load_trusted_keys(trust)
    statements = {}
    for step in (1, 2, 3, 4):
        checkpoint = output_dir / f"checkpoint-{step}"
        checked = run_model_signing(
            ["verify", "key", str(checkpoint), "--signature", f"{checkpoint}.sig", "--public_key", trust]
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        statements[step] = read_signed_statement(f"{checkpoint}.sig", trusted)[1]
        assert (statements[step].provenance.run_id, statements[step].provenance.step) == ("hf-ddp", step)
    for step in (2, 3, 4):
        assert statements[step].provenance.parent_root_digest == statements[step - 1].subject_digest


def test_waiting_for_rank_files_gives_up_at_the_deadline_and_says_what_is_missing(tmp_path):
    from trainer.integrations.hf import rank_files, wait_until_complete

    assert rank_files(1, False) == [] and rank_files(4, True) == []
    expected = rank_files(2, False)
    assert expected == ["rng_state_0.pth", "rng_state_1.pth"]
    (tmp_path / "rng_state_0.pth").write_bytes(b"0")
    moments = iter(range(0, 1000))  # a fake clock: one second per look
    pauses: list[float] = []
    left = wait_until_complete(str(tmp_path), expected, 2.0, 5.0, 0.5, lambda: float(next(moments)), pauses.append)
    assert left == ["rng_state_1.pth"] and len(pauses) == 4  # looked at t=1..5, deadline 0+5
    (tmp_path / "rng_state_1.pth").write_bytes(b"1")
    moments = iter(range(0, 1000))
    assert (
        wait_until_complete(str(tmp_path), expected, 2.0, 5.0, 0.5, lambda: float(next(moments)), pauses.append) == []
    )
    assert wait_until_complete(str(tmp_path / "gone"), expected, 2.0, 5.0) == [f"{tmp_path / 'gone'} (gone)"]
