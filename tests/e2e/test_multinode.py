"""Two nodes, one run: two signer and two archiver processes on one run directory, one node killed.

A stack runs next to each training node and the run directory is on shared storage (here: one
directory both "nodes" see). Each node runs ``warden sidecar run signer`` and ``... archiver`` with
``lease.enabled`` and its own state directory, port and holder name; a journal writer plays the
trainer (run.started, a reward.snapshot per step, a checkpoint every other step, announced with its
digest as the trainer announces it). Node A takes both leases; mid-run it is killed with SIGKILL
(no release). Asserted, against the real S3 (SeaweedFS) and the real verifiers:

- every checkpoint has exactly one ``.sig`` and it verifies (the signer's trust set);
- the store holds one object per step, the chain verifies end to end (``warden audit verify-run``);
- no false violation: the surviving processes count no violation, refusal, conflict or lease
  alarm, and node B took each lease over exactly once;
- takeover within the lease time: from the kill to node B holding each lease is at most
  ``duration + skew + 2 x renew`` (printed with the measured values).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support import free_port, run_warden, scrape, spawn, stop_process, wait_http, warden_cmd

from tests.warden.archive.archiver_helpers import make_keys, snapshot_data, write_policy
from tests.warden.archive.conftest import seaweed
from warden.archive.record import step_from_key, steps_prefix
from warden.journal import CHECKPOINT_SAVED, EventWriter
from warden.signing import load_trusted_keys, verify_checkpoint
from warden.signing.manifest import announced_root

__all__ = ["seaweed"]

pytestmark = pytest.mark.slow

RUN_ID = "run-multinode"
STEPS = 16
KILL_AFTER = 7
SIGNER_LEASE = {
    "enabled": True,
    "duration_seconds": 3.0,
    "renew_seconds": 0.5,
    "max_clock_skew_seconds": 0.5,
    "act_margin_seconds": 1.0,
}
ARCHIVER_LEASE = {**SIGNER_LEASE, "duration_seconds": 4.0, "act_margin_seconds": 2.0}


def bound(lease: dict) -> float:
    return lease["duration_seconds"] + lease["max_clock_skew_seconds"] + 2 * lease["renew_seconds"]


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def value(self, metric: str, **labels: str) -> float:
        return scrape(self.port).get((metric, tuple(sorted(labels.items()))), 0.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_until(what: str, predicate, timeout: float, procs: list[Proc]) -> float:
    """Polls ``predicate`` until true; returns the time.monotonic() it became true."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return time.monotonic()
        except (OSError, AssertionError):
            pass
        for p in procs:
            if p.proc.poll() is not None and p.proc.returncode != -signal.SIGKILL:
                raise AssertionError(f"{p.name} exited with {p.proc.returncode}:\n{p.log()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.log()[-2500:]}" for p in procs)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
        time.sleep(0.02)


def announcement(directory: Path) -> dict[str, object]:
    digests = {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }
    announced = announced_root(digests)
    return {"root_digest": announced.root_digest, "file_count": announced.file_count}


def save_checkpoint(journal: EventWriter, root: Path, step: int) -> Path:
    """As Warden's trainer saves: ``.tmp-step-N/`` written, renamed into place, then announced."""
    final, tmp = root / f"step-{step:09d}", root / f".tmp-step-{step:09d}"
    (tmp / "actor").mkdir(parents=True)
    (tmp / "actor" / "model.safetensors").write_bytes(os.urandom(64 * 1024))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "run_id": RUN_ID}))
    os.rename(tmp, final)
    journal.emit(CHECKPOINT_SAVED, {"path": str(final), "root": str(root), **announcement(final)}, step=step)
    return final


def test_two_nodes_one_run_one_killed_one_sig_per_checkpoint_one_object_per_step(tmp_path, seaweed):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    key, pub = make_keys(tmp_path / "keys")  # one key for the run, mounted on every node
    bucket = seaweed.make_bucket()
    store = f"s3://{bucket}"

    signer_policy = tmp_path / "signer.yaml"
    signer_policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "signing_key": key,
                "check_interval_seconds": 0.1,
                "rescan_seconds": 0.5,
                "stable_seconds": 0.5,
                "reverify_interval_seconds": 0,
                "lease": SIGNER_LEASE,
            }
        )
    )
    archiver_policy = write_policy(
        tmp_path / "archiver.yaml",
        store,
        request_timeout_seconds=2,
        check_interval_seconds=0.1,
        backoff={"initial_seconds": 0.1, "max_seconds": 0.5},
        lease=ARCHIVER_LEASE,
    )
    env = {**os.environ, **seaweed.env(), "WARDEN_SIGNING_KEY": key}
    procs: list[Proc] = []

    def start(node: str, sidecar: str, policy: Path) -> Proc:
        port = free_port()
        log_path = tmp_path / f"{node}-{sidecar}.log"
        cmd = warden_cmd(
            "sidecar",
            "run",
            sidecar,
            "--run-dir",
            str(run_dir),
            "--policy",
            str(policy),
            "--state-dir",
            str(tmp_path / node / sidecar),
            "--port",
            str(port),
            "--poll-interval",
            "0.05",
        )
        with open(log_path, "wb") as log:
            proc = spawn(cmd, stderr=log, env={**env, "WARDEN_LEASE_HOLDER": f"{node}-{sidecar}"})
        procs.append(Proc(f"{node} {sidecar}", proc, port, log_path))
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc, deadline_s=60)
        return procs[-1]

    journal = EventWriter(str(run_dir / "events.jsonl"), RUN_ID)
    try:
        a_signer, a_archiver = start("nodeA", "signer", signer_policy), start("nodeA", "archiver", archiver_policy)
        for p, metric in ((a_signer, "warden_signer_lease_held"), (a_archiver, "warden_archiver_lease_held")):
            wait_until(f"{p.name} holds", lambda p=p, m=metric: p.value(m) == 1, 20, procs)
        b_signer, b_archiver = start("nodeB", "signer", signer_policy), start("nodeB", "archiver", archiver_policy)
        assert b_signer.value("warden_signer_lease_held") == 0 and b_archiver.value("warden_archiver_lease_held") == 0

        journal.emit("run.started", {"config_digest": "c0ffee" + "0" * 58, "genesis_nonce": "n" * 32})
        saved: list[Path] = []
        for step in range(1, STEPS + 1):
            journal.emit("reward.snapshot", snapshot_data(step), step=step)
            if step % 2 == 0:
                saved.append(save_checkpoint(journal, checkpoints, step))
            if step == KILL_AFTER:
                # node A dies mid-run: right after a checkpoint and a snapshot it may be working on
                killed_at = time.monotonic()
                a_signer.proc.send_signal(signal.SIGKILL)
                a_archiver.proc.send_signal(signal.SIGKILL)
                a_signer.proc.wait(10)
                a_archiver.proc.wait(10)
                signer_taken = wait_until(
                    "node B's signer takes over",
                    lambda: b_signer.value("warden_signer_lease_held") == 1,
                    30,
                    procs,
                )
                archiver_taken = wait_until(
                    "node B's archiver takes over",
                    lambda: b_archiver.value("warden_archiver_lease_held") == 1,
                    30,
                    procs,
                )
            time.sleep(0.1)  # the trainer's pace (not a synchronisation: nothing waits on it)

        # every checkpoint signed and every step stored, by whoever held the lease then
        wait_until("a .sig beside every checkpoint", lambda: all(Path(f"{c}.sig").exists() for c in saved), 40, procs)
        client = seaweed.client()

        def stored_steps() -> list[int]:
            found = client.list_objects_v2(Bucket=bucket, Prefix=steps_prefix(RUN_ID)).get("Contents", [])
            return sorted(s for s in (step_from_key(o["Key"].rsplit("/", 1)[-1]) for o in found) if s is not None)

        wait_until("an object for every step", lambda: stored_steps() == list(range(1, STEPS + 1)), 40, procs)
        # one object per step: no second version of any key (an identical re-put would be one more version
        # of equal bytes; a different one a conflict)
        versions = client.list_object_versions(Bucket=bucket, Prefix=steps_prefix(RUN_ID)).get("Versions", [])
        keys = [v["Key"] for v in versions]
        assert len(keys) == len(set(keys)) == STEPS, sorted(keys)

        trusted = load_trusted_keys(pub)
        sigs = sorted(checkpoints.glob("*.sig"))
        assert [s.name for s in sigs] == [f"{c.name}.sig" for c in saved]
        for checkpoint in saved:
            result = verify_checkpoint(checkpoint, trusted)
            assert result.ok, f"{checkpoint}: {result.summary()}"
        audit = run_warden(
            "audit",
            "verify-run",
            "--run",
            RUN_ID,
            "--run-dir",
            str(run_dir),
            "--format",
            "json",
            env={**seaweed.env(), "WARDEN_STORE": store, "WARDEN_TRUST": pub},
        )
        assert audit.returncode == 0, audit.stdout + audit.stderr
        report = json.loads(audit.stdout)
        assert report["ok"] and report["records_checked"] == STEPS and report["head_step"] == STEPS

        # no false violation on the survivors, and one takeover each
        for p, scope in ((b_signer, "signer"), (b_archiver, "archiver")):
            samples = scrape(p.port)
            assert p.value("warden_sidecar_violations_total", sidecar=scope) == 0, p.log()[-3000:]
            alarms = {k: v for k, v in samples.items() if k[0] == f"warden_{scope}_lease_alarms_total" and v}
            assert alarms == {}, alarms
            assert p.value(f"warden_{scope}_lease_takeovers_total") == 1
            assert p.value(f"warden_{scope}_lease_token") == 2
        assert b_archiver.value("warden_archiver_conflicts_total") == 0
        refused = {k: v for k, v in scrape(b_signer.port).items() if k[0] == "warden_signer_refused_total" and v}
        assert refused == {}, refused

        # both nodes did part of the work: A before the kill, B after it (and B found A's part done)
        def said(p: Proc, message: str) -> int:
            return sum(json.loads(line).get("msg") == message for line in p.log().splitlines() if line.startswith("{"))

        signed_a, signed_b = said(a_signer, "signed checkpoint"), said(b_signer, "signed checkpoint")
        found_done = said(b_signer, "already signed (by the previous lease holder)")
        assert signed_a >= 1 and signed_b >= 1 and found_done >= 1, (signed_a, signed_b, found_done)
        assert said(b_archiver, "snapshot for a step already chained (a replay); not archived again") >= 1

        signer_s, archiver_s = signer_taken - killed_at, archiver_taken - killed_at
        print(
            f"\ntakeover after kill -9: signer {signer_s:.2f}s (bound {bound(SIGNER_LEASE):.1f}s), "
            f"archiver {archiver_s:.2f}s (bound {bound(ARCHIVER_LEASE):.1f}s); "
            f"{len(saved)} checkpoints, {len(sigs)} signatures (node A {signed_a}, node B {signed_b}), "
            f"{STEPS} records"
        )
        # the scrape that saw it adds at most one poll interval and a scrape
        assert signer_s <= bound(SIGNER_LEASE) + 0.5
        assert archiver_s <= bound(ARCHIVER_LEASE) + 0.5
    finally:
        journal.close()
        for p in procs:
            if p.proc.poll() is None:
                stop_process(p.proc, timeout=10)
        shutil.rmtree(tmp_path / "nodeA", ignore_errors=True)
