"""Attacks an independent red team designed against the trust-by-construction work, kept as tests.

Each was a break before its fix: planted names driving HF's rotation bookkeeping, a FIFO or a link to
/dev/zero where the signer reads a watched checkpoint's state, an announced HF checkpoint deleted
from a watched root, a symlinked directory redirecting file:// store writes, and storage-chosen names
forging log lines. (Retention driven by planted directories, step-name aliases and deep trees at
resume are in test_resume_attacks.py.)
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from warden import journal as ev
from warden.archive.errors import StoreError
from warden.archive.record import head_key, step_key
from warden.archive.store import open_store
from warden.logs import JsonFormatter, SafeTextFormatter
from warden.signing.keys import generate_keypair

ROOT = Path(__file__).resolve().parents[2]


def test_no_log_line_carries_a_storage_chosen_newline_or_escape():
    name = "step-000000004\n rejected: forged line\x1b[2K\u202e"
    for formatter in (SafeTextFormatter("%(levelname)s %(name)s: %(message)s"), JsonFormatter()):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        logger = logging.getLogger(f"warden.test.redteam.{id(formatter)}")
        logger.addHandler(handler)
        logger.propagate = False
        logger.warning("checkpoint %s rejected: %s", name, "why")
        text = stream.getvalue()
        assert text.count("\n") == 1 and "\x1b" not in text and "\u202e" not in text, text


@pytest.mark.parametrize("kind", ["fifo", "endless_device"])
def test_a_watched_checkpoints_state_file_never_hangs_or_exhausts_the_signer(tmp_path, kind):
    keys = generate_keypair(tmp_path / "keys")
    run, watched = tmp_path / "run", tmp_path / "watched"
    step = watched / "step-000000007"
    step.mkdir(parents=True)
    run.mkdir()
    (step / "weights.bin").write_bytes(b"x" * 100)
    state = step / "trainer_state.json"
    os.mkfifo(state) if kind == "fifo" else os.symlink("/dev/zero", state)
    old = time.time() - 3600
    for path in (step / "weights.bin", step):
        os.utime(path, (old, old), follow_symlinks=False)
    policy = tmp_path / "signer.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "signing_key": keys.private_key,
                "stable_seconds": 0.2,
                "check_interval_seconds": 0.05,
                "rescan_seconds": 0.5,
                "reverify_interval_seconds": 0,
                "watch": [{"path": str(watched), "layout": "warden"}],
            }
        )
    )
    cmd = [sys.executable, "-m", "sidecars.cli", "sidecar", "run", "signer", "--once", "--run-dir", str(run)]
    done = subprocess.run([*cmd, "--policy", str(policy)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (0, 1), done.stderr[-2000:]


def _hf_save(callback, out: Path, step: int, limit: int | None) -> None:
    directory = out / f"checkpoint-{step}"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(os.urandom(64))
    (directory / "trainer_state.json").write_text("{}")
    args = types.SimpleNamespace(output_dir=str(out), save_total_limit=limit, world_size=1, save_only_model=False)
    state = types.SimpleNamespace(global_step=step, is_world_process_zero=True, best_model_checkpoint=None)
    callback.on_save(args, state, None)


def test_planted_hf_checkpoints_never_explain_a_deletion(tmp_path):
    pytest.importorskip("transformers")
    from trainer.integrations.hf import WardenCallback

    out, run = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    callback = WardenCallback(run_dir=str(run), run_id="hf-run", settle_seconds=0)
    _hf_save(callback, out, 10, 3)
    _hf_save(callback, out, 20, 3)
    shutil.rmtree(out / "checkpoint-20")  # the storage writer's deletion...
    for plant in ("checkpoint-98", "checkpoint-99"):  # ...dressed up as rotation
        (out / plant).mkdir()
    _hf_save(callback, out, 30, 3)
    callback.close()
    events = [e for e, _ in ev.JournalReader(str(run / ev.JOURNAL_NAME)).read_available()]
    assert [e.step for e in events if e.type == ev.CHECKPOINT_PRUNED] == []


def test_an_announced_hf_checkpoint_deleted_from_a_watched_root_pages(tmp_path):
    pytest.importorskip("transformers")
    from trainer.integrations.hf import WardenCallback

    keys = generate_keypair(tmp_path / "keys")
    out, run = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    callback = WardenCallback(run_dir=str(run), run_id="hf-run", settle_seconds=0)
    _hf_save(callback, out, 10, None)
    _hf_save(callback, out, 20, None)
    callback.close()
    policy = tmp_path / "signer.yaml"
    fields = {"version": 1, "signing_key": keys.private_key, "stable_seconds": 0, "reverify_interval_seconds": 0}
    policy.write_text(yaml.safe_dump({**fields, "watch": [{"path": str(out), "layout": "hf", "run_id": "hf-run"}]}))
    cmd = [sys.executable, "-m", "sidecars.cli", "sidecar", "run", "signer", "--once", "--run-dir", str(run)]
    first = subprocess.run([*cmd, "--policy", str(policy)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (out / "checkpoint-20.sig").exists()
    shutil.rmtree(out / "checkpoint-20")
    os.unlink(out / "checkpoint-20.sig")
    again = subprocess.run([*cmd, "--policy", str(policy)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 1, again.stderr[-2000:]
    assert "removed_without_retention" in again.stderr


def test_a_symlinked_directory_in_a_file_store_never_redirects_a_write(tmp_path):
    bucket, private = tmp_path / "bucket", tmp_path / "sidecar-private"
    bucket.mkdir()
    private.mkdir(mode=0o700)
    store = open_store(f"file://{bucket}")
    store.put(head_key("run-x"), b"{}")
    shutil.rmtree(bucket / "runs" / "run-x")
    os.symlink(private, bucket / "runs" / "run-x")
    for write in (lambda: store.put(head_key("run-x"), b"{}"), lambda: store.create(step_key("run-x", 4), b"{}")):
        with pytest.raises(StoreError, match="is a link"):
            write()
    assert list(private.rglob("*")) == []


@pytest.mark.parametrize(
    "name",
    ["a\x1b[31mred", "evil\u202egnp.txt", "line\rOK: verified", "c\x9b2J", "z\nOK step-000000002: all files match"],
)
def test_checkpoint_verify_never_prints_a_storage_chosen_control_character(tmp_path, name):
    from click.testing import CliRunner

    from sidecars.cli import cli
    from warden.signing import load_private_key, sign_checkpoint

    keys = generate_keypair(tmp_path / "keys")
    directory = tmp_path / "ck" / "step-000000002"
    directory.mkdir(parents=True)
    (directory / name).write_bytes(b"signed")
    sign_checkpoint(str(directory), load_private_key(keys.private_key))
    (directory / name).write_bytes(b"changed")
    result = CliRunner().invoke(cli, ["checkpoint", "verify", str(directory), "--trust", keys.public_key], color=True)
    assert result.exit_code == 1
    shown = result.output
    assert "modified" in shown
    assert not any(c in shown for c in "\x1b\u202e\r\x9b"), repr(shown)
    assert not any(line.startswith("OK") for line in shown.splitlines()), shown


# -- round 2 ---------------------------------------------------------------------------------------
def _written(tmp_path, shard_size=None):
    from trainer import checkpoint as ckpt

    files = {"actor/model.safetensors": os.urandom((1 << 20) * 2 + 100), "critic/critic.safetensors": b"c" * 50}
    return ckpt.write_checkpoint(
        str(tmp_path / "ckpt"), 4, lambda w: [w.bytes(n, c) for n, c in files.items()], shard_size
    )


@pytest.mark.parametrize("shard_size", [None, 1 << 20])
@pytest.mark.parametrize("change", ["rename_in_order", "split_at_a_shard", "empty_file_added"])
def test_the_announcement_binds_file_names_not_only_bytes(tmp_path, shard_size, change):
    """model_signing's root covers digests in name order only: a rename that keeps the order, a split
    at a shard boundary or an added empty file left it unchanged. The names digest refuses them."""
    from warden.signing import load_private_key, sign_checkpoint
    from warden.signing.errors import AnnouncementMismatch
    from warden.signing.manifest import FILES_SHA256, SHARDS_METHOD, Serialization

    written = _written(tmp_path, shard_size)
    directory = Path(written.path)
    if change == "rename_in_order":
        os.rename(directory / "critic" / "critic.safetensors", directory / "critic" / "critic.safetensors.bak")
    elif change == "split_at_a_shard":
        data = (directory / "actor" / "model.safetensors").read_bytes()
        (directory / "actor" / "model.safetensors").write_bytes(data[: 2 << 20])
        (directory / "actor" / "model.safetensors0").write_bytes(data[2 << 20 :])
    else:
        (directory / "config.json").write_bytes(b"")
    serialization = FILES_SHA256 if shard_size is None else Serialization(SHARDS_METHOD, "sha256", shard_size)
    key = load_private_key(generate_keypair(tmp_path / "keys").private_key)
    try:
        sign_checkpoint(str(directory), key, expected=written.announced, serialization=serialization)
    except AnnouncementMismatch:
        return  # refused: the names differ (or, for a split in files mode, the bytes do)
    raise AssertionError(f"{change} was signed")


def test_resume_refuses_signed_files_that_are_not_the_trainers_manifest(tmp_path):
    """Even a signature over renamed files (made by a signer that trusted the announcement less) does
    not resume: the signed files must be exactly those of the trainer's own manifest."""
    from trainer.resume import check_own_manifest
    from trainer.verified_load import Anchor, CheckpointRejected, VerifiedCheckpoint

    written = _written(tmp_path)
    directory = Path(written.path)
    files = {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}

    def signed_over(contents):  # what a files-serialization signature over ``contents`` vouches for
        return Anchor({n: hashlib.sha256(c).hexdigest() for n, c in contents.items()}, "signed", True)

    check_own_manifest(VerifiedCheckpoint(str(directory), 4, signed_over(files), files))
    files["critic/critic.safetensors.bak"] = files.pop("critic/critic.safetensors")
    with pytest.raises(CheckpointRejected, match="differ from the trainer's manifest"):
        check_own_manifest(VerifiedCheckpoint(str(directory), 4, signed_over(files), files))
