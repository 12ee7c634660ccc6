"""The signer sidecar's parts in process: discovery, stability, policy, races made deterministic."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warden.signer.operations as signer_operations
from sidecars.runner import Runner
from sidecars.runtime import Outcome, SidecarContext
from sidecars.signer.sidecar import SignerSidecar
from warden.policy import PolicyError, policy_from_mapping
from warden.signer.policy import SignerPolicy
from warden.signer.runs import RunRegistry
from warden.signer.watch import (
    Candidate,
    RootWatcher,
    StabilityTracker,
    TreeState,
    completion_blocker,
    layout_of,
    list_checkpoints,
    read_tracker,
    remove_stale_signature_temps,
    tree_state,
)

REAL_SIGN = signer_operations.sign_checkpoint


def test_layouts_and_listing_skip_temporaries_links_and_files(tmp_path):
    assert layout_of("step-000000050") == ("warden", 50)
    assert layout_of("checkpoint-500") == ("hf", 500)
    assert layout_of("global_step_7") == ("verl", 7)
    assert layout_of(".tmp-step-000000050") is None and layout_of("tmp-checkpoint-5") is None
    for name in ("checkpoint-2", "checkpoint-10", "tmp-checkpoint-20", "checkpoint-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-30").write_text("a file")
    os.symlink(tmp_path / "checkpoint-2", tmp_path / "checkpoint-40")
    assert [c.step for c in list_checkpoints(str(tmp_path), "hf")] == [2, 10]
    assert list_checkpoints(str(tmp_path / "absent"), "hf") == []


def test_verl_tracker_and_completion(tmp_path):
    assert read_tracker(str(tmp_path)) is None
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    for text, expected in (("", None), ("1", 1), ("12\n", 12), ("1 2", None), ("-3", None), ("abc", None)):
        tracker.write_text(text)
        assert read_tracker(str(tmp_path)) == expected, text
    verl = Candidate(str(tmp_path / "global_step_12"), 12, "verl")
    assert completion_blocker(verl, 12) is None
    assert "not the step named" in (completion_blocker(verl, 10) or "")
    hf = Candidate(str(tmp_path / "checkpoint-3"), 3, "hf")
    os.mkdir(hf.path)
    assert "trainer_state.json" in (completion_blocker(hf, None) or "")
    Path(hf.path, "trainer_state.json").write_text("{}")
    assert completion_blocker(hf, None) is None
    assert completion_blocker(Candidate(str(tmp_path / "step-000000001"), 1, "warden"), None) is None


def test_tree_state_sees_size_and_mtime_changes(tmp_path):
    root = tmp_path / "checkpoint-1"
    assert tree_state(str(root)) is None
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.bin").write_bytes(b"abc")
    first = tree_state(str(root))
    assert first is not None and len(first.fingerprint) == 3  # root, sub, sub/a.bin
    assert abs(first.last_change - time.time()) < 5
    os.utime(root / "sub" / "a.bin", ns=(0, 12345))
    touched = tree_state(str(root))
    assert touched is not None and touched.fingerprint != first.fingerprint
    extra = tmp_path / "tracker.txt"
    extra.write_text("1")
    with_extra = tree_state(str(root), [str(extra)])
    assert with_extra is not None and any(entry[0] == str(extra) for entry in with_extra.fingerprint)


def test_stability_needs_a_quiet_fingerprint_or_old_mtimes():
    tracker = StabilityTracker(10.0)
    fresh = TreeState((("a", 1, 1),), last_change=1000.0)
    assert tracker.remaining("p", fresh, 1000.0) == 10.0
    assert tracker.remaining("p", fresh, 1004.0) == 6.0
    changed = TreeState((("a", 2, 2),), last_change=1005.0)
    assert tracker.remaining("p", changed, 1006.0) == 9.0  # a change restarts the quiet period
    assert tracker.remaining("p", changed, 1016.0) <= 0
    old = TreeState((("b", 1, 1),), last_change=500.0)
    assert tracker.remaining("q", old, 1000.0) <= 0  # first seen, but untouched for long (a --once pass)
    tracker.forget(["q"])
    assert tracker.remaining("p", changed, 1017.0) == 10.0 - 12.0  # forgotten: judged by mtime only


def test_stale_signature_temporaries_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    left = tmp_path / f".tmp-step-000000002.sig.{dead_pid}.140"
    mine = tmp_path / f".tmp-step-000000004.sig.{os.getpid()}.140"
    alive_fresh = tmp_path / f".tmp-step-000000006.sig.{os.getppid()}.140"
    other = tmp_path / ".tmp-step-000000008"
    for path in (left, mine, alive_fresh):
        path.write_text("{")
        os.utime(path, (time.time() - 5, time.time() - 5))
    other.mkdir()
    removed = remove_stale_signature_temps(str(tmp_path))
    assert removed == [str(left)]
    assert mine.exists() and alive_fresh.exists() and other.exists()
    assert remove_stale_signature_temps(str(tmp_path), now=time.time() + 3600) == [str(alive_fresh)]


def test_policy_validation_names_the_key(tmp_path, monkeypatch):
    with pytest.raises(PolicyError, match=r"watch\[0\]: layout: expected one of warden, hf, verl"):
        policy_from_mapping({"version": 1, "watch": [{"path": "/x", "layout": "megatron"}]}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="listed twice"):
        policy_from_mapping({"version": 1, "watch": [{"path": "/x"}, {"path": "/x/"}]}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="stable_seconds: must be >= 0"):
        policy_from_mapping({"version": 1, "stable_seconds": -1}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="hash_workers"):
        policy_from_mapping({"version": 1, "hash_workers": 0}, SignerPolicy, "p.yaml")
    policy = policy_from_mapping({"version": 1, "signing_key": "~/k.pem"}, SignerPolicy, "p.yaml")
    assert policy.key_path({}) == os.path.expanduser("~/k.pem")
    assert policy.key_path({"WARDEN_SIGNING_KEY": str(tmp_path / "env.key")}) == str(tmp_path / "env.key")
    assert SignerPolicy().key_path({}) is None
    root = policy_from_mapping({"version": 1, "watch": [{"path": str(tmp_path / "exp1")}]}, SignerPolicy).watch[0]
    assert (root.layout, root.effective_run_id) == ("hf", "exp1")


def test_run_registry_survives_a_restart(tmp_path):
    path = str(tmp_path / "state" / "runs.json")
    runs = RunRegistry(path)
    runs.record("r1", "1.0")
    runs.record("r1", None)  # a checkpoint event without version keeps the known one
    runs.record("r2", None)
    again = RunRegistry(path)
    assert again.version("r1") == "1.0" and again.version("r2") is None and again.last_run_id == "r2"
    Path(path).write_text("{not json")
    assert RunRegistry(path).versions == {}


def test_root_watcher_marks_changes_but_not_signature_writes(tmp_path):
    watcher = RootWatcher([str(tmp_path / "later"), str(tmp_path)])
    try:
        assert watcher.refresh() is True
        (tmp_path / "checkpoint-1.sig").write_text("{}")
        time.sleep(0.3)
        assert watcher.take_dirty() == set()
        (tmp_path / "checkpoint-1").mkdir()
        deadline = time.monotonic() + 5
        while str(tmp_path) not in watcher.take_dirty():
            assert time.monotonic() < deadline, "no inotify event seen"
            time.sleep(0.02)
        (tmp_path / "later").mkdir()
        assert watcher.refresh() is True
    finally:
        watcher.close()


# -- races made deterministic by wrapping the library call --------------------------------------


def _sidecar(signer_kit, tmp_path, **fields: object) -> tuple[SignerSidecar, SidecarContext]:
    policy = policy_from_mapping(
        {"version": 1, "signing_key": str(signer_kit.key), "stable_seconds": 0, **fields}, SignerPolicy
    )
    ctx = SidecarContext(
        name="signer", state_dir=str(tmp_path / "state"), run_dir=str(signer_kit.run_dir), policy=policy
    )
    return SignerSidecar(ctx, use_watchdog=False), ctx


def test_a_signature_written_as_the_directory_vanished_is_removed(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    path = kit.save_checkpoint(2)

    def sign_then_prune(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = REAL_SIGN(*args, **kwargs)
        os.rename(path, path.parent / ".del-step-000000002")  # retention, after the last file was read
        return result

    monkeypatch.setattr(signer_operations, "sign_checkpoint", sign_then_prune)
    sidecar, ctx = _sidecar(kit, tmp_path)
    assert Runner(sidecar).run_once() is Outcome.OK
    assert kit.signatures(kit.checkpoints) == []
    assert ctx.registry.get_sample_value("warden_signer_errors_total", {"kind": "checkpoint_vanished"}) == 1
    assert ctx.registry.get_sample_value("warden_signer_signed_total", {"layout": "warden"}) == 0
    assert ctx.registry.get_sample_value("warden_sidecar_events_processed_total", {"sidecar": "signer"}) == 1


def test_an_hf_checkpoint_changed_while_signed_is_signed_again_later(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    root = tmp_path / "hf"
    directory = kit.write_hf(root, 7)
    calls = []

    def sign_while_writing(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = REAL_SIGN(*args, **kwargs)
        if not calls:
            with open(directory / "optimizer.pt", "ab") as fh:
                fh.write(b"late bytes")
        calls.append(1)
        return result

    monkeypatch.setattr(signer_operations, "sign_checkpoint", sign_while_writing)
    sidecar, ctx = _sidecar(kit, tmp_path, watch=[{"path": str(root), "layout": "hf"}])
    assert sidecar.check() is Outcome.OK
    assert kit.signatures(root) == []
    assert ctx.registry.get_sample_value("warden_signer_errors_total", {"kind": "checkpoint_changed"}) == 1
    assert ctx.registry.get_sample_value("warden_signer_unsigned_checkpoints") == 1
    assert sidecar.check() is Outcome.OK
    assert [p.name for p in kit.signatures(root)] == ["checkpoint-7.sig"]
    assert kit.verify(directory)
    assert ctx.registry.get_sample_value("warden_signer_unsigned_checkpoint_age_seconds") == 0
    sidecar.close()


def test_cancel_during_hashing_keeps_the_event_for_later(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    kit.save_checkpoint(2, {"big.bin": 8 << 20, "trainer_state.json": 0})

    def stop_midway(*args, **kwargs):  # type: ignore[no-untyped-def]
        progress = kwargs["progress"]

        def and_stop(done: int, total: int) -> None:
            progress(done, total)
            kwargs["cancel"].set()

        return REAL_SIGN(*args, **{**kwargs, "progress": and_stop})

    monkeypatch.setattr(signer_operations, "sign_checkpoint", stop_midway)
    sidecar, ctx = _sidecar(kit, tmp_path, hash_workers=1)
    runner = Runner(sidecar)
    assert runner.run_once() is Outcome.INCOMPLETE
    assert runner.cursor_store.load().seq == 0
    assert kit.signatures(kit.checkpoints) == []
    assert 0 < ctx.registry.get_sample_value("warden_signer_hashed_bytes_total", {"operation": "sign"}) < 8 << 20
