"""Checkpoint storage running full, on a real size-limited filesystem (tmpfs) with the tiny model:
each ``checkpoint.on_no_space`` mode, and ENOSPC in the middle of a save (sync and async), which
leaves the previous checkpoints intact, announced and resumable, and never an internal error."""

from __future__ import annotations

import os

import pytest

from tests.trainer import checkpoint_files
from trainer import checkpoint as ckpt
from trainer import core, space
from trainer.core import NoSpaceForCheckpoint, PPOTrainer
from warden import journal as ev
from warden.payloads import CheckpointRejection, CheckpointSkipped

MARGIN = 1 << 20  # the production margin (64 MiB) would dwarf the tiny model's checkpoints


@pytest.fixture(scope="module")
def checkpoint_bytes(tiny_cache, tmp_path_factory):
    """Bytes on disk of one tiny-model checkpoint (the filesystems below are sized in them)."""
    import yaml
    from support import TEST_CONFIG, merge

    from trainer.config import load_config

    cache, _ = tiny_cache
    base = tmp_path_factory.mktemp("size")
    raw = merge(
        TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}, "max_steps": 1, "checkpoint": {"every_steps": 1}}
    )
    (base / "c.yaml").write_text(yaml.safe_dump(raw))
    trainer = PPOTrainer(load_config(str(base / "c.yaml")), str(base / "run"), serve_metrics=False)
    try:
        trainer.train(1)
    finally:
        trainer.close()
    return space.tree_bytes(str(base / "run" / "checkpoints" / ckpt.step_dir_name(1)))


def _events(run_dir, etype):
    return [e for e, _ in ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME)).read_available() if e.type == etype]


def _trainer(make_config, run_dir, root, mode="prune_first", async_save="off", keep_last=2, resume="never"):
    cfg, _ = make_config(
        {
            "max_steps": 4,
            "run": {"run_id": "space-run"},
            "checkpoint": {
                "root": root,
                "every_steps": 1,
                "keep_last": keep_last,
                "on_no_space": mode,
                "async_save": async_save,
                "write_retries": 1,
            },
        }
    )
    return PPOTrainer(cfg, str(run_dir), resume=resume, serve_metrics=False)


def _value(trainer, name, **labels):
    return trainer.metrics.registry.get_sample_value(name, labels or None)


@pytest.fixture(autouse=True)
def small_margin(monkeypatch):
    monkeypatch.setattr(core, "SPACE_MARGIN_BYTES", MARGIN)


def test_prune_first_removes_the_oldest_before_the_write_and_keeps_saving(
    make_config, small_fs, checkpoint_bytes, tmp_path
):
    root = small_fs(int(2.6 * checkpoint_bytes) + MARGIN)  # room for two, never three
    trainer = _trainer(make_config, tmp_path / "run", root)
    try:
        trainer.train(4)
        assert _value(trainer, "warden_trainer_checkpoint_skipped_total", reason="no_space") == 0
    finally:
        trainer.close()
    steps = [r.step for r in ckpt.list_complete(root)]
    assert steps == [4, 3]
    pruned = _events(tmp_path / "run", ev.CHECKPOINT_PRUNED)
    assert any("on_no_space: prune_first" in e.data["reason"] for e in pruned), [e.data for e in pruned]
    saved = {e.step for e in _events(tmp_path / "run", ev.CHECKPOINT_SAVED)}
    assert saved == {1, 2, 3, 4}
    assert {e.step for e in pruned} == {1, 2}  # every removal announced: no violation for the signer
    for ref in ckpt.list_complete(root):
        assert checkpoint_files.verify_manifest(ref.path) == []


def test_skip_saves_nothing_pages_and_trains_on(make_config, small_fs, checkpoint_bytes, tmp_path):
    root = small_fs(int(2.6 * checkpoint_bytes) + MARGIN)
    trainer = _trainer(make_config, tmp_path / "run", root, mode="skip")
    try:
        trainer.train(4)
        assert trainer.step == 4
        assert _value(trainer, "warden_trainer_checkpoint_skipped_total", reason="no_space") == 2
        free = _value(trainer, "warden_trainer_checkpoint_space_free_bytes")
        needed = _value(trainer, "warden_trainer_checkpoint_space_needed_bytes")
        assert free < needed  # what WardenCheckpointSpaceInsufficient compares (reclaimable is 0 in skip)
        assert _value(trainer, "warden_trainer_checkpoint_space_reclaimable_bytes") == 0
    finally:
        trainer.close()
    assert [r.step for r in ckpt.list_complete(root)] == [2, 1]
    skipped = [CheckpointSkipped.from_data(e.data) for e in _events(tmp_path / "run", ev.CHECKPOINT_SKIPPED)]
    assert [s.path.endswith(ckpt.step_dir_name(n)) for s, n in zip(skipped, (3, 4), strict=True)] == [True, True]
    assert all(s.free_bytes < s.needed_bytes and "on_no_space is skip" in s.reason for s in skipped)


def test_fail_stops_cleanly_with_exit_1_naming_the_checkpoint(make_config, small_fs, checkpoint_bytes, tmp_path):
    root = small_fs(int(1.6 * checkpoint_bytes) + MARGIN)
    trainer = _trainer(make_config, tmp_path / "run", root, mode="fail")
    try:
        with pytest.raises(NoSpaceForCheckpoint, match=r"step-000000002: not saved: .*on_no_space is fail") as err:
            trainer.train(4)
        assert err.value.exit_code == 1
    finally:
        trainer.close()
    assert [r.step for r in ckpt.list_complete(root)] == [1]
    finished = _events(tmp_path / "run", ev.RUN_FINISHED)[-1]
    assert finished.data["status"] == "failed" and "NoSpaceForCheckpoint" in finished.data["error"]


@pytest.mark.parametrize("async_save", ["off", "on"])
def test_enospc_mid_save_leaves_the_previous_checkpoint_and_resume_finds_it(
    make_config, small_fs, checkpoint_bytes, tmp_path, monkeypatch, async_save
):
    root = small_fs(int(1.5 * checkpoint_bytes) + MARGIN)
    # The planner is told there is room, so the save starts and the filesystem itself runs out mid-write.
    monkeypatch.setattr(space, "free_bytes", lambda _root: 1 << 40)
    run_dir = tmp_path / "run"
    trainer = _trainer(make_config, run_dir, root, async_save=async_save)
    try:
        trainer.train(2)
        assert trainer.saver.asynchronous is (async_save == "on")
        assert _value(trainer, "warden_trainer_checkpoint_skipped_total", reason="write_failed") == 1
        assert _value(trainer, "warden_trainer_checkpoint_write_failures_total") == 2  # write_retries: 1
    finally:
        trainer.close()
    names = os.listdir(root)
    assert names == [ckpt.step_dir_name(1)], names  # the temporary directory is gone
    assert checkpoint_files.verify_manifest(os.path.join(root, names[0])) == []
    (rejected,) = [CheckpointRejection.from_data(e.data) for e in _events(run_dir, ev.CHECKPOINT_REJECTED)]
    assert rejected.path == os.path.join(root, ckpt.step_dir_name(2)) and rejected.errno == "ENOSPC"
    assert rejected.needed_bytes is not None and rejected.needed_bytes > 0 and "No space left" in rejected.why
    assert _events(run_dir, ev.RUN_FINISHED)[-1].data["status"] == "completed"

    monkeypatch.undo()
    resumed = _trainer(make_config, run_dir, root, async_save=async_save, resume="auto")
    try:
        assert resumed.resumed is not None and resumed.step == 1
    finally:
        resumed.close()
