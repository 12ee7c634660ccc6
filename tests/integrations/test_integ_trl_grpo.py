"""TRL's ``GRPOTrainer`` end to end with WardenCallback, the real signer and archiver sidecars
(SeaweedFS S3) and the OpenSSF ``model_signing`` CLI, offline on the tiny Llama (CPU).

One run of 2 GRPO steps (a checkpoint per step), then: every checkpoint signed and verified by
``model_signing``, the snapshots TRL scored archived and ``audit verify-run`` intact, the trainer
metrics scraped from the callback's ``/metrics``; a resume from a tampered checkpoint (a copy of
the run) refused before any step; the resume from the good one accepted, the signed chain and the
audit chain continuing over steps 3 and 4.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import time

import pytest
from integrations.hf_data import flip_weight_byte
from integrations.trl_support import import_trl
from support import IN_CI, free_port, run_warden, scrape

from tests.warden.archive.conftest import seaweed
from tests.warden.signing.signing_helpers import run_model_signing
from warden.journal import (
    CHECKPOINT_REJECTED,
    CHECKPOINT_SAVED,
    REWARD_SNAPSHOT,
    RUN_RESUMED,
    RUN_STARTED,
    STEP_COMPLETED,
    JournalReader,
)
from warden.payloads import RewardSnapshot

__all__ = ["seaweed"]  # the session's SeaweedFS (tests/warden/archive/conftest.py)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(  # CI (make venv, the development lock) has them: there a missing one fails
        not IN_CI and importlib.util.find_spec("trl") is None, reason="trl is not installed (the test extra pins it)"
    ),
]
NUM_GENERATIONS = 4
TOP_K = 3


class Scores:
    """Two TRL reward functions (deterministic: by completion length and content) and what they returned."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str], list[float | None], list[float]]] = []

    def length(self, prompts, completions, completion_ids, trainer_state, **kwargs):
        rewards = [float(len(ids) % 5) / 4 for ids in completion_ids]
        rewards = [r + 0.01 * (sum(ids) % 7) for r, ids in zip(rewards, completion_ids, strict=True)]
        self.calls.append((list(prompts), list(completions), rewards, []))
        return rewards

    def vowels(self, prompts, completions, **kwargs):
        rewards = [None if i == 1 else float(sum(c in "aeiou" for c in text)) for i, text in enumerate(completions)]
        self.calls[-1][3].extend(math.nan if r is None else r for r in rewards)
        return rewards


def weighted(call, weights):
    """The reward TRL combines from the two functions: the weighted sum of the finite ones."""
    _, _, length, vowels = call
    return [weights[0] * a + (0.0 if math.isnan(b) else weights[1] * b) for a, b in zip(length, vowels, strict=True)]


def grpo_trainer(tiny, output_dir, callback, scores, max_steps, extra_callbacks=()):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trl = import_trl()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny.model_dir, local_files_only=True)
    prompts = Dataset.from_dict({"prompt": [f"what is {i} plus {i + 1}?" for i in range(16)]})
    args = trl.GRPOConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS,
        max_completion_length=8,
        reward_weights=[1.0, 0.5],
        beta=0.05,  # a reference model, so TRL logs a KL
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    funcs = callback.reward_functions([scores.length, scores.vowels], weights=args.reward_weights)
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=prompts,
        processing_class=tokenizer,
        callbacks=[callback, *extra_callbacks],
    )


def read_events(run_dir):
    return [e for e, _ in JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def archiver_policy(tmp_path, seaweed, key):
    import yaml

    bucket = seaweed.make_bucket()
    store = f"s3://{bucket}/grpo?addressing_style=path"
    doc = {
        "version": 1,
        "store": store,
        "addressing_style": "path",
        "signing_key": str(key),
        "top_k": TOP_K,
        "retention": {"mode": "none", "days": 0, "require_object_lock": False},
        "upload_concurrency": 2,
        "request_timeout_seconds": 5,
        "check_interval_seconds": 0.1,
    }
    path = tmp_path / "archiver.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path), store


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_grpo_run_signed_archived_scraped_and_resumed_only_from_a_good_checkpoint(
    tiny, tmp_path, seaweed, signer_policy, signing_keys, monkeypatch
):
    from transformers import TrainerCallback

    from trainer.integrations.hf import WardenCallback
    from trainer.integrations.hf_resume import HFResumeRefused, warden_resume_checkpoint
    from warden.signing import load_trusted_keys, read_signed_statement

    for name in ("WARDEN_RUN_DIR", "WARDEN_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    s3 = seaweed.env()
    archiver, store = archiver_policy(tmp_path, seaweed, signing_keys.key)
    trust = str(signing_keys.pub)
    output_dir, run_dir = tmp_path / "out", tmp_path / "run"
    port = free_port()
    scrapes: dict[tuple[str, int], dict] = {}

    class Probe(TrainerCallback):  # after WardenCallback: what /metrics says at the same hook
        def on_step_end(self, args, state, control, **kwargs):
            scrapes[("step_end", state.global_step)] = scrape(port)

        def on_save(self, args, state, control, **kwargs):
            scrapes[("save", state.global_step)] = scrape(port)

    # -- the first run: 2 steps, a checkpoint each ----------------------------------------------
    scores = Scores()
    callback = WardenCallback(run_dir=str(run_dir), top_k=TOP_K, metrics_port=port, trusted_keys=trust)
    started = time.time()
    grpo_trainer(tiny, output_dir, callback, scores, max_steps=2, extra_callbacks=[Probe()]).train()
    events = read_events(run_dir)
    run_id = events[0].run_id
    assert events[0].type == RUN_STARTED and run_id.startswith("run-") and {e.run_id for e in events} == {run_id}
    assert events[0].data["versions"]["trl"] == import_trl().__version__

    # one reward.snapshot per step, from what TRL scored: the weighted sum of both functions
    snaps = [e for e in events if e.type == REWARD_SNAPSHOT]
    assert [e.step for e in snaps] == [1, 2] and len(scores.calls) == 2
    for event, call in zip(snaps, scores.calls, strict=True):
        combined = weighted(call, (1.0, 0.5))
        assert len(combined) == NUM_GENERATIONS
        payload = RewardSnapshot.from_data(event.data)
        assert payload.k == TOP_K and payload.source == "hf"
        order = sorted(range(len(combined)), key=lambda i: -combined[i])[:TOP_K]
        assert [s["index"] for s in payload.samples] == order
        for sample in payload.samples:
            i = sample["index"]
            assert (sample["prompt"], sample["response"]) == (call[0][i], call[1][i])
            assert sample["reward"] == pytest.approx(combined[i])

    # /metrics during training: Warden's trainer's names, this run's values
    logged = {e.step: e.data["hf_logs"] for e in events if e.type == STEP_COMPLETED}
    assert sorted(logged) == [1, 2]
    last = scrapes[("save", 2)]
    assert value(last, "warden_trainer_steps_total") == 2 and value(last, "warden_trainer_last_step") == 2
    assert value(last, "warden_trainer_last_checkpoint_step") == 2
    assert started <= value(last, "warden_trainer_last_checkpoint_timestamp_seconds") <= time.time()
    assert value(scrapes[("step_end", 2)], "warden_trainer_last_checkpoint_step") == 1
    second = weighted(scores.calls[1], (1.0, 0.5))
    assert value(last, "warden_trainer_reward_mean") == pytest.approx(sum(second) / len(second))
    assert value(last, "warden_trainer_reward_max") == pytest.approx(max(second))
    assert value(last, "warden_trainer_kl") == pytest.approx(logged[2]["kl"])
    assert value(last, "warden_trainer_grad_norm") == pytest.approx(logged[2]["grad_norm"])
    info = [dict(labels) for (name, labels), _ in last.items() if name == "warden_trainer_run_info"]
    assert [i["run_id"] for i in info] == [run_id] and info[0]["trl"] == import_trl().__version__

    # -- the signer signs both checkpoints; model_signing verifies them ----------------------------
    signed = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signed.returncode == 0, signed.stderr[-3000:]
    for step in (1, 2):
        checkpoint = output_dir / f"checkpoint-{step}"
        checked = run_model_signing(
            ["verify", "key", str(checkpoint), "--signature", f"{checkpoint}.sig", "--public_key", trust]
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

    # -- the archiver archives the snapshots; the audit chain verifies -----------------------------
    def archive_and_verify(steps):
        done = run_warden(
            "sidecar", "run", "archiver", "--once", "--run-dir", str(run_dir), "--policy", archiver, env=s3,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        listed = run_warden("audit", "list", "--run", run_id, "--store", store, "--format", "json", env=s3)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["steps"] == steps
        walk = run_warden(
            "audit", "verify-run", "--run", run_id, "--store", store, "--trust", trust, "--format", "json", env=s3
        )
        assert walk.returncode == 0, walk.stdout + walk.stderr
        report = json.loads(walk.stdout)
        assert report["ok"] and report["records_checked"] == len(steps) and report["head_step"] == steps[-1]

    archive_and_verify([1, 2])

    # -- a tampered checkpoint (in a copy of the run) is refused before any step -------------------
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "out", copy / "out", symlinks=True)
    shutil.copytree(run_dir, copy / "run", symlinks=True, ignore=shutil.ignore_patterns("state"))
    tampered = copy / "out" / "checkpoint-2"
    flip_weight_byte(tampered)
    verdict = run_warden("checkpoint", "verify", str(tampered), "--trust", trust)
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    refusing = grpo_trainer(
        tiny, copy / "out", WardenCallback(run_dir=str(copy / "run"), trusted_keys=trust), Scores(), max_steps=4
    )
    with pytest.raises(HFResumeRefused) as refused:
        refusing.train(resume_from_checkpoint=str(tampered))
    assert refused.value.paths == (str(tampered),) and "model.safetensors" in str(refused.value)
    assert refusing.state.global_step == 2 and not (copy / "out" / "checkpoint-3").exists()
    copied = read_events(copy / "run")
    assert not [e for e in copied if e.type == RUN_RESUMED]
    (rejected,) = [e for e in copied if e.type == CHECKPOINT_REJECTED]
    assert rejected.data["path"] == str(tampered) and rejected.run_id == run_id
    # the documented way picks the older good one instead
    assert warden_resume_checkpoint(str(copy / "out"), trusted_keys=trust, run_dir=str(copy / "run")) == str(
        copy / "out" / "checkpoint-1"
    )

    # -- the good one: resumed, verified, and both chains continue -----------------------------------
    path = warden_resume_checkpoint(str(output_dir), trusted_keys=trust, run_dir=str(run_dir))
    assert path == str(output_dir / "checkpoint-2")
    resumed_scores = Scores()
    callback = WardenCallback(run_dir=str(run_dir), top_k=TOP_K, metrics_port=port, trusted_keys=trust)
    resuming = grpo_trainer(tiny, output_dir, callback, resumed_scores, max_steps=4, extra_callbacks=[Probe()])
    resuming.train(resume_from_checkpoint=path)
    assert resuming.state.global_step == 4
    events = read_events(run_dir)
    assert {e.run_id for e in events} == {run_id}  # the resumed run keeps its id
    (resumed,) = [e for e in events if e.type == RUN_RESUMED]
    assert (resumed.data["from_step"], resumed.data["checkpoint"], resumed.data["verified"]) == (2, path, True)
    assert resumed.data["verification"].startswith("signature verified")
    assert [e.step for e in events if e.type == REWARD_SNAPSHOT] == [1, 2, 3, 4]
    assert [e.step for e in events if e.type == CHECKPOINT_SAVED] == [1, 2, 3, 4]
    assert value(scrapes[("save", 4)], "warden_trainer_last_checkpoint_step") == 4

    signed = run_warden("sidecar", "run", "signer", "--once", "--run-dir", str(run_dir), "--policy", signer_policy)
    assert signed.returncode == 0, signed.stderr[-3000:]
    resumed_checks = [json.loads(line) for line in signed.stderr.splitlines() if '"trigger": "run.resumed"' in line]
    assert resumed_checks and all(line["level"] == "info" for line in resumed_checks), signed.stderr[-3000:]
    trusted = load_trusted_keys(trust)
    subjects = {}
    for step in (1, 2, 3, 4):
        checkpoint = output_dir / f"checkpoint-{step}"
        checked = run_model_signing(
            ["verify", "key", str(checkpoint), "--signature", f"{checkpoint}.sig", "--public_key", trust]
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        statement = read_signed_statement(f"{checkpoint}.sig", trusted)[1]
        assert (statement.provenance.run_id, statement.provenance.step) == (run_id, step)
        subjects[step] = statement
    # the signed parent chain: step 3 (after the resume) names step 2, the checkpoint resumed from
    for step in (2, 3, 4):
        assert subjects[step].provenance.parent_root_digest == subjects[step - 1].subject_digest
    archive_and_verify([1, 2, 3, 4])
