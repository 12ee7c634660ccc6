"""End to end: files written the way verl 0.9.1 writes them (tests/integrations/verl_writer.py),
the real ``warden bridge verl`` following them, and the real signer and archiver sidecars on
the bridge's run directory, for two experiments archived into one file:// store.

Experiment A: Megatron checkpoints with ``async_save`` (the tracker comes from the finalizer,
after ``ckpt_contents.json``), retention keeping 2, so ``global_step_2`` loses ``actor/`` and
``critic/``; the save of step 6 is held between its manifests and its tracker write.
Experiment B: FSDP checkpoints, synchronous saves (tracker last), the same retention.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import free_port, run_warden, scrape, spawn, stop_process, wait_http, warden_cmd

from tests.integrations.verl_writer import VerlTrainer
from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, JournalReader

PROJECT = "gsm8k_ppo"
STEPS = 6
SAVE_FREQ = 2
KEEP = 2

pytestmark = pytest.mark.slow


def wait_for(what: str, check: Callable[[], Any], deadline_s: float = 60.0, procs: tuple = ()) -> Any:
    """Polls ``check`` until it returns something truthy; fails naming ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        for proc, log in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: a service exited ({proc.returncode}): {Path(log).read_text()[-3000:]}")
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {deadline_s}s (last: {last!r})")


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def samples(self) -> dict:
        return scrape(self.port)


class Stack:
    """The bridge, signer and archiver of one experiment, stopped by PID in ``close``."""

    def __init__(self, tmp: Path, run_dir: Path, trainer: VerlTrainer, keys: Path, store: Path) -> None:
        self.tmp, self.run_dir, self.trainer = tmp, run_dir, trainer
        self.services: list[Service] = []
        signer = tmp / "signer.yaml"
        signer.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "signing_key": str(keys / "signing.key"),
                    "check_interval_seconds": 0.05,
                    "rescan_seconds": 60,
                    "stable_seconds": 0,
                    "reverify_interval_seconds": 0.2,
                }
            )
        )
        archiver = tmp / "archiver.yaml"
        archiver.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "store": store.as_uri(),
                    "signing_key": str(keys / "signing.key"),
                    "top_k": 3,
                    "retention": {"mode": "none", "days": 0, "require_object_lock": False},
                    "upload_concurrency": 2,
                    "check_interval_seconds": 0.1,
                }
            )
        )
        self.signer_policy, self.archiver_policy = str(signer), str(archiver)

    def _start(self, name: str, args: list[str]) -> Service:
        port = free_port()
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as fh:
            proc = spawn([*args, "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT)
        service = Service(proc, port, log)
        self.services.append(service)
        wait_http(f"http://127.0.0.1:{port}/healthz", deadline_s=60, proc=proc)
        return service

    def start(self) -> None:
        t = self.trainer
        self.bridge = self._start(
            "bridge",
            warden_cmd(
                "bridge",
                "verl",
                "--run-dir",
                str(self.run_dir),
                "--verl-log",
                t.logger.filepath,
                "--rollout-dir",
                str(t.rollout_data_dir),
                "--checkpoint-root",
                str(t.default_local_dir),
                "--poll-interval",
                "0.1",
                "--stable-seconds",
                "0.3",
                "--top-k",
                "3",
            ),
        )
        # the sidecars read the journal the bridge creates on its first pass
        wait_for("the bridge's journal", lambda: (self.run_dir / "events.jsonl").exists(), procs=self.procs())
        sidecar = ["sidecar", "run"]
        common = ["--run-dir", str(self.run_dir), "--poll-interval", "0.05"]
        self.signer = self._start("signer", warden_cmd(*sidecar, "signer", *common, "--policy", self.signer_policy))
        self.archiver = self._start(
            "archiver", warden_cmd(*sidecar, "archiver", *common, "--policy", self.archiver_policy)
        )

    def procs(self) -> tuple:
        return tuple((s.proc, s.log) for s in self.services)

    def wait(self, what: str, check: Callable[[], Any], deadline_s: float = 60.0) -> Any:
        return wait_for(what, check, deadline_s, self.procs())

    def events(self, etype: str) -> list:
        return [e for e, _ in JournalReader(str(self.run_dir / "events.jsonl")).read_available() if e.type == etype]

    def saved_steps(self) -> list[int]:
        return [e.step for e in self.events(CHECKPOINT_SAVED)]

    def has_snapshot(self, step: int) -> Callable[[], bool]:
        return lambda: step in [e.step for e in self.events(REWARD_SNAPSHOT)]

    def has_saved(self, step: int) -> Callable[[], bool]:
        return lambda: step in self.saved_steps()

    def close(self) -> None:
        for service in self.services:
            stop_process(service.proc, timeout=10)


def verifies(directory: Path, pub: Path) -> bool:
    from warden.signing import load_trusted_keys, verify_checkpoint

    return Path(str(directory) + ".sig").exists() and verify_checkpoint(str(directory), load_trusted_keys(str(pub))).ok


def signed(directory: Path, pub: Path) -> Callable[[], bool]:
    return lambda: verifies(directory, pub)


def drive(stack: Stack, pub: Path) -> None:
    """Steps 1..6 with a save every 2; each save is signed before the next one (as when steps
    take minutes); the async save of step 6 is reported from its manifests, tracker later."""
    t = stack.trainer
    for step in range(1, STEPS + 1):
        save = step % SAVE_FREQ == 0
        pending = t.train_step(step, save=save)
        stack.wait(f"step {step} snapshot", stack.has_snapshot(step))
        if not save:
            continue
        if pending is not None and step == STEPS:
            before = t.tracker.read_text()
            pending.write_manifests()
            stack.wait(f"checkpoint.saved for {step} (manifests)", stack.has_saved(step))
            assert t.tracker.read_text() == before  # found from ckpt_contents.json, not from the tracker
            pending.complete()
            assert t.tracker.read_text() == str(step)
        elif pending is not None:
            pending.finalize()
        stack.wait(f"checkpoint.saved for {step}", stack.has_saved(step))
        stack.wait(f"global_step_{step} signed", signed(t.step_dir(step), pub))
    t.finish()


def check_experiment(stack: Stack, store: Path, pub: Path) -> str:
    t = stack.trainer
    events = [e for e, _ in JournalReader(str(stack.run_dir / "events.jsonl")).read_available()]
    run_ids = {e.run_id for e in events}
    assert len(run_ids) == 1, run_ids
    run_id = run_ids.pop()
    assert run_id != "metrics" and run_id.startswith(t.experiment + "-"), run_id

    saves = list(range(SAVE_FREQ, STEPS + 1, SAVE_FREQ))
    assert stack.saved_steps() == saves  # each checkpoint reported once
    assert [e.step for e in stack.events(REWARD_SNAPSHOT)] == list(range(1, STEPS + 1))

    # retention (keep 2) pruned global_step_2: counted as pruned, never a violation
    pruned = t.step_dir(2)
    assert not (pruned / "actor").exists() and not (pruned / "critic").exists()
    assert (pruned / "data.pt").exists() and Path(str(pruned) + ".sig").exists()
    stack.wait(
        "global_step_2 counted as pruned",
        lambda: metric(stack.signer.samples(), "warden_signer_pruned_total", layout="verl") >= 1,
    )
    for step in saves[-KEEP:]:
        assert verifies(t.step_dir(step), pub), step
        done = run_warden("checkpoint", "verify", str(t.step_dir(step)), "--trust", str(pub), "--format", "json")
        assert done.returncode == 0, done.stdout + done.stderr
    assert not verifies(pruned, pub)

    # every snapshot archived, exactly once
    stack.wait(
        "every snapshot archived",
        lambda: metric(stack.archiver.samples(), "warden_archiver_records_archived_total") >= STEPS,
    )
    signer = stack.signer.samples()
    assert metric(signer, "warden_signer_pruned_total", layout="verl") == 1
    assert sum(v for (name, _), v in signer.items() if name == "warden_signer_violations_total") == 0
    assert metric(signer, "warden_signer_signed_total", layout="verl") == len(saves)
    archiver = stack.archiver.samples()
    assert metric(archiver, "warden_archiver_records_archived_total") == STEPS
    assert metric(archiver, "warden_archiver_spool_depth") == 0

    walk = run_warden("audit", "verify-run", "--run", run_id, "--store", store.as_uri(), "--trust", str(pub))
    assert walk.returncode == 0, walk.stdout + walk.stderr
    for step in (1, STEPS):
        audit = run_warden(
            "audit", "snapshot", "--run", run_id, "--step", str(step), "--store", store.as_uri(),
            "--trust", str(pub), "--format", "json",
        )  # fmt: skip
        assert audit.returncode == 0, audit.stdout + audit.stderr
        record = json.loads(audit.stdout)["record"]
        rows = t.dumps[step]
        best = sorted(range(len(rows)), key=lambda i: (-rows[i]["score"], i))[:3]
        assert [s["response"] for s in record["samples"]] == [rows[i]["output"] for i in best]
    return run_id


def test_two_verl_experiments_signed_pruned_and_archived_in_one_store(tmp_path, signing_keys):
    store = tmp_path / "store"
    store.mkdir()
    pub = signing_keys.pub
    verl_root = tmp_path / "verl"
    run_ids = []
    for experiment, backend, async_save in (("exp-a-megatron", "megatron", True), ("exp-b-fsdp", "fsdp", False)):
        trainer = VerlTrainer(
            project=PROJECT,
            experiment=experiment,
            default_local_dir=verl_root / "checkpoints" / PROJECT / experiment,
            rollout_data_dir=verl_root / "rollouts" / experiment,
            logger_env={"VERL_FILE_LOGGER_ROOT": str(verl_root / "logs")},
            backend=backend,
            async_save=async_save,
            max_actor_ckpt_to_keep=KEEP,
            max_critic_ckpt_to_keep=KEEP,
        )
        assert trainer.logger.filepath == str(verl_root / "logs" / PROJECT / f"{experiment}.jsonl")
        work = tmp_path / experiment
        work.mkdir()
        stack = Stack(work, work / "warden", trainer, keys=signing_keys.dir, store=store)
        try:
            stack.start()
            drive(stack, pub)
            run_ids.append(check_experiment(stack, store, pub))
        finally:
            stack.close()
            trainer.logger.fp.close()
    assert run_ids[0] != run_ids[1]
    # the first experiment's chain is intact after the second one archived into the same store
    walk = run_warden("audit", "verify-run", "--run", run_ids[0], "--store", store.as_uri(), "--trust", str(pub))
    assert walk.returncode == 0, walk.stdout + walk.stderr
