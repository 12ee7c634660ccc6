"""The signer sidecar as real processes: events, crashes, signals, retention, re-verification."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from support import http_get, run_warden

from tests.sidecars.signer.signer_helpers import run_model_signing
from warden.journal import RUN_STARTED
from warden.signing import load_trusted_keys, read_signed_statement, verify_checkpoint

SIGNED = "warden_signer_signed_total"
HASHED = "warden_signer_hashed_bytes_total"
ERRORS = "warden_signer_errors_total"
MIB = 1 << 20


def flip_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_signs_on_checkpoint_saved_then_verifies_with_both_tools(signer_kit):
    kit = signer_kit
    kit.journal().emit(RUN_STARTED, {"versions": {"warden": "9.9.9", "torch": "x"}})
    two, four = kit.save_checkpoint(2), kit.save_checkpoint(4)
    policy = kit.policy(stable_seconds=60)
    done = kit.once(policy)
    assert done.returncode == 0, done.stderr
    for path in (two, four):
        verified = kit.cli_verify(path)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert json.loads(verified.stdout)["ok"] is True
    first, second = kit.statement(two), kit.statement(four)
    assert (second.provenance.run_id, second.provenance.step, second.provenance.trainer_version) == (
        "run-sig",
        4,
        "9.9.9",
    )
    assert first.provenance.parent_root_digest is None
    assert second.provenance.parent_root_digest == first.subject_digest
    checked = run_model_signing(
        ["verify", "key", str(four), "--signature", str(four) + ".sig", "--public_key", str(kit.pub)]
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A second pass (or a replay after a crash) writes nothing new.
    before = {p: p.read_bytes() for p in kit.signatures(kit.checkpoints)}
    (kit.run_dir / "state" / "signer" / "cursor.json").unlink()
    done = kit.once(policy)
    assert done.returncode == 0, done.stderr
    assert {p: p.read_bytes() for p in kit.signatures(kit.checkpoints)} == before
    assert done.stderr.count('"already signed"') == 2


def test_the_key_comes_from_the_policy_or_env_and_must_be_private(signer_kit):
    kit = signer_kit
    kit.save_checkpoint(2)
    no_key = kit.policy("nokey.yaml", signing_key=None)
    done = kit.once(no_key)
    assert done.returncode == 2 and "WARDEN_SIGNING_KEY" in done.stderr
    os.chmod(kit.key, 0o640)
    done = kit.once(kit.policy())
    assert done.returncode == 2 and "chmod 600" in done.stderr, done.stderr
    assert kit.signatures(kit.checkpoints) == []
    os.chmod(kit.key, 0o600)
    done = run_warden(
        "sidecar", "run", "signer", "--once", "--run-dir", str(kit.run_dir), "--policy", no_key,
        env={"WARDEN_SIGNING_KEY": str(kit.key)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert kit.verify(kit.checkpoints / "step-000000002")


def test_a_step_saved_again_gets_a_new_signature(signer_kit):
    kit = signer_kit
    path = kit.save_checkpoint(2)
    policy = kit.policy(stable_seconds=60)
    assert kit.once(policy).returncode == 0
    old = Path(str(path) + ".sig").read_bytes()
    # Resumed from an earlier step, the trainer saves step 2 again: retire, rename, event.
    os.rename(path, path.parent / ".del-step-000000002")
    kit.save_checkpoint(2, {"actor/model.safetensors": 123_457, "trainer_state.json": 0})
    done = kit.once(policy)
    assert done.returncode == 0, done.stderr
    assert "replacing a signature that does not match" in done.stderr
    assert Path(str(path) + ".sig").read_bytes() != old
    assert kit.verify(path)


def test_a_checkpoint_without_an_event_is_never_signed_but_reported(signer_kit):
    kit = signer_kit
    orphan = kit.save_checkpoint(2, emit=False)
    announced = kit.save_checkpoint(4)
    done = kit.once(kit.policy(stable_seconds=0))
    assert done.returncode == 1, done.stderr
    assert not Path(str(orphan) + ".sig").exists()
    assert kit.verify(announced)
    violations = [json.loads(line) for line in done.stderr.splitlines() if '"reason": "unannounced"' in line]
    assert [v["path"] for v in violations] == [str(orphan)]


def step_dirs(kit) -> list[Path]:
    return sorted(p for p in kit.checkpoints.glob("step-*") if p.is_dir())


def _check_signatures(kit, seen: dict[Path, bytes]) -> None:
    """Every visible .sig verifies fully, and a signature once seen never changes."""
    trusted = load_trusted_keys(kit.pub)
    for sig in kit.signatures(kit.checkpoints):
        data = sig.read_bytes()
        directory = Path(str(sig)[: -len(".sig")])
        assert directory.is_dir(), f"{sig} has no checkpoint"
        if sig in seen:
            assert seen[sig] == data, f"{sig} was written twice"
            continue
        read_signed_statement(sig, trusted)
        assert verify_checkpoint(directory, trusted).ok, f"{sig} does not verify"
        seen[sig] = data


def test_kill_9_at_random_moments_leaves_no_bad_signature_and_signs_each_once(signer_kit):
    kit = signer_kit
    seed = int(os.environ.get("WARDEN_TEST_SEED", str(time.time_ns())))
    rng = random.Random(seed)
    policy = kit.policy(hash_workers=1, stable_seconds=60)
    big = {"actor/model.safetensors": 120 * MIB, "critic/model.safetensors": 80 * MIB, "trainer_state.json": 0}
    step, seen, interrupted = 0, {}, 0
    log_path = str(kit.tmp / "kill9.log")
    for trial in range(8):
        pending = [p for p in step_dirs(kit) if not Path(str(p) + ".sig").exists()]
        if not pending:
            step += 2
            kit.save_checkpoint(step, big)
        proc, port = kit.spawn_raw(policy, log_path)
        if trial % 2:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    samples = kit.scrape(port)
                except (OSError, AssertionError):
                    time.sleep(0.01)
                    continue
                if sum(v for (n, _), v in samples.items() if n == HASHED) > 0:
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.1))
        else:
            time.sleep(rng.uniform(0.0, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        still = [p for p in step_dirs(kit) if not Path(str(p) + ".sig").exists()]
        interrupted += bool(trial % 2 and still)
        _check_signatures(kit, seen)
    done = kit.once(policy)
    assert done.returncode == 0, f"seed {seed}: {done.stderr}"
    _check_signatures(kit, seen)
    directories = step_dirs(kit)
    assert directories and all(Path(str(p) + ".sig") in seen for p in directories)
    with open(log_path, encoding="utf-8") as fh:
        signed_lines = [json.loads(line)["path"] for line in fh if '"signed checkpoint"' in line]
    signed_lines += [json.loads(line)["path"] for line in done.stderr.splitlines() if '"signed checkpoint"' in line]
    assert all(signed_lines.count(p) == 1 for p in set(signed_lines)), f"seed {seed}: signed twice"
    assert interrupted >= 1, f"seed {seed}: no kill landed while a checkpoint was being hashed"


def test_sigterm_abandons_the_hash_and_keeps_the_cursor(signer_kit):
    kit = signer_kit
    path = kit.save_checkpoint(2, {"actor/model.safetensors": 1024 * MIB, "trainer_state.json": 0})
    policy = kit.policy(hash_workers=1, stable_seconds=60)
    svc = kit.start(policy)
    svc.wait_for(HASHED, lambda v: v > 0, operation="sign")
    started = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(10) == 0
    took = time.monotonic() - started
    assert took < 2.0, f"stopping took {took:.1f}s"
    assert not Path(str(path) + ".sig").exists()
    cursor = kit.run_dir / "state" / "signer" / "cursor.json"
    assert not cursor.exists() or json.loads(cursor.read_text())["seq"] < 1
    assert "hashing abandoned" in svc.log()
    done = kit.once(policy)
    assert done.returncode == 0, done.stderr
    assert kit.verify(path)


def test_a_checkpoint_pruned_while_hashed_is_counted_not_fatal(signer_kit):
    kit = signer_kit
    files = {f"shard-{i:02d}.safetensors": 25 * MIB for i in range(40)}
    path = kit.save_checkpoint(2, {**files, "trainer_state.json": 0})
    svc = kit.start(kit.policy(hash_workers=1, stable_seconds=60))
    svc.wait_for(HASHED, lambda v: v > 0, operation="sign")
    kit.prune(path)
    svc.wait_for(ERRORS, lambda v: v == 1, kind="checkpoint_vanished")
    assert svc.proc.poll() is None
    assert http_get(f"http://127.0.0.1:{svc.port}/healthz")[0] == 200
    assert kit.signatures(kit.checkpoints) == []
    later = kit.save_checkpoint(4)
    svc.wait_for(SIGNED, lambda v: v == 1, layout="warden")
    assert kit.verify(later)
    assert '"kind": "checkpoint_vanished"' in svc.log()


def test_hf_checkpoints_are_signed_once_complete_and_stable(signer_kit):
    kit = signer_kit
    root = kit.tmp / "hf-run"
    root.mkdir()
    svc = kit.start(kit.policy(watch=[{"path": str(root), "layout": "hf"}], stable_seconds=0.6, rescan_seconds=0.2))
    first = kit.write_hf(root, 10, with_state=False)
    (root / "tmp-checkpoint-20").mkdir()  # a transient name some versions use: never signed
    svc.checked_after(0.6 + 0.2)  # past stable_seconds and a rescan: it could have signed by now
    assert not Path(str(first) + ".sig").exists(), "signed without trainer_state.json"
    (first / "trainer_state.json").write_text('{"global_step": 10}')
    for i in range(6):  # still being written: every change restarts the quiet period
        time.sleep(0.2)
        with open(first / "optimizer.pt", "ab") as fh:
            fh.write(b"x" * (i + 1))
        assert not Path(str(first) + ".sig").exists(), "signed while files were changing"
    last_write = time.time()
    svc.wait_for(SIGNED, lambda v: v == 1, layout="hf")
    assert os.stat(str(first) + ".sig").st_mtime >= last_write + 0.55
    assert kit.verify(first)
    statement = kit.statement(first)
    assert (statement.provenance.run_id, statement.provenance.step) == ("hf-run", 10)
    second = kit.write_hf(root, 20)
    svc.wait_for(SIGNED, lambda v: v == 2, layout="hf")
    assert kit.statement(second).provenance.parent_root_digest == statement.subject_digest
    assert sorted(p.name for p in kit.signatures(root)) == ["checkpoint-10.sig", "checkpoint-20.sig"]


def test_verl_signs_only_the_step_named_by_the_tracker_once_stable(signer_kit):
    kit = signer_kit
    root = kit.tmp / "verl" / "ppo" / "exp1"
    kit.write_verl(root, 5)
    kit.write_verl(root, 10, update_tracker=False)  # written, but the tracker still names 5
    quick = kit.policy("quick.yaml", watch=[{"path": str(root), "layout": "verl"}], stable_seconds=0.3)
    patient = kit.policy("patient.yaml", watch=[{"path": str(root), "layout": "verl"}], stable_seconds=30)
    time.sleep(0.4)
    assert kit.once(quick).returncode == 0
    assert [p.name for p in kit.signatures(root)] == ["global_step_5.sig"]
    five = kit.statement(root / "global_step_5")
    assert (five.provenance.run_id, five.provenance.step) == ("exp1", 5)
    (root / "latest_checkpointed_iteration.txt").write_text("")  # verl is mid-write: no step yet
    time.sleep(0.4)
    assert kit.once(quick).returncode == 0
    assert [p.name for p in kit.signatures(root)] == ["global_step_5.sig"]
    (root / "latest_checkpointed_iteration.txt").write_text("10")
    assert kit.once(patient).returncode == 0  # the tracker just changed: not stable yet
    assert [p.name for p in kit.signatures(root)] == ["global_step_5.sig"]
    time.sleep(0.4)
    assert kit.once(quick).returncode == 0
    assert [p.name for p in kit.signatures(root)] == ["global_step_10.sig", "global_step_5.sig"]
    assert kit.verify(root / "global_step_10")
    assert kit.statement(root / "global_step_10").provenance.parent_root_digest == five.subject_digest


def test_reverification_counts_a_flipped_byte(signer_kit):
    kit = signer_kit
    two, _ = kit.save_checkpoint(2), kit.save_checkpoint(4)
    policy = kit.policy(reverify_interval_seconds=0.3, stable_seconds=60)
    svc = kit.start(policy)
    svc.wait_for(SIGNED, lambda v: v == 2, layout="warden")
    svc.wait_for("warden_signer_verifications_total", lambda v: v >= 2, result="ok")
    assert svc.value("warden_signer_verify_failures_total", reason="files_mismatch") == 0
    flip_byte(two / "actor" / "model.safetensors")
    first = svc.wait_for("warden_signer_verify_failures_total", lambda v: v >= 1, reason="files_mismatch")
    svc.wait_for("warden_signer_invalid_checkpoints", lambda v: v == 1)
    svc.wait_for("warden_signer_verify_failures_total", lambda v: v > first, reason="files_mismatch")
    assert svc.value("warden_signer_hash_duration_seconds_count", operation="verify") >= 3
    assert "re-verification failed" in svc.log()
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(10) == 0
    done = kit.once(policy)
    assert done.returncode == 1, done.stderr  # cron use: a violation exits 1
    assert "files_mismatch" in done.stderr


def test_unsigned_age_grows_for_a_refused_checkpoint_until_it_is_fixed(signer_kit):
    kit = signer_kit
    root = kit.tmp / "hf-run"
    bad = kit.write_hf(root, 3)
    os.symlink("/etc/hostname", bad / "linked.json")
    svc = kit.start(kit.policy(watch=[{"path": str(root), "layout": "hf"}], stable_seconds=0.3, rescan_seconds=0.2))
    svc.wait_for(ERRORS, lambda v: v == 1, kind="unsafe_path_error")
    assert svc.value("warden_signer_unsigned_checkpoints") == 1
    age = svc.wait_for("warden_signer_unsigned_checkpoint_age_seconds", lambda v: v > 0.5)
    svc.wait_for("warden_signer_unsigned_checkpoint_age_seconds", lambda v: v > age + 0.5)
    svc.checked_after(0.3 + 0.2)  # rescans past the quiet period happened: a retry would be counted
    assert svc.value(ERRORS, kind="unsafe_path_error") == 1, "the same refusal was retried"
    assert svc.value("warden_sidecar_violations_total", sidecar="signer") >= 1
    (bad / "linked.json").unlink()
    svc.wait_for(SIGNED, lambda v: v == 1, layout="hf")
    svc.wait_for("warden_signer_unsigned_checkpoints", lambda v: v == 0)
    assert svc.value("warden_signer_unsigned_checkpoint_age_seconds") == 0
    assert kit.verify(bad)


def test_shards_policy_signs_announced_checkpoints_in_shard_mode_once(signer_kit):
    """serialization: shards: the announcement (per-file sha256) is checked against the per-file
    root signed beside the shards, and a replayed event finds the checkpoint already signed."""
    kit = signer_kit
    ckpt = kit.save_checkpoint(2, {"actor/model.safetensors": 3 * (1 << 20) + 5, "trainer_state.json": 0})
    policy = kit.policy(serialization="shards", shard_size=1 << 20)
    first = kit.once(policy)
    assert first.returncode == 0, first.stderr
    statement = kit.statement(ckpt)
    assert statement.manifest.serialization.sharded and len(statement.manifest.resources) == 5
    assert kit.verify(ckpt)
    signed_at = os.stat(str(ckpt) + ".sig").st_mtime_ns
    os.unlink(kit.run_dir / "state" / "signer" / "cursor.json")  # the event is delivered again
    again = kit.once(policy)
    assert again.returncode == 0, again.stderr
    assert os.stat(str(ckpt) + ".sig").st_mtime_ns == signed_at, "re-signed on a replay"
    assert '"msg": "already signed"' in again.stderr
