"""Asynchronous checkpoints: one save in flight, the copy independent of training, the same bytes
as a synchronous save, a bit-exact resume, and a kill -9 mid-write that leaves the previous
checkpoint the newest."""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import random
import signal
import threading
import time

import pytest
import torch

from tests.trainer import checkpoint_files
from trainer import checkpoint as ckpt
from trainer.metrics import TrainerMetrics
from trainer.saver import CheckpointSaver
from trainer.staging import GROW_BYTES, HostArena, HostMemoryError, capture, reserve_arena

CPU = torch.device("cpu")


def _value(metrics: TrainerMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def _fill_of(tensors: dict[str, torch.Tensor], step: int):
    def fill(sink) -> None:
        sink.tensors("actor/model.safetensors", tensors)
        first = next(iter(tensors.values()))
        ckpt.save_state(sink, "optim", {"state": {0: {"m": first * 2}}, "lr": 0.1})
        sink.json(ckpt.STATE, {"step": step})

    return fill


class Recorder:
    def __init__(self) -> None:
        self.saved: list[tuple[str, object]] = []
        self.failed: list[tuple[int, str, int]] = []

    def on_saved(self, written, timing) -> None:
        self.saved.append((written.path, timing))

    def on_failed(self, step, exc, attempts) -> None:
        self.failed.append((step, str(exc), attempts))


def _saver(root, write=None, *, arena=True, retries=0, clock=time.monotonic, metrics=None, recorder=None):
    recorder = recorder or Recorder()

    def real_write(step, fill):
        return ckpt.write_checkpoint(str(root), step, fill)

    saver = CheckpointSaver(
        write or real_write,
        arena=HostArena(1 << 20, pinned=False) if arena else None,
        device=CPU,
        retries=retries,
        metrics=metrics or TrainerMetrics(),
        on_saved=recorder.on_saved,
        on_failed=recorder.on_failed,
        clock=clock,
        sleep=lambda _s: None,
    )
    return saver, recorder


def test_a_save_waits_for_the_one_in_flight_and_counts_the_wait(tmp_path):
    gate, writing, concurrent, most = threading.Event(), threading.Event(), [0], [0]
    release_on_clock = threading.Event()

    def clock() -> float:
        if release_on_clock.is_set():
            gate.set()  # the next save is about to wait: let the first finish
        return time.monotonic()

    def gated_write(step, fill):
        concurrent[0] += 1
        most[0] = max(most[0], concurrent[0])
        writing.set()
        assert gate.wait(10), "never released"
        try:
            return ckpt.write_checkpoint(str(tmp_path), step, fill)
        finally:
            concurrent[0] -= 1

    metrics = TrainerMetrics()
    saver, rec = _saver(tmp_path, gated_write, clock=clock, metrics=metrics)
    weights = {"w": torch.arange(1000, dtype=torch.float32)}
    saver.save(1, _fill_of(weights, 1))
    assert writing.wait(10) and saver.in_flight and rec.saved == []
    assert _value(metrics, "warden_trainer_checkpoint_in_flight") == 1
    release_on_clock.set()
    saver.save(2, _fill_of(weights, 2))
    saver.wait()
    assert [os.path.basename(p) for p, _ in rec.saved] == ["step-000000001", "step-000000002"]
    assert most[0] == 1
    assert _value(metrics, "warden_trainer_checkpoint_waits_total") == 1
    assert rec.saved[1][1].waited_seconds >= 0 and rec.saved[0][1].mode == "async"
    assert _value(metrics, "warden_trainer_checkpoint_in_flight") == 0 and not saver.in_flight


def test_the_writer_and_the_threads_it_starts_run_nicer_than_training(tmp_path):
    from trainer.saver import WRITER_NICENESS

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: dict[str, int] = {}

    def write(step, fill):
        seen["writer"] = niceness()
        helper = threading.Thread(target=lambda: seen.update(pool=niceness()))
        helper.start()
        helper.join()
        return ckpt.write_checkpoint(str(tmp_path), step, fill)

    saver, _ = _saver(tmp_path, write)
    training = niceness()
    saver.save(1, _fill_of({"w": torch.ones(4)}, 1))
    saver.wait()
    expected = min(19, training + WRITER_NICENESS)
    assert seen == {"writer": expected, "pool": expected} and niceness() == training


def test_the_copy_is_independent_of_training_after_the_capture(tmp_path):
    gate = threading.Event()

    def gated_write(step, fill):
        assert gate.wait(10)
        return ckpt.write_checkpoint(str(tmp_path), step, fill)

    saver, rec = _saver(tmp_path, gated_write)
    weights = {"w": torch.arange(4096, dtype=torch.float32)}
    expected = weights["w"].clone()
    saver.save(3, _fill_of(weights, 3))
    weights["w"].mul_(-1)  # training goes on and changes the parameters in place
    gate.set()
    saver.wait()
    from safetensors.torch import load_file

    got = load_file(os.path.join(rec.saved[0][0], "actor", "model.safetensors"))["w"]
    assert torch.equal(got, expected)
    assert checkpoint_files.verify_manifest(rec.saved[0][0]) == []


def test_async_and_sync_saves_write_the_same_bytes(tmp_path):
    weights = {"w": torch.randn(3000), "b": torch.zeros(7, dtype=torch.bfloat16), "e": torch.empty(0)}
    paths = {}
    for mode in ("sync", "async"):
        saver, rec = _saver(tmp_path / mode, arena=mode == "async")
        saver.save(5, _fill_of(weights, 5))
        saver.wait()
        paths[mode] = rec.saved[0][0]
        assert rec.saved[0][1].mode == mode
    assert checkpoint_files.read_tree(paths["sync"]) == checkpoint_files.read_tree(paths["async"])


def test_the_arena_is_reused_and_grows_when_the_state_outgrows_it(caplog):
    arena = HostArena(8192, pinned=False)
    tensors = {"a": torch.ones(1000), "b": torch.ones(10, dtype=torch.int64)}
    first = capture(_fill_of(tensors, 1), arena, CPU)
    second = capture(_fill_of(tensors, 2), arena, CPU)
    ptrs = [[t.data_ptr() for t in payload.values()] for _r, payload, _m in first.files if isinstance(payload, dict)]
    again = [[t.data_ptr() for t in payload.values()] for _r, payload, _m in second.files if isinstance(payload, dict)]
    assert ptrs == again and len(arena.chunks) == 1
    big = {"w": torch.ones(8192)}
    capture(_fill_of(big, 3), arena, CPU)
    assert len(arena.chunks) == 2 and arena.nbytes >= 8192 + GROW_BYTES
    assert "outgrew" in caplog.text


def test_a_staged_optimizer_state_equals_the_live_one_across_chunks():
    """Every tensor of a real AdamW state (its 0-dim step counters between the moments) lands in its
    own slice with its own value, also when the state spills over several chunks."""
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(2, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    arena = HostArena(4096, pinned=False)  # small: the state spills into grown chunks

    def fill(sink) -> None:
        ckpt.save_state(sink, "optim_actor", state)

    live: dict[str, torch.Tensor] = {}
    ckpt.flatten_state(state, live)
    for _ in range(2):  # a second capture reuses the same slices
        staged = dict(capture(fill, arena, CPU).files[1][1])
        assert staged.keys() == live.keys()
        assert [k for k in live if not torch.equal(staged[k], live[k])] == []
        assert len({t.data_ptr() for t in staged.values() if t.numel()}) == sum(1 for t in staged.values() if t.numel())


def test_host_memory_is_checked_before_it_is_taken():
    with pytest.raises(HostMemoryError, match=r"need 3\.00 GiB .* only 2\.00 GiB is available"):
        reserve_arena(3 << 30, pinned=False, available=2 << 30)
    assert reserve_arena(1 << 20, pinned=False, available=2 << 30).nbytes >= 1 << 20


def test_retries_then_on_failed_and_a_writer_bug_surfaces_in_the_training_thread(tmp_path):
    attempts = []

    def failing(step, fill):
        attempts.append(step)
        raise ckpt.CheckpointError(f"{tmp_path}: checkpoint write failed: No space left on device")

    saver, rec = _saver(tmp_path, failing, retries=2)
    saver.save(4, _fill_of({"w": torch.ones(3)}, 4))
    saver.wait()
    assert attempts == [4, 4, 4] and rec.failed == [(4, rec.failed[0][1], 3)] and rec.saved == []
    assert "No space left" in rec.failed[0][1]

    def buggy(step, fill):
        raise RuntimeError("a bug in the writer")

    saver, rec = _saver(tmp_path, buggy)
    saver.save(6, _fill_of({"w": torch.ones(3)}, 6))
    with pytest.raises(RuntimeError, match="a bug in the writer"):
        saver.wait()
    saver.wait()  # raised once, then the saver is usable again


def _async_writer_loop(root: str, start_step: int) -> None:
    """Child process: asynchronous saves forever, each a few MB, changing the state in between."""
    weights = {"w": torch.randn(600_000), "v": torch.randn(300_000)}
    saver, _ = _saver(root, recorder=None)
    saver.arena = HostArena(8 << 20, pinned=False)
    step = start_step
    while True:
        step += 1
        saver.save(step, _fill_of(weights, step))
        weights["w"].add_(1.0)  # training goes on while the writer writes
        saver.wait()
        ckpt.prune(root, keep_last=3)


def test_kill_9_during_an_async_save_leaves_the_previous_checkpoint_newest(tmp_path):
    root = str(tmp_path / "checkpoints")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(11)
    seen_tmp, newest = 0, 0
    for _trial in range(12):
        proc = ctx.Process(target=_async_writer_loop, args=(root, newest))
        proc.start()
        time.sleep(rng.uniform(0.05, 0.5))  # a random kill time, not synchronisation
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        names = os.listdir(root) if os.path.isdir(root) else []
        seen_tmp += any(n.startswith(".tmp-") for n in names)
        complete = ckpt.list_complete(root)
        for ref in complete:
            assert checkpoint_files.verify_manifest(ref.path) == [], ref.path
            state = json.loads(pathlib.Path(ref.path, ckpt.STATE).read_bytes())
            assert state == {"step": ref.step}
        ckpt.remove_stale_temporaries(root)
        newest = complete[0].step if complete else newest
    assert newest > 0
    assert seen_tmp >= 2, "kills must land while an asynchronous save is being written"


# -- the trainer ---------------------------------------------------------------------------
def _train(make_config, run_dir, mode: str, steps: int, resume="never", max_steps=4, before=None, **extra):
    from trainer.core import PPOTrainer

    cfg, _ = make_config(
        {
            "max_steps": max_steps,
            "run": {"run_id": "saver-run"},
            "checkpoint": {"every_steps": 2, "async_save": mode, **extra},
        }
    )
    trainer = PPOTrainer(cfg, str(run_dir), resume=resume)
    try:
        if before is not None:
            before(trainer)
        trainer.train(steps)
        return {k: v.detach().clone() for k, v in trainer.actor.state_dict().items()}, trainer
    finally:
        trainer.close()


def _comparable(path: str) -> dict[str, object]:
    """A checkpoint's files; in trainer_state.json the save mode and the run's random genesis nonce
    are left out (and the manifest, which hashes it)."""
    files: dict[str, object] = dict(checkpoint_files.read_tree(path))
    state = json.loads(files.pop(ckpt.STATE))
    state["config"]["checkpoint"].pop("async_save")
    files.pop(ckpt.MANIFEST)
    files[ckpt.STATE] = {k: v for k, v in state.items() if k not in ("config_digest", "genesis_nonce")}
    return files


def test_trainer_async_checkpoints_equal_sync_ones_and_resume_bit_exact(make_config, tmp_path):
    straight, sync_trainer = _train(make_config, tmp_path / "sync", "off", 4)
    _, async_trainer = _train(make_config, tmp_path / "async", "on", 4)
    assert sync_trainer.saver.asynchronous is False and async_trainer.saver.asynchronous is True
    for step in (2, 4):
        name = ckpt.step_dir_name(step)
        sync_files = _comparable(str(tmp_path / "sync" / "checkpoints" / name))
        assert _comparable(str(tmp_path / "async" / "checkpoints" / name)) == sync_files, name
    from warden import journal as ev

    events = [e for e, _ in ev.JournalReader(str(tmp_path / "async" / "events.jsonl")).read_available()]
    saved = [e for e in events if e.type == ev.CHECKPOINT_SAVED]
    assert [e.data["save_mode"] for e in saved] == ["async", "async"]
    assert events[-1].type == ev.RUN_FINISHED  # the final save was announced before the run ended

    _train(make_config, tmp_path / "resumed", "on", 2)
    resumed, trainer = _train(make_config, tmp_path / "resumed", "on", 4, resume="auto")
    assert trainer.resumed is not None and trainer.resumed.step == 2
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []


def test_a_resume_read_into_the_arena_keeps_nothing_in_it_and_stays_bit_exact(make_config, tmp_path, monkeypatch):
    """The resume reads into the staging arena (as on CUDA, where it is pinned; here every file is lent,
    host memory standing in for pinned), then saves capture into that same arena: the run must go on
    exactly as one that never stopped, and no optimizer state may be left in the arena."""
    from trainer import resume, verified_load

    straight, _ = _train(make_config, tmp_path / "straight", "on", 6, max_steps=6)
    _train(make_config, tmp_path / "resumed", "on", 2, max_steps=6)
    lent: list[int] = []

    def lender(trainer):
        arena = trainer.saver.arena
        arena.reset()

        def lend(size: int):
            view = arena.lend(size)
            lent.append(0 if view is None else size)
            return view

        return lend

    def nothing_in_the_arena(trainer) -> None:
        arena = trainer.saver.arena
        kept = [t for opt in (trainer.actor_opt, trainer.critic_opt) for st in opt.state.values() for t in st.values()]
        assert kept and [t for t in kept if isinstance(t, torch.Tensor) and arena.owns(t)] == []

    monkeypatch.setattr(verified_load, "MAPPED_BYTES", 1)
    monkeypatch.setattr(resume, "lender", lender)
    resumed, trainer = _train(
        make_config, tmp_path / "resumed", "on", 6, resume="auto", max_steps=6, before=nothing_in_the_arena
    )
    assert trainer.resumed is not None and trainer.resumed.step == 2
    assert len(lent) >= 4 and 0 not in lent, lent  # every file of the checkpoint came from the arena
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []


def test_arena_lends_in_order_never_grows_and_knows_its_memory():
    arena = HostArena(4096, pinned=False)
    first, second = arena.lend(1000), arena.lend(1000)
    assert first is not None and second is not None and not first.readonly
    assert arena.lend(4096) is None and arena.nbytes == 4096  # no room left: None, and no growth
    first[:3] = b"abc"
    as_tensor = torch.frombuffer(first, dtype=torch.uint8)
    assert arena.owns(as_tensor) and bytes(arena.chunks[0][:3].tolist()) == b"abc"
    assert not arena.owns(as_tensor.clone()) and not arena.owns(torch.empty(0))
    arena.reset()
    again = arena.lend(1000)
    assert again is not None and bytes(again[:3]) == b"abc"  # the same memory, from the start again


def test_host_memory_short_fails_cleanly_or_falls_back_to_sync(make_config, tmp_path, monkeypatch, caplog):
    from trainer import core
    from trainer.core import TrainingFailed

    monkeypatch.setattr(core, "available_host_bytes", lambda: 4096)
    with pytest.raises(TrainingFailed, match=r"asynchronous checkpoints need .* GiB .*async_fallback: sync"):
        _train(make_config, tmp_path / "fail", "on", 1)
    _, trainer = _train(make_config, tmp_path / "fallback", "on", 2, async_fallback="sync")
    assert trainer.saver.asynchronous is False
    assert "saving checkpoints synchronously" in caplog.text
    assert os.path.isdir(tmp_path / "fallback" / "checkpoints" / ckpt.step_dir_name(2))
