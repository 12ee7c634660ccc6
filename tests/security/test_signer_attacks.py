"""Attacks on the signer by someone who can write the checkpoint storage but not read the key.

Each attack must end in a violation or a clean refusal: never a signature over the
attacker's bytes, a traceback or a hang. The sidecar runs in process with an injected
clock, so "wait beyond stable_seconds" is a clock step, not a sleep.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sidecars.runner import Runner
from sidecars.runtime import Outcome, SidecarContext
from sidecars.signer.sidecar import SignerSidecar
from warden.errors import ConfigError
from warden.journal import CHECKPOINT_SAVED, RUN_STARTED, EventWriter
from warden.payloads import CheckpointPruned
from warden.policy import policy_from_mapping
from warden.signer.policy import SignerPolicy
from warden.signing.dsse import sign_checkpoint
from warden.signing.errors import InsecureKeyPermissions
from warden.signing.keys import generate_keypair, load_private_key, load_trusted_keys
from warden.signing.manifest import Provenance, announced_root
from warden.signing.verify import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]
STABLE = 30.0
RUN_ID = "run-victim"


class Clock:
    """A clock the test moves; starts at the real time so directory ctimes read as fresh."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def write_checkpoint(root: Path, step: int, seed: str = "") -> Path:
    """A ``step-N/`` as the trainer leaves it (temporary name, then rename)."""
    final, tmp = root / f"step-{step:09d}", root / f".tmp-step-{step:09d}"
    (tmp / "actor").mkdir(parents=True)
    (tmp / "actor" / "model.safetensors").write_bytes(hashlib.sha256(f"{seed}{step}".encode()).digest() * 4000)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "run_id": RUN_ID}))
    os.rename(tmp, final)
    return final


def announcement(directory: Path) -> dict[str, object]:
    digests = {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }
    announced = announced_root(digests)
    return {"root_digest": announced.root_digest, "file_count": announced.file_count}


@dataclass
class Victim:
    """A run dir with its journal and key, and the signer sidecar in process."""

    tmp: Path
    clock: Clock = field(default_factory=Clock)
    log: Capture = field(default_factory=Capture)

    def __post_init__(self) -> None:
        self.run_dir = self.tmp / "run"
        self.checkpoints = self.run_dir / "checkpoints"
        self.checkpoints.mkdir(parents=True)
        self.key = Path(generate_keypair(self.tmp / "keys").private_key)
        self.journal = EventWriter(str(self.run_dir / "events.jsonl"), RUN_ID)
        self.journal.emit(RUN_STARTED, {"versions": {"warden": "test"}})
        self.sidecar, self.ctx, self.runner = self.start()

    def start(self, **fields: object) -> tuple[SignerSidecar, SidecarContext, Runner]:
        """A (new) sidecar on the same state dir, as after a restart."""
        doc = {"version": 1, "signing_key": str(self.key), "stable_seconds": STABLE, "rescan_seconds": 5, **fields}
        logger = logging.getLogger(f"warden.test.{id(self)}.{time.monotonic_ns()}")
        logger.addHandler(self.log)
        logger.setLevel(logging.INFO)
        ctx = SidecarContext(
            name="signer",
            state_dir=str(self.tmp / "state"),
            run_dir=str(self.run_dir),
            policy=policy_from_mapping(doc, SignerPolicy),
            log=logger,
            clock=self.clock,
        )
        sidecar = SignerSidecar(ctx, use_watchdog=False)
        return sidecar, ctx, Runner(sidecar)

    def forget_announcements(self) -> None:
        """The signer restarted with its announcement records lost (the cursor kept: no replay)."""
        self.sidecar.close()
        os.unlink(self.tmp / "state" / "announced.json")
        self.sidecar, self.ctx, self.runner = self.start()

    def prune(self, path: Path) -> None:
        """What the trainer's retention does: checkpoint.pruned first, then the removal."""
        step = int(path.name.rsplit("-", 1)[1])
        pruned = CheckpointPruned(path=str(path), step=step, reason="retention: keep_last 1")
        self.journal.emit(pruned.TYPE, pruned.to_data(), step=step)
        if sig(path).exists():
            sig(path).unlink()
        shutil.rmtree(path)

    def save(self, step: int, data: dict[str, object] | None = None) -> Path:
        path = write_checkpoint(self.checkpoints, step)
        self.journal.emit(CHECKPOINT_SAVED, {"path": str(path), **(data or announcement(path))}, step=step)
        return path

    def step(self, seconds: float = 0.0) -> Outcome:
        """Moves the clock, handles new events and runs one check; the worse outcome."""
        self.clock.advance(seconds)
        self.runner._worst = Outcome.OK
        self.runner.drain()
        return max(self.runner._worst, self.sidecar.check())

    def value(self, name: str, **labels: str) -> float:
        return self.ctx.registry.get_sample_value(name, labels) or 0.0

    def close(self) -> None:
        self.sidecar.close()
        self.journal.close()


@pytest.fixture
def victim(tmp_path):
    v = Victim(tmp_path)
    yield v
    v.close()


def sig(path: Path) -> Path:
    return Path(str(path) + ".sig")


def test_edit_and_delete_sig_is_never_resigned_even_after_a_restart(victim):
    path = victim.save(2)
    assert victim.step() is Outcome.OK
    assert verify_checkpoint(path, load_trusted_keys(victim.key.parent / "signing.pub")).ok
    (path / "actor" / "model.safetensors").write_bytes(b"backdoor")
    sig(path).unlink()
    for _ in range(3):
        assert victim.step(STABLE + 10) is Outcome.VIOLATION
    assert not sig(path).exists()
    assert victim.value("warden_signer_violating_checkpoints", reason="signature_missing") == 1
    assert victim.value("warden_signer_violations_total", reason="signature_missing") == 1
    assert victim.value("warden_signer_signed_total", layout="warden") == 1

    victim.sidecar.close()
    victim.sidecar, victim.ctx, victim.runner = victim.start(reverify_interval_seconds=60)
    assert victim.step(STABLE + 10) is Outcome.VIOLATION
    assert not sig(path).exists()
    assert victim.value("warden_signer_violating_checkpoints", reason="signature_missing") == 1
    assert victim.value("warden_signer_verify_failures_total", reason="signature_missing") == 1
    assert victim.value("warden_signer_invalid_checkpoints") == 1


def test_an_unannounced_step_is_never_signed(victim):
    victim.save(2)
    dropped = write_checkpoint(victim.checkpoints, 4, seed="attacker")
    assert victim.step() is Outcome.OK  # within the grace an event may still be on its way
    assert victim.step(STABLE + 1) is Outcome.VIOLATION
    assert victim.step(STABLE + 1) is Outcome.VIOLATION
    assert not sig(dropped).exists()
    assert victim.value("warden_signer_violating_checkpoints", reason="unannounced") == 1
    assert victim.value("warden_signer_violations_total", reason="unannounced") == 1
    assert any(str(dropped) in m and "unannounced" in m for m in victim.log.messages())


def test_a_signature_swapped_in_from_another_run_is_a_violation(victim, tmp_path):
    path = victim.save(2)
    assert victim.step() is Outcome.OK
    other = write_checkpoint(tmp_path / "other-run", 2, seed="other")
    sign_checkpoint(other, load_private_key(victim.key), Provenance(run_id="run-other", step=2))
    shutil.copyfile(sig(other), sig(path))  # the .sig alone
    assert victim.step(1) is Outcome.VIOLATION
    assert victim.value("warden_signer_violating_checkpoints", reason="signature_replaced") == 1
    shutil.rmtree(path)
    shutil.copytree(other, path)  # the directory and its valid .sig together
    assert victim.step(1) is Outcome.VIOLATION
    assert victim.value("warden_signer_violating_checkpoints", reason="signature_replaced") == 1
    assert any("run-other" in m for m in victim.log.messages())


def test_an_announced_digest_that_does_not_match_the_disk_is_refused(victim):
    path = write_checkpoint(victim.checkpoints, 2)
    data = announcement(path)
    (path / "trainer_state.json").write_text('{"step": 2, "run_id": "evil"}')  # between save and hash
    victim.journal.emit(CHECKPOINT_SAVED, {"path": str(path), **data}, step=2)
    assert victim.step() is Outcome.VIOLATION
    assert not sig(path).exists()
    assert victim.value("warden_signer_refused_total", reason="digest_mismatch") == 1
    actual = announcement(path)["root_digest"]
    refusal = [m for m in victim.log.messages() if m.startswith("refused to sign")]
    assert len(refusal) == 1 and str(path) in refusal[0]
    assert str(data["root_digest"]) in refusal[0] and str(actual) in refusal[0]
    assert victim.step(STABLE + 10) is Outcome.VIOLATION
    assert not sig(path).exists()
    assert victim.value("warden_signer_violating_checkpoints", reason="digest_mismatch") == 1


def test_an_event_without_a_digest_for_the_own_root_is_refused(victim):
    path = write_checkpoint(victim.checkpoints, 2)
    victim.journal.emit(CHECKPOINT_SAVED, {"path": str(path)}, step=2)
    assert victim.step() is Outcome.VIOLATION
    assert not sig(path).exists()
    assert victim.value("warden_signer_refused_total", reason="no_digest") == 1


def test_pruning_a_checkpoint_with_its_signature_is_not_a_violation(victim):
    path = victim.save(2)
    assert victim.step() is Outcome.OK
    victim.prune(path)  # checkpoint.pruned, then the directory and its .sig go
    assert victim.step(STABLE + 10) is Outcome.OK
    assert victim.value("warden_signer_violations_total", reason="signature_missing") == 0


# -- hostile .sig files through `warden checkpoint verify` ------------------------------------


def _deep(path: Path) -> None:
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)


def _long_number(path: Path) -> None:
    path.write_bytes(b'{"mediaType": ' + b"7" * 5000 + b"}")


def _long_string(path: Path) -> None:
    path.write_bytes(b'{"mediaType": "' + b"A" * (2 << 20) + b'"}')


def _bad_utf8(path: Path) -> None:
    path.write_bytes(b'{"mediaType": "\xff\xfe\xc3"}')


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    target = path.parent / "elsewhere.json"
    target.write_text("{}")
    path.symlink_to(target)


def _sparse(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(200 * 1000 * 1000)


@pytest.mark.parametrize(
    "make", [_deep, _long_number, _long_string, _bad_utf8, _fifo, _symlink, _sparse], ids=lambda f: f.__name__[1:]
)
def test_hostile_signature_files_are_a_clean_malformed_bundle(tmp_path, make):
    keys = generate_keypair(tmp_path / "keys")
    path = write_checkpoint(tmp_path / "checkpoints", 2)
    make(sig(path))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sidecars.cli", "checkpoint", "verify", str(path), "--trust", keys.public_key],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    problems = [line for line in done.stdout.splitlines() if line.strip().startswith("malformed_bundle:")]
    assert len(problems) == 1, done.stdout
    assert max(len(line) for line in (done.stdout + done.stderr).splitlines()) < 1000


# -- keys --------------------------------------------------------------------------------------


def _sign_cli(path: Path, key: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecars.cli", "checkpoint", "sign", str(path), "--key", key],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_key_owned_by_another_uid_is_refused(tmp_path):
    key = generate_keypair(tmp_path / "keys").private_key
    os.chown(key, 65534, -1)
    with pytest.raises(InsecureKeyPermissions, match="owned by uid 65534") as info:
        load_private_key(key)
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2
    assert f"chown {os.geteuid()} {key}" in str(info.value)
    done = _sign_cli(write_checkpoint(tmp_path / "ckpt", 2), key)
    assert done.returncode == 2 and "owned by uid 65534" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_key_in_a_group_writable_directory_is_refused(tmp_path):
    keys = tmp_path / "keys"
    key = generate_keypair(keys).private_key
    os.chmod(keys, 0o770)
    with pytest.raises(InsecureKeyPermissions, match="writable by group or others") as info:
        load_private_key(key)
    assert info.value.exit_code == 2 and f"chmod go-w {keys}" in str(info.value)
    done = _sign_cli(write_checkpoint(tmp_path / "ckpt", 2), key)
    assert done.returncode == 2 and "writable by group or others" in done.stderr
    assert not sig(tmp_path / "ckpt" / "step-000000002").exists()


def test_a_checkpoint_replaced_by_a_symlink_is_an_unsafe_path_violation_never_signed(victim, tmp_path):
    signed = victim.save(2)
    assert victim.step() is Outcome.OK and sig(signed).exists()
    # the attacker's own directory (a copy of a real checkpoint plus a backdoor), linked in under a step name
    elsewhere = tmp_path / "attacker" / "step-000000004"
    shutil.copytree(signed, elsewhere)
    (elsewhere / "actor" / "model.safetensors").write_bytes(b"backdoor")
    link = victim.checkpoints / "step-000000004"
    link.symlink_to(elsewhere, target_is_directory=True)
    # ...and a signed one swapped for a link to its own copy
    moved = tmp_path / "attacker" / "step-000000002"
    signed.rename(moved)
    signed.symlink_to(moved, target_is_directory=True)
    for _ in range(2):
        assert victim.step(STABLE + 1) is Outcome.VIOLATION
    assert not sig(link).exists()
    assert victim.value("warden_signer_violating_checkpoints", reason="unsafe_path") == 2
    assert victim.value("warden_signer_violations_total", reason="unsafe_path") == 2
    assert victim.value("warden_signer_signed_total", layout="warden") == 1
    assert any(f"{link}: checkpoint violation: unsafe_path" in m for m in victim.log.messages())


def _verl_checkpoint(root: Path, step: int) -> Path:
    """A verl ``global_step_N/`` (actor, critic, data.pt) and the tracker naming it."""
    directory = root / f"global_step_{step}"
    for role in ("actor", "critic"):
        (directory / role / "huggingface").mkdir(parents=True)
        for rank in range(2):
            (directory / role / f"model_world_size_2_rank_{rank}.pt").write_bytes(f"{role}{step}{rank}".encode() * 999)
        (directory / role / "huggingface" / "config.json").write_text("{}")
    (directory / "data.pt").write_bytes(b"loader" * 100)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return directory


@pytest.mark.parametrize(
    ("attack", "outcome"),
    [
        ("retention", Outcome.OK),  # verl's max_actor_ckpt_to_keep / max_critic_ckpt_to_keep: pruned
        ("one_shard", Outcome.VIOLATION),  # a shard gone, actor/ still there
        ("data", Outcome.VIOLATION),  # actor/ and critic/ gone, and data.pt too
        ("retention_plus_edit", Outcome.VIOLATION),  # actor/ gone, a critic file edited
        ("retention_plus_extra", Outcome.VIOLATION),  # actor/ and critic/ gone, a file added
        ("actor_replaced", Outcome.VIOLATION),  # actor/ emptied and recreated
    ],
)
def test_verl_retention_is_pruned_but_any_other_removal_or_change_is_a_violation(tmp_path, attack, outcome):
    victim = Victim(tmp_path)
    try:
        root = tmp_path / "verl"
        root.mkdir()
        victim.sidecar.close()
        watch = [{"path": str(root), "layout": "verl", "run_id": RUN_ID}]
        victim.sidecar, victim.ctx, victim.runner = victim.start(watch=watch, reverify_interval_seconds=60)
        directory = _verl_checkpoint(root, 10)
        assert victim.step(STABLE + 1) is Outcome.OK
        assert sig(directory).exists()
        _verl_checkpoint(root, 20)
        assert victim.step(STABLE + 1) is Outcome.OK and sig(root / "global_step_20").exists()
        if attack.startswith("retention") or attack == "data":
            shutil.rmtree(directory / "actor")
            if attack != "retention_plus_edit":
                shutil.rmtree(directory / "critic")
        if attack == "one_shard":
            (directory / "actor" / "model_world_size_2_rank_1.pt").unlink()
        if attack == "data":
            (directory / "data.pt").unlink()
        if attack == "retention_plus_edit":
            (directory / "critic" / "huggingface" / "config.json").write_text('{"backdoor": 1}')
        if attack == "retention_plus_extra":
            (directory / "extra.pt").write_bytes(b"x")
        if attack == "actor_replaced":
            shutil.rmtree(directory / "actor")
            (directory / "actor").mkdir()
        assert victim.step(61) is outcome  # re-verifies global_step_10 (one checkpoint per check)
        victim.step(61)  # global_step_20, intact
        assert victim.step(61) is outcome  # global_step_10 again: counted once
        pruned = victim.value("warden_signer_pruned_total", layout="verl")
        invalid = victim.value("warden_signer_invalid_checkpoints")
        assert (pruned, invalid) == ((1, 0) if outcome is Outcome.OK else (0, 1))
        assert not any("global_step_10" in m and "signed checkpoint" in m for m in victim.log.messages()[2:])
    finally:
        victim.close()


def test_deleting_the_newest_checkpoint_with_its_signature_is_not_retention(victim):
    """Storage writer deletes step-4 and its .sig (a resume would fall back to step-2 silently):
    the journal has no checkpoint.pruned for it, so it is removed_without_retention, and it pages."""
    older, newest = victim.save(2), victim.save(4)
    assert victim.step() is Outcome.OK
    sig(newest).unlink()
    shutil.rmtree(newest)
    assert victim.step(STABLE + 10) is Outcome.VIOLATION
    assert victim.value("warden_signer_violations_total", reason="removed_without_retention") == 1
    # The trainer's retention then removes the older one, announced first: that one is accounted for,
    # the deleted newest one still pages.
    victim.prune(older)
    assert victim.step(STABLE + 20) is Outcome.VIOLATION
    assert victim.value("warden_signer_violating_checkpoints", reason="removed_without_retention") == 1


def test_deleting_every_checkpoint_at_once_is_not_retention(victim):
    """Rollback by deleting everything: every announced checkpoint gone, no checkpoint.pruned."""
    paths = [victim.save(step) for step in (2, 4, 6)]
    assert victim.step() is Outcome.OK
    for path in paths:
        sig(path).unlink()
        shutil.rmtree(path)
    assert victim.step(STABLE + 10) is Outcome.VIOLATION
    assert victim.value("warden_signer_violating_checkpoints", reason="removed_without_retention") == 3


def test_announced_retention_is_never_a_violation(victim):
    paths = [victim.save(step) for step in (2, 4, 6)]
    assert victim.step() is Outcome.OK
    for path in paths[:2]:
        victim.prune(path)
    assert victim.step(STABLE + 10) is Outcome.OK
    assert victim.value("warden_signer_violations_total", reason="removed_without_retention") == 0


def _parent_of(victim, path: Path) -> str | None:
    from warden.signing.verify import read_signed_statement

    trusted = load_trusted_keys(victim.key.parent / "signing.pub")
    return read_signed_statement(str(sig(path)), trusted)[1].provenance.parent_root_digest


@pytest.mark.parametrize("forget_state", [False, True])
def test_a_lone_or_renamed_signature_never_becomes_the_chain_parent(victim, forget_state):
    """The parent digest comes from verified statements of real checkpoints: a valid .sig copied to a
    step-N.sig name with no directory (or beside a directory it does not sign) is no link of the chain."""
    older = victim.save(2)
    assert victim.step() is Outcome.OK
    other = victim.save(4)
    assert victim.step() is Outcome.OK
    assert _parent_of(victim, other) == _signed_digest(victim, older)
    shutil.copy(sig(older), victim.checkpoints / "step-000000005.sig")  # lone, verifies, below step 6
    (victim.checkpoints / "step-000000003").mkdir()  # a directory the copied .sig does not sign
    shutil.copy(sig(older), victim.checkpoints / "step-000000003.sig")
    if forget_state:  # the signer's state directory lost: only the files are left to go by
        victim.forget_announcements()
    newest = victim.save(6)
    victim.step()
    assert _parent_of(victim, newest) == _signed_digest(victim, other)


def _signed_digest(victim, path: Path) -> str:
    from warden.signing.verify import read_signed_statement

    trusted = load_trusted_keys(victim.key.parent / "signing.pub")
    return read_signed_statement(str(sig(path)), trusted)[1].subject_digest


MIB = 1 << 20


@pytest.mark.parametrize(
    ("trainer_shards", "policy_shards", "signed"), [(MIB, MIB, True), (MIB, None, False), (None, MIB, True)]
)
def test_the_announcement_carries_its_serialization_and_the_signer_checks_it(
    victim, trainer_shards, policy_shards, signed
):
    """checkpoint.serialization: shards makes the trainer announce the shard-serialization root, which
    the signer compares with its manifest directly; a policy that signs otherwise refuses it
    (serialization_mismatch). A files announcement under a shards policy is signed as before."""
    from trainer import checkpoint as ckpt
    from warden.payloads import CheckpointSaved

    victim.sidecar.close()
    shards = {"serialization": "shards", "shard_size": policy_shards} if policy_shards else {}
    victim.sidecar, victim.ctx, victim.runner = victim.start(**shards)
    written = ckpt.write_checkpoint(
        str(victim.checkpoints), 2, lambda w: w.bytes("actor/model.safetensors", os.urandom(MIB + 5)), trainer_shards
    )
    saved = CheckpointSaved(path=written.path).with_announced(written.announced)
    victim.journal.emit(saved.TYPE, saved.to_data(), step=2)
    outcome = victim.step()
    assert sig(Path(written.path)).exists() is signed
    if signed:
        assert outcome is Outcome.OK
        if trainer_shards:
            assert _signed_digest(victim, Path(written.path)) == written.announced.root_digest
    else:
        assert outcome is Outcome.VIOLATION
        assert victim.value("warden_signer_refused_total", reason="serialization_mismatch") == 1
