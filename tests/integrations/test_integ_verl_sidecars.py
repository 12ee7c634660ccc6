"""The bridge's journal drives the real signer and archiver sidecars (``--once``)."""

from __future__ import annotations

import json
import shutil

from support import run_warden

from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT


def bridge_once(run_dir, verl_run, *extra):
    done = run_warden(
        "bridge",
        "verl",
        "--run-dir",
        str(run_dir),
        "--verl-log",
        str(verl_run.log_path),
        "--rollout-dir",
        str(verl_run.rollout_dir),
        "--checkpoint-root",
        str(verl_run.ckpt_root),
        "--once",
        "--stable-seconds",
        "0",
        "--top-k",
        "3",
        *extra,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def sidecar_once(name, run_dir, policy):
    done = run_warden("sidecar", "run", name, "--once", "--run-dir", str(run_dir), "--policy", policy, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_the_signer_signs_exactly_the_completed_checkpoints(run_dir, verl_run, signer_policy, signing_keys, verl_kit):
    from warden.signing import load_trusted_keys, verify_checkpoint

    verl_run.start()
    for step in range(1, 7):
        verl_run.train_step(step, save=step % 2 == 0)
        if step in (2, 4):
            bridge_once(run_dir, verl_run)  # the bridge sees each step while it is the latest
    verl_run.save_checkpoint(8, tracker=False)  # written, but verl died before the tracker write
    verl_run.save_checkpoint(10, only_actor=True)  # died half-way through the save
    bridge_once(run_dir, verl_run)
    saved = verl_kit.of_type(verl_kit.read_journal(run_dir), CHECKPOINT_SAVED)
    assert [e.step for e in saved] == [2, 4, 6]

    # retention (max_actor_ckpt_to_keep=2) deletes global_step_2 before the signer gets to it
    shutil.rmtree(verl_run.step_dir(2))
    done = sidecar_once("signer", run_dir, signer_policy)
    assert done.returncode == 0, done.stderr
    signed = sorted(p.name for p in verl_run.ckpt_root.glob("*.sig"))
    assert signed == ["global_step_4.sig", "global_step_6.sig"]
    trusted = load_trusted_keys(str(signing_keys.pub))
    for step in (4, 6):
        assert verify_checkpoint(str(verl_run.step_dir(step)), trusted).ok
    verify = run_warden(
        "checkpoint", "verify", str(verl_run.step_dir(6)), "--trust", str(signing_keys.pub), "--format", "json"
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "checkpoint_vanished" in done.stderr  # counted and logged, not fatal


def test_the_archiver_archives_the_top_k(run_dir, verl_run, archiver_setup, signing_keys, verl_kit):
    policy, store = archiver_setup
    verl_run.start()
    for step in range(1, 5):
        verl_run.train_step(step, save=step == 2)
    verl_run.partial_dump(5)
    bridge_once(run_dir, verl_run)
    done = sidecar_once("archiver", run_dir, policy)
    assert done.returncode == 0, done.stdout + done.stderr
    events = verl_kit.read_journal(run_dir)
    run_id = events[0].run_id
    assert [e.step for e in verl_kit.of_type(events, REWARD_SNAPSHOT)] == [1, 2, 3, 4]
    for step in (1, 4):
        audit = run_warden(
            "audit",
            "snapshot",
            "--run",
            run_id,
            "--step",
            str(step),
            "--store",
            store.as_uri(),
            "--trust",
            str(signing_keys.pub),
            "--format",
            "json",
        )
        assert audit.returncode == 0, audit.stdout + audit.stderr
        record = json.loads(audit.stdout)["record"]
        rows = verl_run.dumps[step]
        assert [s["index"] for s in record["samples"]] == verl_kit.top_indices(rows, 3)
        assert [s["response"] for s in record["samples"]] == [rows[i]["output"] for i in verl_kit.top_indices(rows, 3)]
    missing = run_warden(
        "audit", "snapshot", "--run", run_id, "--step", "5", "--store", store.as_uri(), "--trust", str(signing_keys.pub)
    )
    assert missing.returncode != 0  # the partial dump of step 5 was not archived
    trust = str(signing_keys.pub)
    walk = run_warden("audit", "verify-run", "--run", run_id, "--store", store.as_uri(), "--trust", trust)
    assert walk.returncode == 0, walk.stdout + walk.stderr
