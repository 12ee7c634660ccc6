"""The bridge over what verl 0.9.1's own code writes (tests/integrations/verl_real.py: its file
logger, rollout dump, ``_save_checkpoint`` and FSDP checkpoint manager with retention, on CPU),
with the real signer and archiver sidecars (``--once``) and the ``model_signing`` CLI.

Six steps, a save every 2, ``max_actor_ckpt_to_keep`` 2: verl's manager removes
``global_step_2/actor`` when it saves step 6. The bridge reports each checkpoint once, each step's
dump as a snapshot (top 3 by score) and each log line as a step; the signer signs what the
bridge reports, OpenSSF ``model_signing`` verifies it, verl's retention is counted as pruning,
never a violation; the archiver archives the snapshots and ``audit verify-run`` walks the chain.
Then verl restarts and resumes (its ``_load_checkpoint``) from a tampered ``global_step_6``: verl
loads it; the bridge reports ``run.resumed`` and the signer's check of it fails (it pages).
The same run as tests/integrations/test_integ_verl_e2e.py's FSDP experiment, written by verl.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import yaml
from support import IN_CI, run_warden

from tests.integrations.conftest import rollout_rows, top_indices, verl_metrics
from tests.warden.signing.signing_helpers import run_model_signing
from warden.journal import (
    CHECKPOINT_SAVED,
    REWARD_SNAPSHOT,
    RUN_RESUMED,
    RUN_STARTED,
    STEP_COMPLETED,
    JournalReader,
)

PROJECT, EXPERIMENT = "gsm8k_grpo", "tiny-llama-fsdp"
STEPS, SAVE_FREQ, KEEP, TOP_K = 6, 2, 2, 3


def _have(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not IN_CI and not all(_have(m) for m in ("verl", "ray", "tensordict")),  # CI (make venv) has them
        reason="verl 0.9.1 is not installed (pip install --no-deps verl==0.9.1 tensordict==0.10.0 "
        "pyvers==0.1.0 lazy-importer==0.1.0 after the test extra, as policies/locks/dev-nodeps.in)",
    ),
]


@pytest.fixture(scope="module")
def gloo():
    import torch.distributed as dist
    from integrations.verl_real import process_group

    made = process_group()
    yield
    if made:
        dist.destroy_process_group()


def bridge_once(run_dir, verl):
    done = run_warden(
        "bridge", "verl", "--run-dir", str(run_dir), "--verl-log", str(verl.log_path),
        "--rollout-dir", str(verl.rollout_data_dir), "--checkpoint-root", str(verl.default_local_dir),
        "--once", "--stable-seconds", "0", "--top-k", str(TOP_K),
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done


def sidecar_once(name, run_dir, policy):
    done = run_warden("sidecar", "run", name, "--once", "--run-dir", str(run_dir), "--policy", policy, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def read_events(run_dir):
    return [e for e, _ in JournalReader(str(run_dir / "events.jsonl")).read_available()]


def test_verl_s_own_writers_bridged_signed_pruned_and_archived(tiny, tmp_path, gloo, signing_keys):
    from integrations.verl_real import RealVerl

    from warden.signing import load_trusted_keys, read_signed_statement, verify_checkpoint

    pub = str(signing_keys.pub)
    signer = tmp_path / "signer.yaml"
    signer.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "signing_key": str(signing_keys.key),
                "check_interval_seconds": 0.05,
                "rescan_seconds": 60,
                "stable_seconds": 0,
                "reverify_interval_seconds": 0.05,
            }
        )
    )
    store = tmp_path / "store"
    store.mkdir()
    archiver = tmp_path / "archiver.yaml"
    archiver.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "store": store.as_uri(),
                "signing_key": str(signing_keys.key),
                "top_k": TOP_K,
                "retention": {"mode": "none", "days": 0, "require_object_lock": False},
                "upload_concurrency": 2,
                "check_interval_seconds": 0.1,
            }
        )
    )
    run_dir = tmp_path / "warden"
    signer_logs: list[str] = []
    verl = RealVerl(tiny, tmp_path / "verl", PROJECT, EXPERIMENT, keep=KEEP)
    try:
        assert verl.tracking.logger["file"].filepath == str(verl.log_path)
        for step in range(1, STEPS + 1):
            save = step % SAVE_FREQ == 0
            verl.step(step, rollout_rows(step), verl_metrics(step), save=save)
            if save:  # the bridge and the signer see each checkpoint while it is the latest
                assert verl.tracker.read_text() == str(step)
                bridge_once(run_dir, verl)
                signer_logs.append(sidecar_once("signer", run_dir, str(signer)).stderr)
    finally:
        verl.close()

    # what verl wrote: its FSDP layout, and retention removed global_step_2's actor only
    six = verl.step_dir(6) / "actor"
    assert {p.name for p in six.iterdir()} >= {
        "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json", "huggingface",
    }  # fmt: skip
    assert not (verl.step_dir(2) / "actor").exists() and (verl.step_dir(2) / "data.pt").exists()
    first = json.loads(verl.log_path.read_bytes().splitlines()[0])
    assert first["step"] == 1 and first["data"]["critic/vf_explained_var"] is None  # orjson: NaN as null
    assert math.isnan(verl_metrics(1)["critic/vf_explained_var"])

    bridge_once(run_dir, verl)
    events = read_events(run_dir)
    run_id = events[0].run_id
    assert (
        events[0].type == RUN_STARTED and run_id.startswith(EXPERIMENT + "-") and {e.run_id for e in events} == {run_id}
    )
    assert [e.step for e in events if e.type == CHECKPOINT_SAVED] == [2, 4, 6]  # each reported once
    steps = [e for e in events if e.type == STEP_COMPLETED]
    assert [e.step for e in steps] == list(range(1, STEPS + 1))
    assert steps[2].data["reward_mean"] == pytest.approx(verl_metrics(3)["critic/score/mean"])
    snaps = {e.step: e for e in events if e.type == REWARD_SNAPSHOT}
    assert sorted(snaps) == list(range(1, STEPS + 1))
    for step, event in snaps.items():
        rows = verl.dumps[step]
        assert [s["index"] for s in event.data["samples"]] == top_indices(rows, TOP_K)
        assert [s["response"] for s in event.data["samples"]] == [rows[i]["output"] for i in top_indices(rows, TOP_K)]

    # the signer: 4 and 6 verify (Warden and model_signing); 2, pruned by verl, counted as pruning
    signer_logs.append(sidecar_once("signer", run_dir, str(signer)).stderr)
    logs = "".join(signer_logs)
    pruned = "pruned by retention, not tampered with: actor/ removed as a whole"
    assert [pruned in log for log in signer_logs] == [False, False, True, True], logs[-3000:]  # from step 6's save on
    assert '"level": "error"' not in logs, logs[-3000:]
    trusted = load_trusted_keys(pub)
    for step in (4, 6):
        checkpoint = verl.step_dir(step)
        assert verify_checkpoint(str(checkpoint), trusted).ok
        checked = run_model_signing(
            ["verify", "key", str(checkpoint), "--signature", f"{checkpoint}.sig", "--public_key", pub]
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not verify_checkpoint(str(verl.step_dir(2)), trusted).ok
    statements = {step: read_signed_statement(f"{verl.step_dir(step)}.sig", trusted)[1] for step in (2, 4, 6)}
    assert statements[2].provenance.parent_root_digest is None
    for step in (4, 6):  # the signed chain: each names the one saved before it
        assert statements[step].provenance.parent_root_digest == statements[step - 2].subject_digest
        assert (statements[step].provenance.run_id, statements[step].provenance.step) == (run_id, step)

    # the archiver: every snapshot, the chain intact, the top 3 of verl's dump
    sidecar_once("archiver", run_dir, str(archiver))
    walk = run_warden("audit", "verify-run", "--run", run_id, "--store", store.as_uri(), "--trust", pub)
    assert walk.returncode == 0, walk.stdout + walk.stderr
    audit = run_warden(
        "audit", "snapshot", "--run", run_id, "--step", str(STEPS), "--store", store.as_uri(), "--trust", pub,
        "--format", "json",
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    record = json.loads(audit.stdout)["record"]
    assert [s["response"] for s in record["samples"]] == [verl.dumps[STEPS][i]["output"] for i in top_indices(
        verl.dumps[STEPS], TOP_K
    )]  # fmt: skip

    # -- verl restarts and resumes from a tampered global_step_6: verl loads it (it checks nothing);
    # the bridge reports the resume, and the signer verifies the checkpoint it names and pages --------
    weights = verl.step_dir(6) / "actor" / "model_world_size_1_rank_0.pt"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    weights.write_bytes(bytes(raw))
    assert run_warden("checkpoint", "verify", str(verl.step_dir(6)), "--trust", pub).returncode == 1
    verl = RealVerl(tiny, tmp_path / "verl", PROJECT, EXPERIMENT, keep=KEEP)
    try:
        assert verl.restart() == 6  # the tracker's step, loaded by verl's own _load_checkpoint
        verl.tracking.log(data={"val-core/openai/gsm8k/reward/mean@1": 0.3}, step=6)  # val_before_train
        verl.step(7, rollout_rows(7), verl_metrics(7), save=False)
    finally:
        verl.close()
    bridge_once(run_dir, verl)
    (resumed,) = [e for e in read_events(run_dir) if e.type == RUN_RESUMED]
    assert (resumed.data["from_step"], resumed.data["checkpoint"]) == (6, str(verl.step_dir(6)))
    done = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", str(signer))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    failed = [
        json.loads(line)
        for line in done.stderr.splitlines()
        if '"trigger": "run.resumed"' in line and '"level": "error"' in line
    ]
    # (logged again by each re-verification in the pass: the same checkpoint, the same reason)
    assert failed and {(f["path"], f["reason"], f["resumed_step"]) for f in failed} == {
        (str(verl.step_dir(6)), "files_mismatch", 6)
    }, done.stderr[-3000:]
