"""The signer as a real process on run.resumed: a run that resumes from a tampered signed checkpoint
pages at once (no periodic re-verification configured), across restarts, and a good one is counted."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from warden.journal import CHECKPOINT_SAVED
from warden.payloads import RunResumed

SIGNED = "warden_signer_signed_total"
CHECKS = "warden_signer_resumed_checks_total"
INVALID = "warden_signer_invalid_checkpoints"
FAILURES = "warden_signer_verify_failures_total"


def flip_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


def stop(svc) -> None:  # type: ignore[no-untyped-def]
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(10) == 0, svc.log()[-2000:]


def test_resuming_from_a_tampered_checkpoint_pages_at_once_and_after_restarts(signer_kit):
    kit = signer_kit
    hf_root = kit.tmp / "hf-out"
    hf = kit.write_hf(hf_root, 3)
    saved = {"source": "hf", "layout": "hf", "path": str(hf), "root": str(hf_root), **kit.announcement(hf)}
    kit.journal().emit(CHECKPOINT_SAVED, saved, step=3)  # as the HF callback announces it
    four = kit.save_checkpoint(4)
    policy = kit.policy(stable_seconds=60)  # reverify_interval_seconds: 0, no periodic pass would find it
    svc = kit.start(policy)
    svc.wait_for(SIGNED, lambda v: v == 1, layout="hf")
    svc.wait_for(SIGNED, lambda v: v == 1, layout="warden")

    # A good checkpoint's resume is verified and counted; nothing pages.
    kit.journal().emit("run.resumed", RunResumed(from_step=4, checkpoint=str(four)).to_data(), step=4)
    svc.wait_for(CHECKS, lambda v: v == 1, result="ok")
    assert svc.value(INVALID) == 0 and svc.value(CHECKS, result="failed") == 0
    assert svc.value("warden_signer_verifications_total", result="ok") == 1

    # One byte flipped (checkpoint verify says invalid), then the HF run resumes from it.
    flip_byte(hf / "model.safetensors")
    assert kit.cli_verify(hf).returncode == 1
    resumed = RunResumed(source="hf", from_step=3, checkpoint=str(hf), verification="not verified by the callback")
    kit.journal().emit("run.resumed", resumed.to_data(), step=3)
    svc.wait_for(INVALID, lambda v: v == 1)
    assert svc.value(CHECKS, result="failed") == 1
    assert svc.value(FAILURES, reason="files_mismatch") == 1
    lines = [json.loads(line) for line in svc.log().splitlines() if '"trigger": "run.resumed"' in line]
    [failed] = [line for line in lines if line["level"] == "error"]
    assert (failed["path"], failed["reason"], failed["resumed_run_id"], failed["resumed_step"]) == (
        str(hf), "files_mismatch", "run-sig", 3,
    )  # fmt: skip
    assert "the resumed checkpoint of run 'run-sig' at step 3" in failed["msg"]

    # A restart: the event is not handled again, and the page is back before any check.
    stop(svc)
    again = kit.start(policy)
    again.wait_for(INVALID, lambda v: v == 1)
    again.checked_after(0.1)  # the first check verified it again: still invalid
    assert again.value(INVALID) == 1 and again.value(FAILURES, reason="files_mismatch") == 1
    assert again.value(CHECKS, result="failed") == 0

    # The signer is down while a run resumes from another tampered checkpoint: handled on the next start.
    stop(again)
    flip_byte(four / "actor" / "model.safetensors")
    kit.journal().emit("run.resumed", RunResumed(from_step=4, checkpoint=str(four)).to_data(), step=4)
    third = kit.start(policy)
    third.wait_for(CHECKS, lambda v: v == 1, result="failed")
    third.wait_for(INVALID, lambda v: v == 2)
    assert "Traceback" not in third.log()


def test_hostile_resumed_paths_are_refused_or_violations_in_the_process(signer_kit):
    kit = signer_kit
    four = kit.save_checkpoint(4)
    os.symlink(four, kit.checkpoints / "step-000000006")
    os.mkfifo(kit.checkpoints / "step-000000008")
    svc = kit.start(kit.policy(stable_seconds=60))
    svc.wait_for(SIGNED, lambda v: v == 1, layout="warden")
    for raw in (str(kit.checkpoints / "step-000000006"), str(kit.checkpoints / "step-000000008")):
        kit.journal().emit("run.resumed", {"from_step": 6, "checkpoint": raw}, step=6)
    for raw in (str(four) + '\n{"level": "info"}', "/etc/checkpoint-4", 7):
        kit.journal().emit("run.resumed", {"from_step": 4, "checkpoint": raw}, step=4)
    svc.wait_for(CHECKS, lambda v: v == 3, result="refused")
    svc.wait_for(INVALID, lambda v: v == 2)
    assert svc.value(FAILURES, reason="unsafe_path") == 2
    assert svc.value("warden_sidecar_events_processed_total", sidecar="signer") == 6
    assert "Traceback" not in svc.log() and svc.proc.poll() is None
