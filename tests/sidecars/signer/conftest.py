"""Fixtures of the signer sidecar tests: keys, a run with a journal, checkpoint writers in
the ways the Warden trainer, HF Trainer and verl write them, and the sidecar as a process.

Helpers are reached through the ``signer_kit`` fixture (tests here do not import each other).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from support import free_port, run_warden, scrape, spawn, stop_process, wait_http, warden_cmd

from warden.journal import CHECKPOINT_SAVED, EventWriter
from warden.payloads import CheckpointPruned
from warden.signing import load_trusted_keys, read_signed_statement, verify_checkpoint
from warden.signing.keys import generate_keypair
from warden.signing.manifest import announced_root

MIB = 1 << 20


def write_file(path: Path, size: int, seed: int = 0) -> None:
    """``size`` bytes: random up to 1 MiB, then sparse (holes read as zeros) for large files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = random.Random(f"{path.name}-{seed}").randbytes(min(size, MIB))
    with open(path, "wb") as fh:
        fh.write(head)
        if size > len(head):
            fh.truncate(size)


def write_hf_checkpoint(root: Path, step: int, with_state: bool = True) -> Path:
    """A directory as HF Trainer._save_checkpoint writes it, in place, trainer_state.json last."""
    directory = root / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    write_file(directory / "model.safetensors", 200_000, step)
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "generation_config.json").write_text("{}")
    write_file(directory / "optimizer.pt", 400_000, step)
    write_file(directory / "scheduler.pt", 1_000, step)
    write_file(directory / "rng_state.pth", 15_000, step)
    if with_state:
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return directory


def write_verl_checkpoint(root: Path, step: int, update_tracker: bool = True) -> Path:
    """A directory as verl's trainer saves it, then latest_checkpointed_iteration.txt rewritten in place."""
    directory = root / f"global_step_{step}"
    for role in ("actor", "critic"):
        write_file(directory / role / "model_world_size_1_rank_0.pt", 150_000, step)
        write_file(directory / role / "optim_world_size_1_rank_0.pt", 200_000, step)
        write_file(directory / role / "extra_state_world_size_1_rank_0.pt", 2_000, step)
        (directory / role / "huggingface").mkdir()
        (directory / role / "huggingface" / "config.json").write_text("{}")
    write_file(directory / "data.pt", 3_000, step)
    if update_tracker:
        with open(root / "latest_checkpointed_iteration.txt", "w", encoding="utf-8") as fh:  # not atomic, like verl
            fh.write(str(step))
    return directory


def announcement(directory: Path) -> dict[str, object]:
    """``root_digest``/``file_count`` as the trainer announces them, from an independent sha256 walk."""
    digests = {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    announced = announced_root(digests)
    return {"root_digest": announced.root_digest, "file_count": announced.file_count}


def signatures(root: Path) -> list[Path]:
    return sorted(root.glob("*.sig"))


@dataclass
class Service:
    """A running ``warden sidecar run signer``; stderr goes to ``log_path``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: str

    def value(self, name: str, **labels: str) -> float:
        return scrape(self.port).get((name, tuple(sorted(labels.items()))), 0.0)

    def wait_for(self, name: str, predicate: object, timeout: float = 20, **labels: str) -> float:
        """Polls until ``predicate(value)`` holds; returns the value."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.value(name, **labels)
            if predicate(got):  # type: ignore[operator]
                return got
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}{labels} is {got} after {timeout}s\n{self.log()[-3000:]}")
            time.sleep(0.01)

    def checked_after(self, seconds: float, timeout: float = 30) -> None:
        """Waits until the sidecar completed a check that started ``seconds`` from now or later:
        a negative assertion after it means "not done although it had the chance", on any machine."""
        threshold = time.time() + seconds
        self.wait_for(
            "warden_sidecar_last_success_timestamp_seconds", lambda v: v > threshold, timeout, sidecar="signer"
        )

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()


@dataclass
class SignerKit:
    """Builds keys, policies, a run and checkpoints; runs the sidecar and the verifiers."""

    tmp: Path
    run_dir: Path = field(init=False)
    keys_dir: Path = field(init=False)
    trust_dir: Path = field(init=False)
    _journal: EventWriter | None = None
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: int = 0

    def __post_init__(self) -> None:
        self.run_dir = self.tmp / "run"
        self.run_dir.mkdir()
        self.keys_dir = self.tmp / "keys"
        generate_keypair(self.keys_dir)
        self.trust_dir = self.tmp / "trust"
        self.trust_dir.mkdir()
        shutil.copyfile(self.keys_dir / "signing.pub", self.trust_dir / "signer.pub")

    # -- paths and keys ------------------------------------------------------------------
    @property
    def key(self) -> Path:
        return self.keys_dir / "signing.key"

    @property
    def pub(self) -> Path:
        return self.keys_dir / "signing.pub"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def policy(self, name: str = "signer.yaml", **fields: object) -> str:
        """Writes a policy with the test key; ``fields`` override the defaults below."""
        doc: dict[str, object] = {
            "version": 1,
            "signing_key": str(self.key),
            "check_interval_seconds": 0.05,
            "rescan_seconds": 0.5,
            "stable_seconds": 0.5,
            "reverify_interval_seconds": 0,
        }
        doc.update(fields)
        path = self.tmp / name
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    # -- the Warden trainer's way ----------------------------------------------------------
    def journal(self) -> EventWriter:
        if self._journal is None:
            self._journal = EventWriter(str(self.run_dir / "events.jsonl"), "run-sig")
        return self._journal

    def save_checkpoint(
        self, step: int, files: dict[str, int] | None = None, emit: bool = True, announce: bool = True
    ) -> Path:
        """Writes ``.tmp-step-N/``, renames it to ``step-N/`` and emits checkpoint.saved, like the trainer.

        ``files`` maps names to sizes: sizes over 8 MiB are sparse beyond their first MiB.
        ``announce``: the event carries ``root_digest`` and ``file_count`` as the trainer's does.
        """
        files = files or {"actor/model.safetensors": 300_000, "trainer_state.json": 0}
        final = self.checkpoints / f"step-{step:09d}"
        tmp = self.checkpoints / f".tmp-step-{step:09d}"
        tmp.mkdir(parents=True)
        for name, size in files.items():
            write_file(tmp / name, size, seed=step)
        if "trainer_state.json" in files:
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "run_id": "run-sig"}))
        os.rename(tmp, final)
        if emit:
            self.emit_saved(final, step, announcement(final) if announce else {})
        return final

    def emit_saved(self, path: Path, step: int, extra: dict[str, object]) -> None:
        """Appends checkpoint.saved for ``path`` with ``extra`` data (e.g. an announced digest)."""
        data = {"path": str(path), "root": str(path.parent), **extra}
        self.journal().emit(CHECKPOINT_SAVED, data, step=step)

    def announce_pruned(self, path: Path) -> None:
        """checkpoint.pruned for ``path``, as the trainer's retention writes it before removing."""
        step = int(path.name.rsplit("-", 1)[1])
        pruned = CheckpointPruned(path=str(path), step=step, reason="retention: keep_last 1")
        self.journal().emit(pruned.TYPE, pruned.to_data(), step=step)

    def prune(self, path: Path) -> None:
        """The trainer's retention: checkpoint.pruned, rename to ``.del-step-N``, remove the .sig, delete the tree."""
        self.announce_pruned(path)
        doomed = path.parent / (".del-" + path.name)
        os.rename(path, doomed)
        sig = Path(str(path) + ".sig")
        if sig.exists():
            sig.unlink()
        shutil.rmtree(doomed)

    # -- running the sidecar -------------------------------------------------------------
    def once(self, policy: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = run_warden(
            "sidecar",
            "run",
            "signer",
            "--once",
            "--run-dir",
            str(self.run_dir),
            "--policy",
            policy,
            *extra,
            timeout=timeout,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def start(self, policy: str, *extra: str, poll: float = 0.05) -> Service:
        port = free_port()
        self._logs += 1
        log_path = str(self.tmp / f"sidecar-{self._logs}.log")
        cmd = warden_cmd(
            "sidecar",
            "run",
            "signer",
            "--run-dir",
            str(self.run_dir),
            "--policy",
            policy,
            "--port",
            str(port),
            "--poll-interval",
            str(poll),
            *extra,
        )
        with open(log_path, "wb") as log:
            proc = spawn(cmd, stderr=log)
        self._procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        return Service(proc, port, log_path)

    def spawn_raw(self, policy: str, log_path: str, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
        """Starts the service without waiting for it (for kill -9 at any moment); returns (process, port)."""
        port = free_port()
        cmd = warden_cmd(
            "sidecar",
            "run",
            "signer",
            "--run-dir",
            str(self.run_dir),
            "--policy",
            policy,
            "--port",
            str(port),
            "--poll-interval",
            "0.05",
            *extra,
        )
        with open(log_path, "ab") as log:
            proc = spawn(cmd, stderr=log)
        self._procs.append(proc)
        return proc, port

    # -- verifiers -----------------------------------------------------------------------
    def cli_verify(self, path: Path) -> subprocess.CompletedProcess[str]:
        return run_warden("checkpoint", "verify", str(path), "--trust", str(self.pub), "--format", "json")

    def verify(self, path: Path) -> bool:
        return verify_checkpoint(path, load_trusted_keys(self.pub)).ok

    def statement(self, path: Path):  # type: ignore[no-untyped-def]
        return read_signed_statement(str(path) + ".sig", load_trusted_keys(self.pub))[1]

    # -- other trainers' layouts (module functions, reachable from the fixture) ----------
    scrape = staticmethod(scrape)
    write_file = staticmethod(write_file)
    write_hf = staticmethod(write_hf_checkpoint)
    write_verl = staticmethod(write_verl_checkpoint)
    signatures = staticmethod(signatures)
    announcement = staticmethod(announcement)

    def close(self) -> None:
        for proc in self._procs:
            stop_process(proc, timeout=5)
        if self._journal is not None:
            self._journal.close()


@pytest.fixture
def signer_kit(tmp_path):
    kit = SignerKit(tmp_path)
    yield kit
    kit.close()
