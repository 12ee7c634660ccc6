"""End-to-end fault drills: inject a fault into the real stack, assert the page, remove the
fault, assert the resolve, and check that nothing was lost.

Each drill prints its measured fault-to-page time (`DRILL name: fault-to-page X s`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from drills import record
from faults import FaultFS, need
from support import ROOT, TEST_CONFIG, merge

pytestmark = pytest.mark.e2e


def tiny_config(drill, **extra) -> str:
    raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": os.path.join(drill.base, "assets")}}})
    raw = merge(raw, extra)
    path = os.path.join(drill.base, "train.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(raw, fh)
    return path


def train(config: str, run_dir: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sidecars.cli", "train", "--config", config, "--run-dir", run_dir, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def journal(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def test_drill_1_hung_path_pages_within_3_seconds(drill, tmp_path):
    need(os.path.exists("/dev/fuse"), "/dev/fuse is missing: the hang drill needs FUSE")
    fs = FaultFS(str(tmp_path / "fuse"))
    try:
        drill.policy(
            "paths",
            {
                "check_interval_seconds": 0.1,
                "paths": [
                    {
                        "name": "model",
                        "path": fs.data,
                        "readable": True,
                        "interval_seconds": 0.25,
                        "deadline_seconds": 0.5,
                    }
                ],
            },
        )
        drill.start("paths", extra=("--no-s3",))
        time.sleep(1.5)  # a few healthy scrapes first
        start = time.monotonic()
        fs.mode("hang")
        arrived, alert = drill.page("WardenPathStuck", timeout=20)
        took = arrived - start
        record("1 hung path (FUSE hang) -> WardenPathStuck", took)
        assert alert["labels"]["path"] == "model" and alert["labels"]["severity"] == "critical"
        assert took < 3.0, f"page took {took:.2f} s, the target is 3 s"
        fs.mode("ok")
        drill.page("WardenPathStuck", timeout=30, status="resolved")
    finally:
        fs.stop()


def test_drill_2_modified_signed_checkpoint_pages_and_resume_skips_it(drill):
    from sidecars.signer import generate_keypair

    keys = generate_keypair(os.path.join(drill.base, "keys"))
    drill.policy(
        "signer",
        {
            "signing_key": str(keys.private_key),
            "trusted_keys": str(keys.public_key),
            "check_interval_seconds": 0.2,
            "stable_seconds": 1,
            "reverify_interval_seconds": 1,
        },
    )
    config = tiny_config(
        drill,
        checkpoint={"every_steps": 2, "keep_last": 3, "trusted_keys": str(keys.public_key), "allow_unsigned": False},
    )
    drill.start("signer", extra=("--no-s3", "--signing-key", str(keys.private_key)))
    first = train(config, drill.run_dir, "--max-steps", "4")
    assert first.returncode == 0, first.stderr[-2000:]
    newest = os.path.join(drill.run_dir, "checkpoints", "step-000000004")
    deadline = time.monotonic() + 60
    while not (os.path.exists(newest + ".sig") and os.path.exists(newest[:-1] + "2.sig")):
        assert time.monotonic() < deadline, "checkpoints were not signed"
        time.sleep(0.2)
    time.sleep(2)  # one clean re-verification round
    target = os.path.join(newest, "trainer_state.json")
    with open(target, "rb") as fh:
        original = fh.read()
    start = time.monotonic()
    with open(target, "ab") as fh:
        fh.write(b" ")  # a one-byte change after signing
    arrived, alert = drill.page("WardenCheckpointVerificationFailed", timeout=30)
    record("2 signed checkpoint modified -> WardenCheckpointVerificationFailed", arrived - start)
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["job"] == "signer"
    # The trainer's next resume skips the tampered checkpoint.
    resumed = train(config, drill.run_dir, "--max-steps", "3")  # leaves step 4 as it is
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr and "step-000000002" in resumed.stderr
    events = journal(drill.run_dir)
    rejected = [e for e in events if e["type"] == "checkpoint.rejected"]
    assert rejected and rejected[-1]["data"]["path"] == newest
    assert [e["data"]["from_step"] for e in events if e["type"] == "run.resumed"] == [2]
    # Remove the fault: restore the byte; the page resolves.
    with open(target, "wb") as fh:
        fh.write(original)
    drill.page("WardenCheckpointVerificationFailed", timeout=60, status="resolved")


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_drill_4_malicious_file_in_an_approved_tokenizer_pages(drill):
    import pickle

    from trainer.assets import build_tokenizer

    tok = os.path.join(drill.base, "tokenizer")
    build_tokenizer(tok, vocab_size=300)
    drill.policy("tokenscan", {"paths": [tok], "check_interval_seconds": 0.2, "rescan_interval_seconds": 2})
    stack = drill.start("tokenscan", extra=("--no-s3",))
    deadline = time.monotonic() + 30
    while "warden_tokenscan_approved_directories 1.0" not in http_text(stack.urls["tokenscan"] + "/metrics"):
        assert time.monotonic() < deadline, "the clean tokenizer was never approved"
        time.sleep(0.2)
    start = time.monotonic()
    evil = os.path.join(tok, "added_tokens.pkl")
    with open(evil, "wb") as fh:
        fh.write(pickle.dumps(_Exploit()))  # building the bytes runs nothing
    arrived, alert = drill.page("WardenTokenizerCriticalFinding", timeout=30)
    record("4 malicious file in approved tokenizer -> WardenTokenizerCriticalFinding", arrived - start)
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["job"] == "tokenscan"
    os.unlink(evil)
    drill.page("WardenTokenizerCriticalFinding", timeout=40, status="resolved")


def http_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_drill_5_edited_package_file_pages(drill, test_env):
    drill.policy(
        "deps",
        {
            "target": {"python": test_env.python},
            "lock": {"path": str(test_env.lock)},
            "vulnerabilities": {"osv_db": None, "pip_audit_crosscheck": False},
            "strict": False,
            "check_interval_seconds": 0.2,
            "change_debounce_seconds": 0.3,
            "watch": True,
        },
    )
    stack = drill.start("deps", extra=("--no-s3",))
    deadline = time.monotonic() + 60
    while "warden_deps_last_audit_timestamp_seconds 0.0" in http_text(stack.urls["deps"] + "/metrics"):
        assert time.monotonic() < deadline, "no audit completed"
        time.sleep(0.3)
    assert "warden_deps_tampered_files 0.0" in http_text(stack.urls["deps"] + "/metrics")
    target = test_env.site / "six.py"
    original = target.read_bytes()
    start = time.monotonic()
    target.write_bytes(original + b"\nimport os  # injected\n")
    arrived, alert = drill.page("WardenDepsTamperedFiles", timeout=60)
    record("5 edited file in an installed package -> WardenDepsTamperedFiles", arrived - start)
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["job"] == "deps"
    target.write_bytes(original)
    drill.page("WardenDepsTamperedFiles", timeout=60, status="resolved")
