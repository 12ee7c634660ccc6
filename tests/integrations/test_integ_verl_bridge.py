"""The verl bridge against a verl run directory written the way verl writes it.

In-process passes with a clock the test moves forward (so "stable for 30 s" needs no
sleeping), then the CLI as a real process: --once, follow mode with SIGTERM and /metrics,
and kill -9 at random moments without a duplicated or lost event.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time

from support import free_port, run_warden, scrape, spawn, stop_process, wait_http, warden_cmd

from sidecars.bridge.verl import BridgeConfig, VerlBridge
from warden.journal import CHECKPOINT_SAVED, REWARD_SNAPSHOT, RUN_RESUMED, RUN_STARTED, STEP_COMPLETED


def make_bridge(run_dir, verl_run, clock=None, stable=5.0, top_k=3, **extra):
    cfg = BridgeConfig(
        run_dir=str(run_dir),
        verl_log=str(verl_run.log_path),
        rollout_dir=str(verl_run.rollout_dir),
        checkpoint_root=str(verl_run.ckpt_root),
        stable_seconds=stable,
        top_k=top_k,
        **extra,
    )
    return VerlBridge(cfg, clock=clock or time.time)


def one_pass(run_dir, verl_run, clock, **kw):
    bridge = make_bridge(run_dir, verl_run, clock, **kw)
    try:
        return bridge.run_pass()
    finally:
        bridge.close()


def steps_of(events, etype):
    return [e.step for e in events if e.type == etype]


def log_lines(events):
    """(generation, step) of every step.completed, from its marker."""
    return [(e.data["bridge"]["generation"], e.step) for e in events if e.type == STEP_COMPLETED]


def assert_top_k(verl_kit, event, rows, k=3):
    samples = event.data["samples"]
    assert [s["index"] for s in samples] == verl_kit.top_indices(rows, k)
    for sample in samples:
        row = rows[sample["index"]]
        assert (sample["prompt"], sample["response"], sample["reward"]) == (row["input"], row["output"], row["score"])
        assert sample["truncated"] is False


def test_a_run_with_a_restart_a_partial_dump_and_an_abandoned_checkpoint(run_dir, verl_run, clock, verl_kit):
    verl_run.start()
    verl_run.log(0, {"val-core/openai/gsm8k/reward/mean@1": 0.02})  # val_before_train
    verl_run.train_step(1)
    verl_run.train_step(2, save=True)
    verl_run.train_step(3)
    verl_run.partial_dump(4)  # step 4's dump is being written
    report = one_pass(run_dir, verl_run, clock)
    events = verl_kit.read_journal(run_dir)
    assert [e.type for e in events][:1] == [RUN_STARTED]
    assert steps_of(events, STEP_COMPLETED) == [0, 1, 2, 3]
    assert steps_of(events, REWARD_SNAPSHOT) == [1, 2, 3]
    assert steps_of(events, CHECKPOINT_SAVED) == []  # named by the tracker, but not stable yet
    assert any("4.jsonl: may still be written" in p for p in report.pending)
    assert any("global_step_2: named by" in p for p in report.pending)

    clock.advance(60)  # everything written so far is now quiet for a minute
    report = one_pass(run_dir, verl_run, clock)
    events = verl_kit.read_journal(run_dir)
    assert steps_of(events, CHECKPOINT_SAVED) == [2]
    assert steps_of(events, REWARD_SNAPSHOT) == [1, 2, 3]  # 4 is still torn, however old
    assert any("4.jsonl: partial" in p for p in report.pending)

    verl_run.finish_partial_dump()
    verl_run.save_checkpoint(4)
    verl_run.log(4)
    verl_run.train_step(5)
    verl_run.dump(6)
    verl_run.save_checkpoint(6, only_actor=True)  # crash while saving step 6: no tracker write
    verl_run.close()
    report = one_pass(run_dir, verl_run, clock)
    assert report.exit_code == 0
    assert any("global_step_6: not the step named" in p for p in report.pending)

    # verl restarts from global_step_4: the file logger is truncated, steps 5.. run again
    verl_run.start()
    verl_run.log(4, {"val-core/openai/gsm8k/reward/mean@1": 0.2})
    first_five = verl_run.dumps[5]
    verl_run.train_step(5)
    verl_run.train_step(6, save=True)
    verl_run.train_step(7)
    verl_run.train_step(8, save=True)
    clock.advance(60)
    report = one_pass(run_dir, verl_run, clock)
    assert report.restarts == 1
    events = verl_kit.read_journal(run_dir)

    assert steps_of(events, CHECKPOINT_SAVED) == [2, 4, 8]  # 6 was never named while it was the latest
    for event in verl_kit.of_type(events, CHECKPOINT_SAVED):
        assert event.data["path"] == str(verl_run.step_dir(event.step))
        assert event.data["root"] == str(verl_run.ckpt_root) and event.data["layout"] == "verl"
    resumed = verl_kit.of_type(events, RUN_RESUMED)
    assert len(resumed) == 1 and resumed[0].data["from_step"] == 4
    assert resumed[0].data["checkpoint"] == str(verl_run.step_dir(4))
    assert log_lines(events) == [(0, s) for s in range(6)] + [(1, s) for s in range(4, 9)]
    assert steps_of(events, REWARD_SNAPSHOT) == list(range(1, 9))  # each step once
    for event in verl_kit.of_type(events, REWARD_SNAPSHOT):
        rows = first_five if event.step == 5 else verl_run.dumps[event.step]
        assert_top_k(verl_kit, event, rows)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1))


def test_step_completed_payload(run_dir, verl_run, clock, verl_kit):
    verl_run.start()
    verl_run.log(1, verl_kit.verl_metrics(1, validate=True))
    one_pass(run_dir, verl_run, clock)
    (event,) = verl_kit.of_type(verl_kit.read_journal(run_dir), STEP_COMPLETED)
    original = verl_kit.verl_metrics(1, validate=True)
    data = event.data
    assert data["source"] == "verl" and re.fullmatch(rf"{verl_kit.experiment}-[0-9a-f]{{8}}", event.run_id)
    assert data["actor_pg_loss"] == original["actor/pg_loss"]
    assert data["val_core_openai_gsm8k_reward_mean_at_1"] == original["val-core/openai/gsm8k/reward/mean@1"]
    assert data["reward_mean"] == original["critic/score/mean"]
    assert data["timings"]["step_s"] == original["timing_s/step"]
    assert "critic_vf_explained_var" not in data  # NaN (null in the log) is not a number
    assert data["verl_metrics"]["critic/vf_explained_var"] is None
    assert data["verl_metrics"]["actor/pg_loss"] == original["actor/pg_loss"]


def test_exactly_once_after_a_lost_state_save_a_torn_journal_and_a_deleted_state(run_dir, verl_run, clock, verl_kit):
    state_file = run_dir / "state" / "bridge" / "verl.json"
    verl_run.start()
    for step in (1, 2, 3):
        verl_run.train_step(step, save=step == 2)
    clock.advance(60)
    one_pass(run_dir, verl_run, clock)
    old_state = state_file.read_bytes()
    for step in (4, 5, 6):
        verl_run.train_step(step, save=step == 6)
    clock.advance(60)
    one_pass(run_dir, verl_run, clock)
    expected = [(e.type, e.step) for e in verl_kit.read_journal(run_dir)]

    state_file.write_bytes(old_state)  # a crash after the events of steps 4-6, before the state save
    bridge = make_bridge(run_dir, verl_run, clock)
    assert bridge.reconciled == len(expected) - json.loads(old_state)["journal"]["seq"]
    bridge.run_pass()
    bridge.close()
    assert [(e.type, e.step) for e in verl_kit.read_journal(run_dir)] == expected

    # a crash in the middle of writing the last event: the writer cuts the torn tail, the bridge writes it again
    journal = run_dir / "events.jsonl"
    content = journal.read_bytes()
    last_start = content.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(content[: last_start + 30])
    state_file.write_bytes(old_state)
    one_pass(run_dir, verl_run, clock)
    assert [(e.type, e.step) for e in verl_kit.read_journal(run_dir)] == expected

    state_file.unlink()  # no state at all: rebuilt from the whole journal
    report = one_pass(run_dir, verl_run, clock)
    assert report.emitted == {}
    assert [(e.type, e.step) for e in verl_kit.read_journal(run_dir)] == expected


def test_only_a_stable_step_named_by_a_whole_tracker_is_complete(run_dir, verl_run, clock, verl_kit):
    verl_run.save_checkpoint(10, tracker=False)
    verl_run.write_tracker_partially("1")  # "10" half written: names a step that does not exist
    clock.advance(60)
    report = one_pass(run_dir, verl_run, clock)
    assert any("names step 1 but" in p for p in report.pending)
    verl_run.write_tracker_partially("")  # truncated, not written yet
    report = one_pass(run_dir, verl_run, clock)
    assert any("not a step" in p for p in report.pending)
    verl_run.write_tracker_partially("10")
    clock.offset = 0  # the tracker was just written: not stable yet
    report = one_pass(run_dir, verl_run, clock)
    assert steps_of(verl_kit.read_journal(run_dir), CHECKPOINT_SAVED) == []
    clock.advance(60)
    one_pass(run_dir, verl_run, clock)
    one_pass(run_dir, verl_run, clock)
    assert steps_of(verl_kit.read_journal(run_dir), CHECKPOINT_SAVED) == [10]
    # a later save of the same step (verl resumed from an older checkpoint) rewrites the tracker: emitted again
    time.sleep(0.01)
    verl_run.save_checkpoint(10)
    clock.advance(60)
    one_pass(run_dir, verl_run, clock)
    assert steps_of(verl_kit.read_journal(run_dir), CHECKPOINT_SAVED) == [10, 10]


def test_a_dump_is_complete_once_a_later_one_was_written(run_dir, verl_run, clock, verl_kit):
    # no file logger configured: only later dumps and quiet time tell
    cfg = BridgeConfig(run_dir=str(run_dir), rollout_dir=str(verl_run.rollout_dir), stable_seconds=30, top_k=2)
    verl_run.dump(1)
    time.sleep(0.01)
    verl_run.dump(2)
    bridge = VerlBridge(cfg, clock=clock)
    bridge.run_pass()
    assert steps_of(verl_kit.read_journal(run_dir), REWARD_SNAPSHOT) == [1]
    clock.advance(31)
    bridge.run_pass()
    bridge.close()
    events = verl_kit.read_journal(run_dir)
    assert steps_of(events, REWARD_SNAPSHOT) == [1, 2]
    # no log: the run directory's name ("run" is generic: its parent's) and a random suffix
    assert re.fullmatch(rf"{re.escape(run_dir.parent.name[:100])}-[0-9a-f]{{8}}", events[0].run_id)


# -- the CLI as a process ---------------------------------------------------------------------------------


def bridge_args(run_dir, verl_run, *extra):
    return (
        "bridge",
        "verl",
        "--run-dir",
        str(run_dir),
        "--verl-log",
        str(verl_run.log_path),
        "--rollout-dir",
        str(verl_run.rollout_dir),
        "--checkpoint-root",
        str(verl_run.ckpt_root),
        *extra,
    )


def test_cli_once_json_and_exit_codes(run_dir, verl_run, tmp_path, verl_kit):
    verl_run.start()
    verl_run.train_step(1, save=True)
    done = run_warden(*bridge_args(run_dir, verl_run, "--once", "--stable-seconds", "0", "--format", "json"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["emitted"] == {CHECKPOINT_SAVED: 1, REWARD_SNAPSHOT: 1, RUN_STARTED: 1, STEP_COMPLETED: 1}
    again = run_warden(*bridge_args(run_dir, verl_run, "--once", "--stable-seconds", "0"))
    assert again.returncode == 0 and "emitted: nothing new" in again.stdout
    # an input that is not a regular file: reported, exit 3, no traceback, no hang
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    done = run_warden("bridge", "verl", "--run-dir", str(run_dir), "--verl-log", str(fifo), "--once")
    assert done.returncode == 3 and "not a regular file" in done.stdout and "Traceback" not in done.stderr
    done = run_warden("bridge", "verl", "--run-dir", str(run_dir), "--once")
    assert done.returncode == 2 and "nothing to bridge" in done.stderr
    env = {"WARDEN_RUN_DIR": str(run_dir), "WARDEN_VERL_LOG": str(verl_run.log_path)}
    done = run_warden("bridge", "verl", "--once", "--run-id", "other", env=env)
    assert done.returncode == 2 and "belongs to run" in done.stderr


def wait_events(run_dir, verl_kit, predicate, proc, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        events = verl_kit.read_journal(run_dir) if (run_dir / "events.jsonl").exists() else []
        if predicate(events):
            return events
        assert proc.poll() is None, f"bridge exited with {proc.returncode}"
        assert time.monotonic() < deadline, [(e.type, e.step) for e in events]
        time.sleep(0.05)


def test_follow_mode_metrics_and_sigterm(run_dir, verl_run, tmp_path, verl_kit):
    port = free_port()
    log = open(tmp_path / "bridge.log", "wb")  # noqa: SIM115
    cmd = warden_cmd(*bridge_args(run_dir, verl_run, "--poll-interval", "0.05", "--stable-seconds", "0.3"))
    proc = spawn([*cmd, "--port", str(port)], stderr=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        verl_run.start()
        for step in (1, 2, 3):
            verl_run.train_step(step, save=step == 2)
        events = wait_events(run_dir, verl_kit, lambda ev: CHECKPOINT_SAVED in {e.type for e in ev}, proc)
        assert steps_of(events, STEP_COMPLETED) == [1, 2, 3]
        samples = scrape(port)
        assert samples[("warden_verl_actor_pg_loss", ())] == verl_kit.verl_metrics(3)["actor/pg_loss"]
        assert samples[("warden_bridge_events_emitted_total", (("type", STEP_COMPLETED),))] == 3
        assert samples[("warden_bridge_last_step", ())] == 3
        verl_run.start()  # restart: truncation noticed while following
        verl_run.log(2, {"val-core/openai/gsm8k/reward/mean@1": 0.1})
        wait_events(run_dir, verl_kit, lambda ev: RUN_RESUMED in {e.type for e in ev}, proc)
        # The counter is bumped just after the event is written: wait for it rather than race it.
        deadline = time.monotonic() + 20
        while scrape(port).get(("warden_bridge_log_restarts_total", ()), 0.0) != 1:
            assert time.monotonic() < deadline, "warden_bridge_log_restarts_total never reached 1"
            time.sleep(0.05)
        started = time.monotonic()
        assert stop_process(proc, signal.SIGTERM) == 0
        assert time.monotonic() - started < 5
    finally:
        stop_process(proc)
        log.close()
    log_text = (tmp_path / "bridge.log").read_text()
    assert "bridge stopped" in log_text and "Traceback" not in log_text
    state = json.loads((run_dir / "state" / "bridge" / "verl.json").read_text())
    assert state["journal"]["seq"] == len(verl_kit.read_journal(run_dir))


def test_kill_9_at_random_moments_never_duplicates_or_loses_an_event(run_dir, verl_run, tmp_path, verl_kit):
    rng = random.Random(7)
    cmd = warden_cmd(*bridge_args(run_dir, verl_run, "--poll-interval", "0.01", "--stable-seconds", "0", "--port", "0"))
    verl_run.start()
    step = 0
    for _round in range(6):
        proc = spawn(cmd, stderr=subprocess.DEVNULL)
        for _ in range(4):
            step += 1
            verl_run.train_step(step, save=step % 3 == 0)
        time.sleep(rng.uniform(0.05, 0.6))
        proc.kill()
        proc.wait()
    done = run_warden(*bridge_args(run_dir, verl_run, "--once", "--stable-seconds", "0"))
    assert done.returncode == 0, done.stderr
    events = verl_kit.read_journal(run_dir)
    assert steps_of(events, STEP_COMPLETED) == list(range(1, step + 1))
    assert steps_of(events, REWARD_SNAPSHOT) == list(range(1, step + 1))
    saved = steps_of(events, CHECKPOINT_SAVED)
    assert len(saved) == len(set(saved)) and step - step % 3 in saved
    assert all(s % 3 == 0 for s in saved)
    shutil.rmtree(run_dir / "state")  # and the state is only a cache of the journal
    assert run_warden(*bridge_args(run_dir, verl_run, "--once", "--stable-seconds", "0")).returncode == 0
    assert len(verl_kit.read_journal(run_dir)) == len(events)


def test_events_over_the_line_limit_are_shrunk_not_lost(run_dir, verl_run, clock, verl_kit):
    verl_run.start()
    wide = {f"actor/metric_{i:05d}": i / 7 for i in range(25_000)}  # ~0.8 MB per copy, two copies per event
    rows = [{"input": "p" * 100, "output": chr(0x4E00 + i) * 3000, "score": i / 400} for i in range(400)]
    verl_run.dump(1, rows)
    verl_run.log(1, wide)
    report = one_pass(run_dir, verl_run, clock, top_k=400, max_text_chars=4000)
    assert report.problems == []
    step, snapshot = (verl_kit.of_type(verl_kit.read_journal(run_dir), t)[0] for t in (STEP_COMPLETED, REWARD_SNAPSHOT))
    assert step.data["verl_metrics"] is None and step.data["actor_metric_24999"] == 24999 / 7
    assert "verl_metrics dropped" in step.data["truncated_for_size"]
    kept = snapshot.data["samples"]
    assert 0 < len(kept) < 400 and [s["index"] for s in kept] == list(range(399, 399 - len(kept), -1))
    assert "samples cut" in snapshot.data["truncated_for_size"]
