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
from support import ROOT, TEST_CONFIG, merge, run_warden

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


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
    from warden.signing import generate_keypair

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
        checkpoint={"every_steps": 2, "keep_last": 3, "trusted_keys": str(keys.public_key)},
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
    # A person's decision first (the sidecar never approves on its own, issue 33), into the state the
    # stack gives the sidecar (<run>/state/tokenscan), under the drill's policy.
    state = os.path.join(drill.run_dir, "state", "tokenscan")
    approved = run_warden("scan", "tokenizer", tok, "--approve", "--state-dir", state, "--policy-dir", drill.policy_dir)
    assert approved.returncode == 0, approved.stdout + approved.stderr
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


S3_KEYS = ("wardendrill", "wardendrillsecret0123456789")


def archiver_policy(drill, key: str, prefix: str) -> None:
    drill.policy(
        "archiver",
        {
            "store": f"s3://warden-archive/{prefix}",
            "addressing_style": "path",
            "signing_key": key,
            "top_k": 2,
            "retention": {"mode": "COMPLIANCE", "days": 1, "require_object_lock": True},
            "upload_concurrency": 4,
            "request_timeout_seconds": 2,
            "backoff": {"initial_seconds": 0.2, "max_seconds": 2},
            "check_interval_seconds": 0.5,
        },
    )


def s3_env(stack) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL_S3": stack.urls["s3"],
        "AWS_ACCESS_KEY_ID": S3_KEYS[0],
        "AWS_SECRET_ACCESS_KEY": S3_KEYS[1],
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def metric(stack, name: str, sample: str) -> float:
    for line in http_text(stack.urls[name] + "/metrics").splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return float("nan")


def assert_archive_exact(drill, stack, run_id: str, steps: int, pub: str, prefix: str) -> None:
    """Every step archived exactly once (one object version each) and the chain verifies."""
    import boto3

    deadline = time.monotonic() + 120
    while not (
        metric(stack, "archiver", "warden_archiver_spool_depth") == 0
        and metric(stack, "archiver", "warden_archiver_last_archived_step") == steps
    ):
        assert time.monotonic() < deadline, "the archiver did not drain its spool"
        time.sleep(0.5)
    env = s3_env(stack)
    store = f"s3://warden-archive/{prefix}"
    verified = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecars.cli",
            "audit",
            "verify-run",
            "--run",
            run_id,
            "--store",
            store,
            "--trust",
            pub,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=S3_KEYS[0],
        aws_secret_access_key=S3_KEYS[1],
        region_name="us-east-1",
    )
    versions: dict[str, int] = {}
    for page in client.get_paginator("list_object_versions").paginate(
        Bucket="warden-archive", Prefix=f"{prefix}/runs/{run_id}/steps/"
    ):
        for v in page.get("Versions", []):
            versions[v["Key"]] = versions.get(v["Key"], 0) + 1
    assert sorted(versions) == [f"{prefix}/runs/{run_id}/steps/{s:012d}.json" for s in range(1, steps + 1)]
    assert set(versions.values()) == {1}, "a step has more than one object version"


def weed_pid(drill) -> int:
    found = subprocess.run(["pgrep", "-f", f"weed mini -dir={drill.run_dir}/state/s3"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def test_drill_3_s3_outage_during_training_loses_nothing(drill):
    import signal as sig

    from warden.signing import generate_keypair

    keys = generate_keypair(os.path.join(drill.base, "keys"))
    archiver_policy(drill, str(keys.private_key), "drill3")
    steps = 120
    config = tiny_config(drill, checkpoint={"every_steps": 0}, max_steps=steps)
    stack = drill.start(
        "archiver",
        extra=("--s3-access-key", S3_KEYS[0], "--s3-secret-key", S3_KEYS[1], "--signing-key", str(keys.private_key)),
    )
    trainer = subprocess.Popen(
        [sys.executable, "-m", "sidecars.cli", "train", "--config", config, "--run-dir", drill.run_dir],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not metric(stack, "archiver", "warden_archiver_records_archived_total") >= 3:
            assert time.monotonic() < deadline and trainer.poll() is None, "nothing archived before the outage"
            time.sleep(0.2)
        pid = weed_pid(drill)
        start = time.monotonic()
        os.kill(pid, sig.SIGSTOP)  # S3 stops answering (connections hang, like a dead endpoint)
        try:
            arrived, alert = drill.page("WardenArchiverBacklog", timeout=40, receiver="/ticket")
            record("3 S3 stopped during training -> WardenArchiverBacklog (ticket)", arrived - start)
            assert alert["labels"]["severity"] == "warning"
            time.sleep(max(0.0, 30 - (time.monotonic() - start)))
        finally:
            os.kill(pid, sig.SIGCONT)
        assert trainer.wait(300) == 0, trainer.stderr.read().decode()[-2000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
    run_id = journal(drill.run_dir)[-1]["run_id"]
    assert_archive_exact(drill, stack, run_id, steps, str(keys.public_key), "drill3")
    drill.page("WardenArchiverBacklog", timeout=60, status="resolved", receiver="/ticket")


def test_drill_6_trainer_killed_mid_checkpoint_resumes_without_loss(drill):
    import signal as sig

    from warden.signing import generate_keypair

    keys = generate_keypair(os.path.join(drill.base, "keys"))
    archiver_policy(drill, str(keys.private_key), "drill6")
    drill.policy(
        "signer",
        {
            "signing_key": str(keys.private_key),
            "trusted_keys": str(keys.public_key),
            "check_interval_seconds": 0.2,
            "stable_seconds": 1,
        },
    )
    steps = 10
    config = tiny_config(
        drill,
        max_steps=steps,
        model={"tiny": {"hidden_size": 256, "num_layers": 4, "intermediate_size": 768}},
        checkpoint={"every_steps": 2, "keep_last": 3, "trusted_keys": str(keys.public_key)},
    )
    stack = drill.start(
        "signer",
        "archiver",
        extra=("--s3-access-key", S3_KEYS[0], "--s3-secret-key", S3_KEYS[1], "--signing-key", str(keys.private_key)),
    )
    root = os.path.join(drill.run_dir, "checkpoints")
    killed_at = None
    trainer = subprocess.Popen(
        [sys.executable, "-m", "sidecars.cli", "train", "--config", config, "--run-dir", drill.run_dir],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while trainer.poll() is None:
        names = os.listdir(root) if os.path.isdir(root) else []
        # .tmp-step-<9 digits>.<random>: the private directory a checkpoint is filled in
        partial = [
            int(n[10:19]) for n in names if n.startswith(".tmp-step-") and n[10:19].isascii() and n[10:19].isdigit()
        ]
        partial = [step for step in partial if step >= 4]
        if partial:
            trainer.send_signal(sig.SIGKILL)  # mid-checkpoint
            killed_at = partial[0]
            break
        time.sleep(0.001)
    trainer.wait()
    assert killed_at is not None, "the trainer finished before a checkpoint could be interrupted"
    complete = sorted(n for n in os.listdir(root) if n.startswith("step-") and not n.endswith(".sig"))
    assert f"step-{killed_at:09d}" not in complete  # the interrupted one never looks complete
    newest = int(complete[-1][5:]) if complete else 0
    # With trusted keys a resume accepts only signed checkpoints: wait until the signer has
    # signed every complete (announced) one before restarting the trainer.
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(root, name + ".sig")) for name in complete):
        assert time.monotonic() < deadline, f"signer did not sign {complete} within 60 s"
        time.sleep(0.1)
    again = train(config, drill.run_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    events = journal(drill.run_dir)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "journal seq has gaps or repeats"
    resumed = [e for e in events if e["type"] == "run.resumed"]
    assert len(resumed) == 1 and resumed[0]["data"]["from_step"] == newest
    after = [e["step"] for e in events[events.index(resumed[0]) :] if e["type"] == "step.completed"]
    assert after == list(range(newest + 1, steps + 1)), "steps after the resume must be contiguous, once each"
    before = {e["step"] for e in events[: events.index(resumed[0])] if e["type"] == "step.completed"}
    assert set(range(1, newest + 1)) <= before, "a step before the resume point was lost"
    record(
        "6 trainer SIGKILL mid-checkpoint -> resumed from verified step "
        f"{newest} (killed while writing step {killed_at})",
        0.0,
    )
    assert_archive_exact(drill, stack, events[-1]["run_id"], steps, str(keys.public_key), "drill6")
