"""torchrun with 2 CPU processes (gloo) matches a 1-process run with the same global batch.

Each rank generates and scores its half of the rollout (the shares are gathered); sampling is
seeded per step and row, so the first step's metrics match one process's within 1e-5.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from support import ROOT

from warden import journal as ev


def _run(cmd, env=None):
    result = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_torchrun_two_processes_match_one(make_config, tmp_path):
    _, config = make_config({"max_steps": 2, "checkpoint": {"every_steps": 1}})
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "sidecars.cli", "train", "--config", config, "--run-dir", str(one)])
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "sidecars.cli",
            "train",
            "--config",
            config,
            "--run-dir",
            str(two),
        ]
    )
    first = {}
    for name in ("one", "two"):
        steps = [e for e, _ in ev.JournalReader(str(tmp_path / name / "events.jsonl")).read_available()]
        first[name] = next(e.data for e in steps if e.type == ev.STEP_COMPLETED and e.step == 1)
    keys = (
        "reward_mean",
        "kl",
        "policy_loss",
        "value_loss",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "response_length/mean",
        "response_tokens",
    )
    for key in keys:  # each rank generated and scored half the batch; the gathered step matches one process
        assert abs(first["one"][key] - first["two"][key]) < 1e-5, (key, first["one"][key], first["two"][key])
    # Weights after the first update: AdamW moves an element by about lr (3e-3) whatever its gradient's
    # size, so the summation order of the all-reduce shows where a gradient is near AdamW's eps; a
    # wrong row, share or normalisation would move elements by a whole lr.
    a = load_file(str(one / "checkpoints" / "step-000000001" / "actor" / "model.safetensors"))
    b = load_file(str(two / "checkpoints" / "step-000000001" / "actor" / "model.safetensors"))
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-4, worst
    events = [e for e, _ in ev.JournalReader(str(two / "events.jsonl")).read_available()]
    kinds = [e.type for e in events]
    assert kinds.count(ev.RUN_STARTED) == 1 and kinds.count(ev.STEP_COMPLETED) == 2
    assert events[kinds.index(ev.RUN_STARTED)].data["world_size"] == 2
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # one writer only
    assert sorted(os.listdir(two / "checkpoints")) == ["step-000000001", "step-000000002"]
