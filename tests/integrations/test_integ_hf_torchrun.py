"""WardenCallback under torchrun (2 gloo processes on CPU) with a rank that writes its
``rng_state_1.pth`` late: the announcement covers every rank's files and the signer signs
checkpoints that verify, instead of a checkpoint that turns INVALID when the late file lands."""

from __future__ import annotations

import datetime
import importlib.util
import os
import subprocess
import sys

import pytest
from support import ROOT, free_port, run_warden

from warden.journal import CHECKPOINT_SAVED, JournalReader

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="transformers.Trainer needs accelerate"),
]
DELAY_SECONDS = 4.0


def test_rank_zero_announces_only_after_every_rank_wrote_its_files(tiny, tmp_path, signer_policy, signing_keys):
    from warden.signing.manifest import announce_tree

    output_dir, run_dir = tmp_path / "out", tmp_path / "run"
    worker = os.path.join(os.path.dirname(__file__), "hf_torchrun_worker.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), worker,
        tiny.tokenizer_dir, tiny.model_dir, str(output_dir), str(run_dir), str(DELAY_SECONDS),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT, env=env)
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
