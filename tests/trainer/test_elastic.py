"""Issue 22 part 2, the pure parts of an elastic resume: lost steps, world sizes, restart count,
the batch digest, and a resume after a crash between checkpoints (in one process).

The node-loss drill with three torchrun agents is tests/e2e/test_elastic_drill.py.
"""

from __future__ import annotations

import os

from trainer.core import PPOTrainer
from trainer.data import PromptSampler, batch_digest
from trainer.elastic import (
    StepRecord,
    lost_steps,
    previous_world_size,
    read_step_history,
    restart_count,
    resume_fields,
)
from trainer.train_state import guard_config
from warden import journal as ev


def journal(run_dir):
    return [e for e, _ in ev.JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


def test_lost_steps_are_those_completed_after_the_checkpoint_each_once():
    # Steps 5 and 6 were completed twice already (an earlier restart); the checkpoint is step 4.
    history = [StepRecord(s, 3) for s in (1, 2, 3, 4, 5, 6, 5, 6, 7)]
    assert lost_steps(history, 4) == [5, 6, 7]
    assert lost_steps(history, 7) == []
    assert lost_steps([], 0) == []


def test_previous_world_size_prefers_the_journal_over_the_checkpoint():
    assert previous_world_size([StepRecord(1, 3), StepRecord(2, 2)], 3) == 2
    assert previous_world_size([StepRecord(1, None)], 3) == 3  # a journal from before the field existed
    assert previous_world_size([], None) is None


def test_resume_fields_after_a_node_loss():
    history = [StepRecord(s, 3) for s in range(1, 8)]
    fields = resume_fields(history, 6, 3, 2, 1)
    assert fields == {
        "old_world_size": 3,
        "new_world_size": 2,
        "world_size_changed": True,
        "lost_steps": 1,
        "lost_first_step": 7,
        "lost_last_step": 7,
        "restart_count": 1,
    }
    same = resume_fields(history[:6], 6, 3, 3, None)
    assert same["world_size_changed"] is False and same["lost_steps"] == 0 and same["lost_first_step"] is None
    assert resume_fields([], 2, None, 2, 0)["world_size_changed"] is False  # unknown is not a change


def test_restart_count_only_under_torchrun():
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({}) is None
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "x"}) is None


def test_batch_digest_depends_on_the_indices_and_their_order():
    assert batch_digest([1, 2, 3]) == batch_digest((1, 2, 3))
    assert batch_digest([1, 2, 3]) != batch_digest([3, 2, 1])
    assert batch_digest([1, 23]) != batch_digest([12, 3])
    assert len(batch_digest([])) == 16


def test_read_step_history_of_a_missing_journal_is_empty(tmp_path):
    assert read_step_history(str(tmp_path / "events.jsonl")) == []


def test_a_world_size_change_is_no_config_change(make_config):
    """The guard compares configs; the world size is not part of one (it is saved beside it)."""
    cfg, _ = make_config()

    class Stub:
        pass

    stub = Stub()
    stub.cfg = cfg
    state = {"config": cfg.to_dict(), "config_digest": cfg.digest(), "world_size": 3}
    assert guard_config(stub, state) == []


def expected_digests(cfg, steps):
    sampler = PromptSampler(cfg.model.tiny.num_prompts, cfg.ppo.train_batch_size, cfg.run.seed, cfg.data.shuffle)
    return [batch_digest(sampler.next_batch()) for _ in range(steps)]


def test_resume_after_a_crash_between_checkpoints_reports_the_lost_step(make_config, tmp_path, monkeypatch):
    cfg, _ = make_config({"max_steps": 5, "checkpoint": {"every_steps": 2}})
    run_dir = str(tmp_path / "run")
    first = PPOTrainer(cfg, run_dir)
    first.train(2)  # checkpoint at step 2
    first.train_step()  # step 3 completes and is journalled, then the "node" is lost before a checkpoint
    first.journal.close()  # no run.finished: the process died
    first.journal = None
    first.close()

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = PPOTrainer(cfg, run_dir, resume="auto")
    try:
        assert second.step == 2 and second.checkpoint_world_size == 1
        value = second.metrics.registry.get_sample_value
        assert value("warden_trainer_world_size") == 1 and value("warden_trainer_restart_count") == 1
        assert value("warden_trainer_resume_lost_steps") == 1
        second.train()
    finally:
        second.close()
    events = journal(run_dir)
    resumed = next(e for e in events if e.type == ev.RUN_RESUMED)
    assert resumed.step == 2
    assert {k: resumed.data[k] for k in ("old_world_size", "new_world_size", "world_size_changed")} == {
        "old_world_size": 1,
        "new_world_size": 1,
        "world_size_changed": False,
    }
    assert (resumed.data["lost_steps"], resumed.data["lost_first_step"], resumed.data["lost_last_step"]) == (1, 3, 3)
    assert resumed.data["restart_count"] == 1
    # After dropping the lost step's first run, the run drew exactly the uninterrupted sequence.
    at = events.index(resumed)
    before = [e for e in events[:at] if e.type == ev.STEP_COMPLETED and e.step <= resumed.step]
    after = [e for e in events[at:] if e.type == ev.STEP_COMPLETED]
    assert [e.step for e in after] == [3, 4, 5]
    assert [e.data["batch_digest"] for e in before + after] == expected_digests(cfg, 5)
    assert {e.data["world_size"] for e in before + after} == {1}
    assert events[-1].type == ev.RUN_FINISHED and events[-1].data["status"] == "completed"


def test_a_restart_before_the_first_checkpoint_starts_over_and_says_so(make_config, tmp_path, monkeypatch):
    cfg, _ = make_config({"max_steps": 2, "checkpoint": {"every_steps": 0}})
    run_dir = str(tmp_path / "run")
    first = PPOTrainer(cfg, run_dir)
    first.train_step()  # step 1 journalled, no checkpoint; the node is lost
    first.close()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = PPOTrainer(cfg, run_dir, resume="auto")
    second.close()
    started = [e for e in journal(run_dir) if e.type == ev.RUN_STARTED]
    assert "restart_count" not in started[0].data  # a plain start says nothing of restarts
    again = started[-1].data
    assert (again["restart_count"], again["lost_steps"], again["lost_first_step"], again["new_world_size"]) == (
        1,
        1,
        1,
        1,
    )


def test_rank_0_chooses_the_checkpoint_and_the_others_follow_it():
    """What rank 0 broadcasts, and what another rank makes of a fresh start or a refusal (pure parts)."""
    from trainer.distributed import DistInfo
    from trainer.resume import ResumeResult, _choice, _follow

    assert _choice(ResumeResult(4, "/ckpt/step-000000004", "signature verified"), ["x"]) == (
        "resume",
        4,
        "/ckpt/step-000000004",
    )
    assert _choice(None, ["/ckpt/step-000000004 (no signature)"]) == ("refused", "/ckpt/step-000000004 (no signature)")
    assert _choice(None, []) == ("fresh",)

    class Rank1:
        dist = DistInfo(rank=1, world_size=2)

    assert _follow(Rank1(), ("fresh",), None, False) == (None, [])
    assert _follow(Rank1(), ("refused", "why"), None, False) == (None, ["rank 0: why"])
