"""run.resumed in the signer's library: the checkpoint a run went on from is verified at once, by
the re-verification's code, with real keys and signatures in tmp_path; failures page (the invalid
gauge) and outlive a restart; hostile paths end in a refusal or a violation, never a traceback."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecars.signer.metrics import SignerMetrics
from tests.warden.signing.signing_helpers import make_keys, write_tree
from warden.errors import ExitCode, TryAgainLater
from warden.journal import CHECKPOINT_SAVED, EventWriter
from warden.payloads import CheckpointPruned, RunResumed
from warden.signer.announced_signing import AnnouncedSigning
from warden.signer.announcements import AnnouncementStore
from warden.signer.policy import SignerPolicy, WatchRoot
from warden.signer.resume_checking import ResumeChecking
from warden.signer.resumes import RESUMED_FILE, ResumedStore
from warden.signer.reverification import Reverification
from warden.signer.runs import RunRegistry
from warden.signer.state import SignerState, roots_of, trust_set
from warden.signing.manifest import announced_root

EXAMPLES = settings(
    max_examples=int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", 25)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FILES = {
    "actor/model.safetensors": bytes(range(256)) * 40,
    "actor/config.json": b'{"hidden_size": 64}\n',
    "critic/model.safetensors": bytes(reversed(range(256))) * 12,
    "trainer_state.json": b'{"step": 4}\n',
}
RUN = "run-r"
LOGGER = "warden.test.signer.resumed"


@dataclass
class Signer:
    """The signer's library over one run dir: the event services and the metrics they set."""

    run_dir: Path
    state: SignerState
    registry: CollectorRegistry
    journal: EventWriter
    signing: AnnouncedSigning
    reverify: Reverification
    resumes: ResumeChecking

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def value(self, name: str, **labels: str) -> float:
        got = self.registry.get_sample_value(name, labels)
        return 0.0 if got is None else got

    def resumed_checks(self, result: str) -> float:
        return self.value("warden_signer_resumed_checks_total", result=result)

    @property
    def invalid(self) -> float:
        return self.value("warden_signer_invalid_checkpoints")

    def save(self, step: int, files: dict[str, bytes] | None = None, root: Path | None = None, name: str = "") -> Path:
        """Writes a checkpoint, announces it (root digest and file count) and lets the signer sign it."""
        content = files or FILES
        directory = write_tree((root or self.checkpoints) / (name or f"step-{step:09d}"), content)
        announced = announced_root({n: hashlib.sha256(b).hexdigest() for n, b in content.items()})
        data = {"path": str(directory), "root_digest": announced.root_digest, "file_count": announced.file_count}
        assert self.signing.checkpoint_saved(self.journal.emit(CHECKPOINT_SAVED, data, step=step)) is ExitCode.OK
        assert Path(str(directory) + ".sig").is_file()
        return directory

    def resume(self, payload: RunResumed | dict[str, object], step: int | None = None) -> ExitCode:
        data = payload.to_data() if isinstance(payload, RunResumed) else payload
        return self.resumes.run_resumed(self.journal.emit("run.resumed", data, step=step))

    def restart(self) -> Signer:
        """A new signer process over the same state dir (the metrics start at zero again)."""
        self.journal.close()
        return make_signer(self.run_dir, self.state.key, self.state.policy)


def make_signer(run_dir: Path, key=None, policy: SignerPolicy | None = None) -> Signer:  # type: ignore[no-untyped-def]
    run_dir.mkdir(exist_ok=True)
    key = key if key is not None else make_keys(run_dir.parent / f"keys-{run_dir.name}").private
    policy = policy or SignerPolicy()
    registry = CollectorRegistry()
    state_dir = run_dir / "state" / "signer"
    state = SignerState(
        name="signer",
        policy=policy,
        key=key,
        trusted=trust_set(key, None),
        metrics=SignerMetrics(registry),
        roots=roots_of(policy, str(run_dir)),
        runs=RunRegistry(str(state_dir / "runs.json")),
        announced=AnnouncementStore(str(state_dir / "announced.json")),
        log=logging.getLogger(LOGGER),
        clock=time.time,
        stop=threading.Event(),
        run_dir=str(run_dir),
    )
    reverify = Reverification(state, ResumedStore(str(state_dir / RESUMED_FILE)))
    journal = EventWriter(str(run_dir / "events.jsonl"), RUN)
    return Signer(run_dir, state, registry, journal, AnnouncedSigning(state), reverify, ResumeChecking(state, reverify))


@pytest.fixture
def signer(tmp_path):
    made = make_signer(tmp_path / "run")
    yield made
    made.journal.close()


def records(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def flip(path: Path, offset: int = 100, mask: int = 1) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ mask]))


def test_a_good_resumed_checkpoint_is_verified_and_recorded(signer, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    four = signer.save(4)
    resumed = RunResumed(from_step=4, checkpoint=str(four), verification="signature verified")
    assert signer.resume(resumed, step=4) is ExitCode.OK
    assert signer.resumed_checks("ok") == 1 and signer.invalid == 0
    assert signer.value("warden_signer_verifications_total", result="ok") == 1
    assert signer.value("warden_signer_hash_duration_seconds_count", operation="verify") == 1
    [line] = [r for r in records(caplog, logging.INFO) if "resumed" in r.getMessage()]
    assert line.getMessage().startswith(f"verified the resumed checkpoint of run '{RUN}' at step 4: OK")
    assert line.fields["path"] == str(four) and line.fields["resumed_step"] == 4  # type: ignore[attr-defined]


def test_a_flipped_byte_pages_names_run_and_step_and_outlives_a_restart(signer, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    two = signer.save(2)
    flip(two / "actor" / "model.safetensors")
    assert signer.resume(RunResumed(from_step=2, checkpoint=str(two)), step=2) is ExitCode.VIOLATION
    assert signer.invalid == 1 and signer.resumed_checks("failed") == 1
    assert signer.value("warden_signer_verify_failures_total", reason="files_mismatch") == 1
    assert signer.value("warden_signer_verifications_total", result="failed") == 1
    [error] = records(caplog, logging.ERROR)
    message = error.getMessage()
    assert f"re-verification failed for the resumed checkpoint of run '{RUN}' at step 2" in message
    assert "files differ from the signature: 1 modified" in message
    found = error.fields  # type: ignore[attr-defined]
    assert (found["path"], found["reason"], found["resumed_run_id"], found["resumed_step"]) == (
        str(two), "files_mismatch", RUN, 2,
    )  # fmt: skip
    # The signer restarts: the page goes on at once, and the first check verifies it again.
    again = signer.restart()
    assert again.invalid == 1
    assert again.reverify.check(time.time(), first=True) is ExitCode.VIOLATION
    assert again.invalid == 1 and again.value("warden_signer_verifications_total", result="failed") == 1
    assert again.resumed_checks("failed") == 0  # the event was handled once, before the restart
    flip(two / "actor" / "model.safetensors")  # restored
    third = again.restart()
    assert third.reverify.check(time.time(), first=True) is ExitCode.OK
    assert third.invalid == 0 and third.value("warden_signer_verifications_total", result="ok") == 1
    assert len(ResumedStore(str(third.run_dir / "state" / "signer" / RESUMED_FILE))) == 0
    third.journal.close()


def test_a_resume_handled_before_the_first_check_is_verified_once(signer):
    # The run.resumed can arrive in the same loop pass as startup, before the first check: that
    # check re-verifies what a previous process left failed, not what this one already judged.
    two = signer.save(2)
    flip(two / "actor" / "model.safetensors")
    os.symlink(two, signer.checkpoints / "step-000000006")
    assert signer.resume(RunResumed(from_step=2, checkpoint=str(two)), step=2) is ExitCode.VIOLATION
    assert signer.resume(RunResumed(from_step=6, checkpoint=str(signer.checkpoints / "step-000000006")), step=6) is (
        ExitCode.VIOLATION
    )
    assert signer.reverify.check(time.time(), first=True) is ExitCode.OK
    assert signer.value("warden_signer_verifications_total", result="failed") == 2
    assert signer.value("warden_signer_verify_failures_total", reason="files_mismatch") == 1
    assert signer.value("warden_signer_verify_failures_total", reason="unsafe_path") == 1
    assert signer.invalid == 2  # still paging
    again = signer.restart()  # a new process verifies both again on its first check
    assert again.reverify.check(time.time(), first=True) is ExitCode.VIOLATION
    assert again.value("warden_signer_verifications_total", result="failed") == 2
    again.journal.close()


def test_a_failed_resumed_checkpoint_is_in_every_periodic_round(tmp_path):
    signer = make_signer(tmp_path / "run", policy=SignerPolicy(sign_run_checkpoints=False))
    outside = signer.save(3, root=tmp_path / "elsewhere")  # signed from its event, no root watches it
    flip(outside / "trainer_state.json", 2)
    assert signer.resume(RunResumed(from_step=3, checkpoint=str(outside))) is ExitCode.VIOLATION
    signer.journal.close()
    periodic = make_signer(tmp_path / "run", signer.state.key, SignerPolicy(reverify_interval_seconds=60))
    assert periodic.invalid == 1
    assert periodic.reverify.check(time.time(), first=True) is ExitCode.VIOLATION
    assert periodic.value("warden_signer_verify_failures_total", reason="files_mismatch") == 1
    shutil.rmtree(outside)
    os.unlink(str(outside) + ".sig")  # removed with its .sig: pruned, no longer invalid
    assert periodic.reverify.check(time.time() + 61, first=False) is ExitCode.OK
    assert periodic.invalid == 0
    periodic.journal.close()


def test_every_trainer_s_run_resumed_is_checked(tmp_path):
    hf_root, verl_root = tmp_path / "hf-out", tmp_path / "verl-ckpts"
    policy = SignerPolicy(watch=(WatchRoot(str(hf_root), "hf"), WatchRoot(str(verl_root), "verl")))
    signer = make_signer(tmp_path / "run", policy=policy)
    four = signer.save(4)
    hf = signer.save(7, root=hf_root, name="checkpoint-7")
    verl = signer.save(5, root=verl_root, name="global_step_5")
    relative = {"from_step": 4, "checkpoint": "checkpoints/step-000000004"}  # relative to the run dir
    events = [
        (RunResumed(from_step=4, checkpoint=str(four), verification="signature verified"), 4),  # trainer/core.py
        (RunResumed(source="hf", from_step=7, checkpoint=str(hf), verification="not verified by the callback"), 7),
        (RunResumed(source="verl", from_step=5, checkpoint=str(verl), verification="not verified by the bridge"), 5),
        (RunResumed(source="verl", from_step=5, checkpoint=None), 5),  # the bridge saw no directory: by step
        (RunResumed(source="hf", from_step=7, checkpoint=None), 7),
        (relative, 4),
    ]
    for payload, step in events:
        assert signer.resume(payload, step=step) is ExitCode.OK, payload
    assert signer.resumed_checks("ok") == len(events) and signer.invalid == 0
    flip(hf / "trainer_state.json", 3)
    assert signer.resume(RunResumed(source="hf", from_step=7, checkpoint=None), step=7) is ExitCode.VIOLATION
    assert signer.invalid == 1
    # verl restarted without knowing where it went on from: nothing to verify, said so
    assert signer.resume(RunResumed(source="verl", from_step=None), step=None) is ExitCode.INCOMPLETE
    assert signer.resume(RunResumed(from_step=99), step=99) is ExitCode.INCOMPLETE
    assert signer.resumed_checks("unnamed") == 2
    signer.journal.close()


def test_a_missing_checkpoint_fails_unless_the_journal_pruned_it(signer):
    two, four = signer.save(2), signer.save(4)
    shutil.rmtree(four)
    assert signer.resume(RunResumed(from_step=4, checkpoint=str(four))) is ExitCode.VIOLATION
    assert signer.value("warden_signer_verify_failures_total", reason="checkpoint_missing") == 1
    assert signer.invalid == 1
    pruned = CheckpointPruned(path=str(two), step=2, reason="retention: keep_last 1")
    signer.journal.emit(pruned.TYPE, pruned.to_data(), step=2)
    shutil.rmtree(two)
    assert signer.resume(RunResumed(from_step=2, checkpoint=str(two))) is ExitCode.OK  # a replay after a long stop
    assert signer.resumed_checks("pruned") == 1 and signer.resumed_checks("failed") == 1


def test_a_deleted_or_broken_signature_fails(signer):
    two, four = signer.save(2), signer.save(4)
    os.unlink(str(two) + ".sig")
    assert signer.resume(RunResumed(from_step=2, checkpoint=str(two))) is ExitCode.VIOLATION
    assert signer.value("warden_signer_verify_failures_total", reason="signature_missing") == 1
    sig = Path(str(four) + ".sig")
    sig.write_bytes(sig.read_bytes()[: sig.stat().st_size // 2])
    assert signer.resume(RunResumed(from_step=4, checkpoint=str(four))) is ExitCode.VIOLATION
    assert signer.value("warden_signer_verify_failures_total", reason="malformed_bundle") == 1
    assert signer.invalid == 2 and signer.resumed_checks("failed") == 2


def test_hostile_paths_end_in_a_refusal_or_a_violation(signer, tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    four = signer.save(4)
    root = signer.checkpoints
    # (a step-N named where it does not exist is looked for in the run's own root, as for checkpoint.saved)
    assert signer.resume(RunResumed(from_step=4, checkpoint="/elsewhere/step-000000004")) is ExitCode.OK
    os.symlink(four, root / "step-000000006")
    shutil.copyfile(str(four) + ".sig", root / "step-000000006.sig")
    os.mkfifo(root / "step-000000008")
    os.mkfifo(root / "step-000000008.sig")
    (root / "step-000000010").write_bytes(b"a file")
    violations = ["step-000000006", "step-000000008", "step-000000010"]
    for name in violations:
        assert signer.resume(RunResumed(from_step=6, checkpoint=str(root / name))) is ExitCode.VIOLATION, name
    assert signer.value("warden_signer_verify_failures_total", reason="unsafe_path") == 3
    assert signer.invalid == 3
    refused = [
        str(root / "step-000000004\x1b[2K"),
        str(root / "step-000000004\nforged log line"),
        str(root / "step-\u202e000000004"),
        str(root / "step-00000000\x004"),
        str(root / ("step-" + "1" * 5000)),
        "/" + "a/" * 3000,
        str(root / "step-000000004" / ".." / ".." / ".." / "etc"),
        str(root / ("step-" + "1" * 300)),  # longer than any file name: not parsed as a step
        str(write_tree(tmp_path / "elsewhere" / "step-000000004", FILES)),
        str(tmp_path / "elsewhere" / "checkpoint-4"),
        str(root / "not-a-checkpoint"),
        "",
        42,
        ["a", "list"],
    ]
    for raw in refused:
        assert signer.resume({"from_step": 4, "checkpoint": raw}) is ExitCode.INCOMPLETE, raw
    assert signer.resumed_checks("refused") == len(refused)
    assert signer.resumed_checks("failed") == len(violations) and signer.invalid == 3
    for record in records(caplog, logging.ERROR):
        shown = record.getMessage()
        assert "\n" not in shown and "\x1b" not in shown and "\u202e" not in shown and len(shown) < 1500
        assert "\n" not in str(record.fields.get("path", ""))  # type: ignore[attr-defined]


def test_stopping_mid_hash_leaves_the_event_for_the_next_start(signer):
    four = signer.save(4)
    signer.state.stop.set()
    with pytest.raises(TryAgainLater):
        signer.resume(RunResumed(from_step=4, checkpoint=str(four)))
    assert signer.resumed_checks("ok") == signer.resumed_checks("failed") == 0


def test_the_resumed_store_is_strict(tmp_path):
    path = tmp_path / "resumed.json"
    path.write_text('{"checkpoints": {"relative": {}, "/a/step-000000001": {"step": true}}}')
    assert len(ResumedStore(str(path))) == 0
    path.write_text("{not json")
    assert ResumedStore(str(path)).load_error is not None


# -- generated damage: every change to a signed checkpoint's bytes or names is a violation ---------
DAMAGE = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("rename"), st.integers(0, 10**6), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.just(0), st.just(0)),
    st.tuples(st.just("add"), st.integers(0, 10**6), st.integers(0, 64), st.just(0)),
    st.tuples(st.just("gone"), st.just(0), st.just(0), st.just(0)),
)


def damage(directory: Path, how: tuple[str, int, int, int]) -> None:
    kind, pick, amount, mask = how
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    target = files[pick % len(files)]
    size = target.stat().st_size
    if kind == "flip":
        flip(target, amount % size, mask)
    elif kind == "truncate":
        os.truncate(target, amount % size)
    elif kind == "rename":
        os.rename(target, target.with_name(f"{target.name}.renamed-{amount}"))
    elif kind == "delete":
        target.unlink()
    elif kind == "add":
        (target.parent / f"planted-{amount}.bin").write_bytes(b"x" * amount)
    else:
        os.rename(directory, directory.with_name(".moved-" + directory.name))


@EXAMPLES
@given(how=DAMAGE)
def test_any_damage_to_a_signed_resumed_checkpoint_is_a_violation(how):
    with tempfile.TemporaryDirectory() as tmp:
        signer = make_signer(Path(tmp) / "run")
        try:
            four = signer.save(4)
            damage(four, how)
            assert signer.resume(RunResumed(from_step=4, checkpoint=str(four)), step=4) is ExitCode.VIOLATION
            assert signer.resumed_checks("failed") == 1 and signer.invalid == 1
        finally:
            signer.journal.close()
