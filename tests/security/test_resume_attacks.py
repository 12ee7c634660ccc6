"""Attacks on resume by someone who can write the checkpoint storage but not read the key.

One real run (tiny offline model, CPU) writes step-2 and step-4; they are signed with a
real key and a provenance chain, like the signer sidecar does. Each test attacks a copy
and resumes: every attack ends in ``checkpoint.rejected`` and a refusal (exit 1), never
in a silent resume from the attacked bytes.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
import yaml
from support import TEST_CONFIG, merge, run_warden

from tests.trainer import checkpoint_files

torch = pytest.importorskip("torch")

from trainer.config import load_config  # noqa: E402
from trainer.core import PPOTrainer  # noqa: E402
from trainer.models import unwrap  # noqa: E402
from trainer.resume import ResumeRefused, find_resume_point  # noqa: E402
from warden import journal as ev  # noqa: E402
from warden.errors import EXIT_VIOLATION, ConfigError  # noqa: E402
from warden.payloads import CheckpointPruned  # noqa: E402
from warden.safeio import remove_tree_at  # noqa: E402
from warden.signing import Provenance, generate_keypair, load_private_key, sign_checkpoint  # noqa: E402

STEP2, STEP4 = "step-000000002", "step-000000004"
ACTOR = os.path.join("actor", "model.safetensors")


class Kit:
    """The signed run, the key and configs; ``copy()`` gives a fresh run directory to attack."""

    def __init__(self, base, cache: str) -> None:
        self.base = base
        self.keys = generate_keypair(str(base / "keys"))
        self.key = load_private_key(self.keys.private_key)
        self.cache = cache
        self.run_a = ""  # set by the fixture once run A has trained
        self.config = self.write_config("trusted.yaml", {"trusted_keys": str(self.keys.public_key)})
        self.integrity_config = self.write_config("integrity.yaml", {})

    def write_config(self, name: str, checkpoint: dict, run: dict | None = None) -> str:
        raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": self.cache}}, "max_steps": 4})
        raw = merge(raw, {"checkpoint": {"every_steps": 2, "keep_last": 3, **checkpoint}, "run": run or {}})
        path = self.base / name
        path.write_text(yaml.safe_dump(raw))
        return str(path)

    def train_and_sign(self, run_dir: str, config: str) -> str:
        trainer = PPOTrainer(load_config(config), run_dir)
        trainer.train(4)
        run_id = trainer.run_id
        trainer.close()
        parent = None
        for name in (STEP2, STEP4):
            parent = self.sign(os.path.join(run_dir, "checkpoints", name), run_id, int(name[5:]), parent)
        return run_id

    def sign(self, path: str, run_id: str, step: int, parent: str | None) -> str:
        provenance = Provenance(run_id=run_id, step=step, trainer_version="test", parent_root_digest=parent)
        return sign_checkpoint(path, self.key, provenance).root_digest

    def copy(self, tmp_path, source: str = "run-a") -> str:
        target = str(tmp_path / "run")
        shutil.copytree(str(self.base / source), target, symlinks=True)
        return target


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from trainer.assets import ensure_tiny_assets
    from trainer.config import TinyAssets

    cache = tmp_path_factory.mktemp("tiny-assets")
    ensure_tiny_assets(TinyAssets(cache_dir=str(cache), **TEST_CONFIG["model"]["tiny"]))
    made = Kit(tmp_path_factory.mktemp("signed-runs"), str(cache))
    made.run_a = made.train_and_sign(str(made.base / "run-a"), made.config)
    other = made.write_config("run-b.yaml", {}, run={"run_id": "run-b", "seed": 11})
    made.train_and_sign(str(made.base / "run-b"), other)
    return made


def checkpoints(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def delete_checkpoint(run_dir: str, name: str) -> None:
    """The storage writer's deletion: the checkpoint and its signature gone, nothing in the journal."""
    path = os.path.join(checkpoints(run_dir), name)
    shutil.rmtree(path)
    os.unlink(path + ".sig")


def remove_checkpoint(run_dir: str, name: str) -> None:
    """Retention's removal: announced with checkpoint.pruned first, as the trainer does."""
    path = os.path.join(checkpoints(run_dir), name)
    journal = os.path.join(run_dir, ev.JOURNAL_NAME)
    run_id = next(e.run_id for e, _ in ev.JournalReader(journal).read_available())
    with ev.EventWriter(journal, run_id) as writer:
        pruned = CheckpointPruned(path=path, step=int(name[5:]), reason="retention: keep_last 1")
        writer.emit(pruned.TYPE, pruned.to_data(), step=pruned.step)
    delete_checkpoint(run_dir, name)


def rejections(run_dir: str) -> list:
    reader = ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME))
    return [e for e, _ in reader.read_available() if e.type == ev.CHECKPOINT_REJECTED]


def refused(kit: Kit, run_dir: str, resume: str = "auto", past_missing: bool = False) -> ResumeRefused:
    with pytest.raises(ResumeRefused) as caught:
        PPOTrainer(load_config(kit.config), run_dir, resume=resume, resume_past_missing=past_missing)
    assert caught.value.exit_code == EXIT_VIOLATION
    return caught.value


def weights(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def assert_actor_equals(trainer: PPOTrainer, expected: dict) -> None:
    state = unwrap(trainer.actor).state_dict()
    different = [k for k, v in expected.items() if not torch.equal(state[k], v)]
    assert different == []


def test_deleted_signature_with_a_rewritten_manifest_is_refused(kit, tmp_path):
    from safetensors.torch import save_file

    from trainer import checkpoint as ckpt

    run_dir = kit.copy(tmp_path)
    for name in (STEP2, STEP4):
        target = os.path.join(checkpoints(run_dir), name)
        poisoned = {k: torch.zeros_like(v) for k, v in weights(os.path.join(target, ACTOR)).items()}
        save_file(poisoned, os.path.join(target, ACTOR))
        os.unlink(target + ".sig")
        os.unlink(os.path.join(target, ckpt.MANIFEST))
        checkpoint_files.write_manifest(target)  # the integrity manifest now vouches for the poison
        assert checkpoint_files.verify_manifest(target) == []
    result = run_warden("train", "--config", kit.config, "--run-dir", run_dir, "--resume", "auto", timeout=240)
    assert result.returncode == EXIT_VIOLATION, result.stderr[-2000:]
    assert "refusing to start fresh" in result.stderr
    assert STEP4 in result.stderr and STEP2 in result.stderr
    events = rejections(run_dir)
    assert [os.path.basename(e.data["path"]) for e in events] == [STEP4, STEP2]
    assert all(e.data["why"].startswith("no valid signature: ") and ".sig: missing" in e.data["why"] for e in events)


def test_one_unsigned_checkpoint_falls_back_to_the_signed_one(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    os.unlink(os.path.join(checkpoints(run_dir), STEP4 + ".sig"))
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto")
    trainer.close()
    assert trainer.step == 2 and trainer.resumed is not None
    assert trainer.resumed.verification.startswith("signature verified")
    assert [os.path.basename(e.data["path"]) for e in rejections(run_dir)] == [STEP4]


def test_cross_run_checkpoint_is_refused_in_auto_mode_and_accepted_when_named(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    for name in (STEP2, STEP4):  # run B's signed checkpoints under run A's step names
        remove_checkpoint(run_dir, name)
        source = str(kit.base / "run-b" / "checkpoints" / name)
        shutil.copytree(source, os.path.join(checkpoints(run_dir), name))
        shutil.copy(source + ".sig", os.path.join(checkpoints(run_dir), name + ".sig"))
    error = refused(kit, run_dir)
    assert STEP4 in str(error) and STEP2 in str(error)
    events = rejections(run_dir)
    assert len(events) == 2 and all("a checkpoint of run 'run-b'" in e.data["why"] for e in events)

    named = os.path.join(checkpoints(run_dir), STEP4)
    # Run B was trained with another seed: naming its checkpoint is not enough, the changed
    # training keys must be accepted too (the resume guard lists them, exit 2).
    with pytest.raises(ConfigError, match=r"run\.seed 11 -> 3"):
        PPOTrainer(load_config(kit.config), run_dir, resume=named).close()
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume=named, resume_with_changes=True)
    try:
        assert trainer.step == 4 and trainer.run_id == kit.run_a
        assert trainer.resumed is not None and trainer.resumed.cross_run
        assert_actor_equals(trainer, weights(os.path.join(named, ACTOR)))
    finally:
        trainer.close()
    reader = ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME))
    resumed = [e for e, _ in reader.read_available() if e.type == ev.RUN_RESUMED]
    assert len(resumed) == 1
    assert (resumed[0].data["cross_run"], resumed[0].data["source_run_id"]) == (True, "run-b")
    assert resumed[0].run_id == kit.run_a


def test_renamed_step_is_refused(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    remove_checkpoint(run_dir, STEP2)
    root = checkpoints(run_dir)
    os.rename(os.path.join(root, STEP4), os.path.join(root, "step-000000006"))
    os.rename(os.path.join(root, STEP4 + ".sig"), os.path.join(root, "step-000000006.sig"))
    assert "step 4 (" in str(refused(kit, run_dir))  # step-4 is gone: the journal says it exists
    assert [e.step for e in rejections(run_dir)] == [4]
    refused(kit, run_dir, past_missing=True)  # past that, the renamed copy is refused on its own
    (event,) = rejections(run_dir)[1:]
    assert event.data["path"].endswith("step-000000006")
    assert event.data["why"] == "the signature names checkpoint 'step-000000004', not 'step-000000006'"


def test_signed_step_must_match_the_directory(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    remove_checkpoint(run_dir, STEP2)
    kit.sign(os.path.join(checkpoints(run_dir), STEP4), kit.run_a, 7, None)  # a valid signature claiming step 7
    refused(kit, run_dir)
    (event,) = rejections(run_dir)
    assert event.data["why"] == f"signed step 7 but the directory is {STEP4} (renamed or moved)"


def test_checkpoint_of_another_branch_breaks_the_chain(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    kit.sign(os.path.join(checkpoints(run_dir), STEP4), kit.run_a, 4, "ab" * 32)  # parent is not step-2
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto")
    trainer.close()
    assert trainer.step == 2
    (event,) = rejections(run_dir)
    assert event.data["path"].endswith(STEP4)
    assert event.data["why"].startswith(f"signed parent {'ab' * 32} is not the earlier {STEP2} (")


@pytest.mark.parametrize(
    ("attack", "why"),
    [
        ("extra_file", "notes.txt: an unlisted file"),
        ("empty_shard_dir", "actor/model-00002.safetensors: an unlisted directory"),
        ("symlink", "actor/model.safetensors: a symlink; a checkpoint holds only files"),
        ("fifo", "actor/model.safetensors: not a regular file (FIFO, socket or device)"),
        ("missing", "actor/model.safetensors: missing"),
    ],
)
def test_tree_changes_are_refused(kit, tmp_path, attack, why):
    run_dir = kit.copy(tmp_path)
    remove_checkpoint(run_dir, STEP2)
    target = os.path.join(checkpoints(run_dir), STEP4)
    actor = os.path.join(target, ACTOR)
    if attack == "extra_file":
        with open(os.path.join(target, "notes.txt"), "w") as fh:
            fh.write("hello")
    elif attack == "empty_shard_dir":
        os.mkdir(os.path.join(target, "actor", "model-00002.safetensors"))
    elif attack == "symlink":  # even to identical bytes: a checkpoint holds only files
        outside = str(tmp_path / "same-bytes.safetensors")
        shutil.copy(actor, outside)
        os.unlink(actor)
        os.symlink(outside, actor)
    elif attack == "fifo":
        os.unlink(actor)
        os.mkfifo(actor)
    else:
        os.unlink(actor)
    refused(kit, run_dir)
    (event,) = rejections(run_dir)
    assert event.data["why"] == f"the directory differs from the signed manifest: {why}"


def test_a_file_swapped_during_resume_never_loads_the_bad_weights(kit, tmp_path):
    """A thread keeps renaming a good and a bad actor file into place while resume runs."""
    from safetensors.torch import save_file

    run_dir = kit.copy(tmp_path)
    remove_checkpoint(run_dir, STEP2)
    root = checkpoints(run_dir)
    target = os.path.join(root, STEP4, ACTOR)
    good = weights(target)
    bad_tensors = {k: v + 1.0 for k, v in good.items()}
    good_file, bad_file, staging = str(tmp_path / "good"), str(tmp_path / "bad"), os.path.join(root, ".swap")
    shutil.copy(target, good_file)
    save_file(bad_tensors, bad_file)
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="never")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for source in (bad_file, good_file):
                os.link(source, staging)
                os.rename(staging, target)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    loaded = rejected = 0
    deadline = time.monotonic() + 120
    try:
        for _ in range(200):
            if time.monotonic() > deadline or (loaded >= 5 and rejected >= 5):
                break
            with torch.no_grad():
                for p in unwrap(trainer.actor).parameters():
                    p.zero_()
            try:
                result = find_resume_point(trainer, "auto")
            except ResumeRefused as exc:
                assert "actor/model.safetensors: sha256 " in str(exc)
                rejected += 1
                continue
            assert result is not None and result.step == 4
            assert_actor_equals(trainer, good)
            loaded += 1
    finally:
        stop.set()
        swapper.join()
        trainer.close()
    assert rejected >= 1, "the swap never hit a read: the test proves nothing"
    assert loaded >= 1, "the good file was never read: the test proves nothing"
    assert len(rejections(run_dir)) == rejected


def test_integrity_only_resume_says_so(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    trainer = PPOTrainer(load_config(kit.integrity_config), run_dir, resume="auto")
    trainer.close()
    assert trainer.step == 4 and trainer.resumed is not None
    assert trainer.resumed.verification == "manifest sha256 verified (integrity only, not authenticity)"


def test_resume_never_starts_fresh_beside_refused_checkpoints(kit, tmp_path):
    """``--resume never`` is the explicit way to start over beside refused checkpoints."""
    run_dir = kit.copy(tmp_path)
    for name in (STEP2, STEP4):
        os.unlink(os.path.join(checkpoints(run_dir), name + ".sig"))
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="never")
    trainer.close()
    assert trainer.step == 0 and trainer.resumed is None and rejections(run_dir) == []


def test_a_named_checkpoint_without_signature_is_refused(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    named = os.path.join(checkpoints(run_dir), STEP4)
    os.unlink(named + ".sig")
    error = refused(kit, run_dir, resume=named)
    assert str(error).startswith(f"--resume {named}: checkpoint refused: {named} (no valid signature: ")
    (event,) = rejections(run_dir)
    assert event.data["path"] == named


# -- the journal is the index of what exists (warden.ledger) ----------------------------------
def test_deleting_every_checkpoint_does_not_start_the_run_over(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    for name in (STEP2, STEP4):
        delete_checkpoint(run_dir, name)
    error = refused(kit, run_dir)
    assert "gone from" in str(error) and "step 2 (" in str(error) and "step 4 (" in str(error)
    assert "--resume-past-missing" in str(error)
    assert sorted(e.step for e in rejections(run_dir)) == [2, 4]


def test_deleting_the_newest_checkpoint_is_not_a_silent_rollback(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    delete_checkpoint(run_dir, STEP4)
    error = refused(kit, run_dir)
    assert "step 4 (" in str(error) and "step 2 (" not in str(error)
    (event,) = rejections(run_dir)
    assert event.step == 4 and "without a checkpoint.pruned event" in event.data["why"]


def test_resume_past_missing_is_the_explicit_way_on(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    delete_checkpoint(run_dir, STEP4)
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto", resume_past_missing=True)
    trainer.close()
    assert trainer.step == 2 and trainer.resumed is not None and trainer.resumed.path.endswith(STEP2)


def test_announced_retention_is_accounted_for(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    remove_checkpoint(run_dir, STEP4)
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto")
    trainer.close()
    assert trainer.step == 2 and rejections(run_dir) == []


def test_the_run_genesis_nonce_survives_a_resume_and_is_not_taken_from_another_run(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto")
    trainer.close()
    events = [e for e, _ in ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME)).read_available()]
    started = [e.data["genesis_nonce"] for e in events if e.type == ev.RUN_STARTED]
    resumed = [e.data["genesis_nonce"] for e in events if e.type == ev.RUN_RESUMED]
    assert len(set(started)) == 1 and resumed == started[:1]
    state = weights_free_state(os.path.join(checkpoints(run_dir), STEP4))
    assert state["genesis_nonce"] == started[0]
    named = str(kit.base / "run-b" / "checkpoints" / STEP4)
    other = PPOTrainer(load_config(kit.config), str(tmp_path / "fresh"), resume=named, resume_with_changes=True)
    other.close()
    assert other.resumed is not None and other.resumed.cross_run
    assert other.genesis_nonce != weights_free_state(str(kit.base / "run-b" / "checkpoints" / STEP4))["genesis_nonce"]


def weights_free_state(path: str) -> dict:
    import json

    with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as fh:
        return json.load(fh)


# -- red team, round 1 (see the closing note) ------------------------------------------
def test_a_planted_directory_never_drives_the_trainers_retention(kit, tmp_path):
    """A step-999999999/ planted mid-run neither counts towards keep_last nor is removed; the
    trainer's own newest checkpoint is never pruned because of it."""
    config = kit.write_config("keep1.yaml", {"trusted_keys": str(kit.keys.public_key), "keep_last": 1})
    run_dir = str(tmp_path / "run")
    os.makedirs(checkpoints(run_dir))
    plant = os.path.join(checkpoints(run_dir), "step-999999999")
    os.mkdir(plant)
    trainer = PPOTrainer(load_config(config), run_dir, resume="never")  # planted before the run: start anyway
    trainer.train(4)
    trainer.close()
    events = [e for e, _ in ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME)).read_available()]
    assert [(e.type, e.step) for e in events if e.type.startswith("checkpoint")] == [
        ("checkpoint.saved", 2),
        ("checkpoint.saved", 4),
        ("checkpoint.pruned", 2),
    ]
    assert os.path.isdir(plant) and os.path.isdir(os.path.join(checkpoints(run_dir), STEP4))


@pytest.mark.parametrize("alias", ["step-0000000004", "step-000000004\n", "step-00000000٤"])
def test_another_spelling_of_a_step_is_not_that_checkpoint(kit, tmp_path, alias):
    run_dir = kit.copy(tmp_path)
    root = checkpoints(run_dir)
    os.rename(os.path.join(root, STEP4), os.path.join(root, alias))
    os.rename(os.path.join(root, STEP4 + ".sig"), os.path.join(root, alias + ".sig"))
    error = refused(kit, run_dir)
    assert "step 4 (" in str(error)  # the journal's step 4 is gone: its alias does not stand for it


def test_a_deep_tree_inside_a_checkpoint_is_a_rejection_not_a_crash(kit, tmp_path):
    run_dir = kit.copy(tmp_path)
    fd = os.open(os.path.join(checkpoints(run_dir), STEP4), os.O_RDONLY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    try:
        trainer = PPOTrainer(load_config(kit.config), run_dir, resume="auto")
        trainer.close()
        assert trainer.step == 2
        (event,) = rejections(run_dir)
        assert event.step == 4 and "deeper than" in event.data["why"]
    finally:  # pytest's own clean-up of old temporary directories recurses, and would crash on it
        top = os.open(os.path.join(checkpoints(run_dir), STEP4), os.O_RDONLY)
        try:
            remove_tree_at(top, "d", max_depth=2000)
        finally:
            os.close(top)


# -- integrity-only mode: the manifest is writable too, so the bytes may be anything -----------------
def _replace_tensor_refs(node, key: str, value):
    """``node`` with the saved-state reference to tensor ``key`` replaced by ``value``."""
    if isinstance(node, dict):
        if node.get("__tensor__") == key:
            return value
        return {k: _replace_tensor_refs(v, key, value) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_tensor_refs(v, key, value) for v in node]
    return node


def _edit_json(path: str, edit) -> None:
    import json

    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(edit(data) if isinstance(edit(data), str) else json.dumps(edit(data)))


def _moment_of_wrong_shape(step_dir: str) -> None:
    from safetensors.torch import load_file, save_file

    path = os.path.join(step_dir, "optim_actor.safetensors")
    tensors = load_file(path)
    name = next(k for k, v in tensors.items() if v.dim() >= 2)
    tensors[name] = torch.zeros(1)
    save_file(tensors, path)


HOSTILE_STATE = {
    "deeply nested trainer state": lambda d: _edit_json(
        os.path.join(d, "trainer_state.json"), lambda _: "[" * 100_000 + "]" * 100_000
    ),
    "deeply nested rng state": lambda d: _edit_json(
        os.path.join(d, "rng.json"), lambda _: '{"__items__": [["x", ' * 5000 + "1" + "]]}" * 5000
    ),
    "rng state of the wrong type": lambda d: _edit_json(
        os.path.join(d, "rng.json"), lambda data: _replace_tensor_refs(data, "t.numpy.state", 7)
    ),
    "an infinite counter": lambda d: _edit_json(
        os.path.join(d, "trainer_state.json"), lambda data: {**data, "skipped_updates": float("inf")}
    ),
    "an optimizer moment of the wrong shape": _moment_of_wrong_shape,
}


@pytest.mark.parametrize("attack", sorted(HOSTILE_STATE))
def test_hostile_state_in_integrity_only_mode_is_a_refusal_never_a_crash(kit, tmp_path, attack):
    """Found by this round's red team: each of these ended in a RecursionError, AttributeError,
    OverflowError, or an accepted checkpoint that failed at the first step."""
    run_dir = kit.copy(tmp_path)
    step4 = os.path.join(checkpoints(run_dir), STEP4)
    HOSTILE_STATE[attack](step4)
    checkpoint_files.write_manifest(step4)  # the attacker rewrites the manifest too
    trainer = PPOTrainer(load_config(kit.integrity_config), run_dir, resume="auto")
    trainer.close()
    assert trainer.step == 2, "fell back to the untouched checkpoint"
    assert [os.path.basename(e.data["path"]) for e in rejections(run_dir)] == [STEP4]
