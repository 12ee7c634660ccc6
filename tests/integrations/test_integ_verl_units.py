"""Pure parts of the verl bridge: log lines, restart detection, dumps, top-k, tracker, state."""

from __future__ import annotations

import json
import os

import pytest

from sidecars.bridge.rollouts import (
    DumpFile,
    Evidence,
    later_written,
    parse_dump,
    snapshot_payload,
    waiting_reason,
)
from sidecars.bridge.state import BridgeState, LogPosition, StateStore, StepSet, apply_marker, marker
from sidecars.bridge.verl import derive_run_id
from sidecars.bridge.verl_log import parse_log_line, tail
from warden.layouts import (
    StepContents,
    completion_blocker,
    list_steps,
    observe,
    parse_tracker,
    pruned_roles,
    read_tracker,
)
from warden.stability import tree_state


def test_parse_log_line():
    assert parse_log_line(b'{"step": 3, "data": {"a/b": 1.5, "n": NaN}}') == (3, {"a/b": 1.5, "n": None})
    assert parse_log_line(b'{"step": 3.0, "data": {}}') == (3, {})
    assert "not JSON" in parse_log_line(b'{"step": 3, "da')
    assert "object" in parse_log_line(b"[1, 2]")
    assert "step" in parse_log_line(b'{"step": -1, "data": {}}')
    assert "step" in parse_log_line(b'{"step": true, "data": {}}')
    assert "data" in parse_log_line(b'{"step": 1, "data": [1]}')


def _write(path, content: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(content)


def _advance(pos: LogPosition, read) -> None:
    for line in read.lines:
        pos.offset, pos.line_start, pos.line_sha256 = line.end, line.start, line.sha256
    pos.file_id = read.file_id


def test_tail_reads_complete_lines_and_waits_for_a_torn_one(tmp_path):
    path = tmp_path / "log.jsonl"
    _write(path, b'{"step":1,"data":{"x":1}}\n{"step":2,"data":{"x":2}}\n{"step":3,"da')
    pos = LogPosition()
    read = tail(str(path), pos)
    assert read.exists and read.restart is None
    assert [line.step for line in read.lines] == [1, 2]
    _advance(pos, read)
    assert tail(str(path), pos).lines == []
    with open(path, "ab") as fh:
        fh.write(b'ta":{"x":3}}\nnot json\n')
    read = tail(str(path), pos)
    assert [line.step for line in read.lines] == [3, None]
    assert "not JSON" in (read.lines[1].problem or "")


def test_tail_missing_file(tmp_path):
    read = tail(str(tmp_path / "nope.jsonl"), LogPosition())
    assert not read.exists and read.lines == []


@pytest.mark.parametrize("how", ["shorter", "regrown", "replaced"])
def test_restart_detection(tmp_path, how):
    path = tmp_path / "log.jsonl"
    first = b"".join(json.dumps({"step": s, "data": {"x": s}}).encode() + b"\n" for s in (1, 2, 3))
    _write(path, first)
    pos = LogPosition()
    _advance(pos, tail(str(path), pos))
    resumed = b"".join(json.dumps({"step": s, "data": {"x": s * 10}}).encode() + b"\n" for s in (2, 3, 4, 5))
    if how == "shorter":
        with open(path, "r+b") as fh:  # "wb" on an open path: same inode, truncated
            fh.truncate(0)
            fh.write(resumed[:20])
    elif how == "regrown":
        with open(path, "r+b") as fh:
            fh.truncate(0)
            fh.write(resumed)  # longer than before: only the changed last line tells
        assert os.path.getsize(path) > pos.offset
    else:
        os.unlink(path)
        _write(path, resumed)
    read = tail(str(path), pos)
    assert read.restart is not None, how
    expected = [] if how == "shorter" else [2, 3, 4, 5]
    assert [line.step for line in read.lines] == expected


def test_oversized_line_is_skipped(tmp_path):
    path = tmp_path / "log.jsonl"
    _write(path, b'{"step":1,"data":{}}\n' + b"x" * 300 + b'\n{"step":2,"data":{}}\n')
    lines = tail(str(path), LogPosition(), max_line=100).lines
    assert [line.step for line in lines] == [1, None, 2]
    assert "limit" in (lines[1].problem or "")


def test_parse_dump_and_partials():
    rows = [{"input": "p", "output": "o", "score": 1.0}] * 3
    text = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    assert not parse_dump(text).torn and len(parse_dump(text).rows) == 3
    assert parse_dump(text[:-5]).torn
    assert len(parse_dump(text[:-5]).rows) == 2
    assert parse_dump(b"").torn
    bad = parse_dump(text + b"garbage\n[1]\n")
    assert bad.bad_lines == 2 and len(bad.rows) == 3


def test_snapshot_payload_top_k_by_score_ties_by_index(verl_kit):
    rows = verl_kit.rollout_rows(5, 10)
    rows[3]["score"] = float("nan")
    rows[4].pop("output")
    text = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    payload = snapshot_payload(parse_dump(text), top_k=3, min_reward=None, max_text_chars=20).to_data()
    valid = [r if i not in (3, 4) else {**r, "score": -1e9} for i, r in enumerate(rows)]
    assert [s["index"] for s in payload["samples"]] == verl_kit.top_indices(valid, 3)
    assert payload["dropped"] == 2 and payload["offered"] == 10
    first = payload["samples"][0]
    assert first["reward"] == rows[first["index"]]["score"]
    assert first["prompt"] == rows[first["index"]]["input"][:20] and first["truncated"] is True
    high = snapshot_payload(parse_dump(text), top_k=10, min_reward=0.5, max_text_chars=4000)
    assert high.samples and all(s["reward"] >= 0.5 for s in high.samples)


def test_waiting_reason_rules():
    dump = DumpFile(5, "/r/5.jsonl", 100, mtime_ns=1_000, newest_change=0.0)
    assert waiting_reason(dump, Evidence()) is not None
    assert waiting_reason(dump, Evidence(log_step=5, log_mtime_ns=2_000)) is None
    assert waiting_reason(dump, Evidence(log_step=4, log_mtime_ns=2_000)) is not None
    # a log line older than the dump says nothing (verl restarted and is rewriting it)
    assert waiting_reason(dump, Evidence(log_step=9, log_mtime_ns=500)) is not None
    assert waiting_reason(dump, Evidence(later_dump=True)) is None
    assert waiting_reason(dump, Evidence(quiet_seconds=31, stable_seconds=30)) is None


def test_later_written():
    dumps = [DumpFile(s, f"/r/{s}.jsonl", 1, m, 0.0) for s, m in ((1, 10), (2, 20), (3, 5), (4, 30))]
    assert later_written(dumps) == {1, 2, 3}


def test_tracker_parsing(tmp_path):
    assert parse_tracker("12") == 12 and parse_tracker(" 12\n") == 12
    assert parse_tracker("") is None and parse_tracker("1x") is None and parse_tracker("١٢") is None
    assert read_tracker(str(tmp_path)) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40")
    tracker = read_tracker(str(tmp_path))
    assert tracker is not None and tracker.step == 40 and tracker.mtime_ns > 0


def test_tree_state_and_steps(tmp_path):
    assert tree_state(str(tmp_path / "missing")) is None
    (tmp_path / "global_step_10" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_10" / "actor" / "model.pt").write_bytes(b"x")
    (tmp_path / "global_step_20").mkdir()
    (tmp_path / "global_step_30").symlink_to(tmp_path / "global_step_20")
    model = str(tmp_path / "global_step_10" / "actor" / "model.pt")
    first = tree_state(str(tmp_path / "global_step_10"))
    assert first is not None and (model, 1, os.lstat(model).st_mtime_ns) in first.fingerprint
    (tmp_path / "global_step_10" / "data.pt").write_bytes(b"yy")
    assert tree_state(str(tmp_path / "global_step_10")).fingerprint != first.fingerprint
    assert tree_state(str(tmp_path / "global_step_30")) is None  # a link is not walked
    assert list_steps(str(tmp_path)) == [10, 20]
    assert list_steps(str(tmp_path / "missing")) == []


def test_completion_rule():
    fsdp = StepContents(roles=("actor", "critic"), manifests=(), dataloader=True)
    assert completion_blocker(10, 10, fsdp) is None
    assert "not the step named" in (completion_blocker(10, 20, fsdp) or "")
    assert "not the step named" in (completion_blocker(30, 20, fsdp) or "")
    done = StepContents(roles=("actor", "critic"), manifests=("actor", "critic"), dataloader=True, marker_mtime_ns=5)
    assert completion_blocker(30, 20, done) is None  # async_save: verl's manifests, no tracker
    half = StepContents(roles=("actor", "critic"), manifests=("actor",), dataloader=True)
    assert "critic/" in (completion_blocker(30, 20, half) or "")
    no_data = StepContents(roles=("actor",), manifests=("actor",), dataloader=False)
    assert "data.pt" in (completion_blocker(30, None, no_data) or "")
    pruned = StepContents(roles=(), manifests=(), dataloader=True)
    assert "no actor/" in (completion_blocker(10, 20, pruned) or "")


def test_observe(tmp_path):
    step = tmp_path / "global_step_5"
    (step / "actor").mkdir(parents=True)
    (step / "critic").mkdir()
    (step / "actor" / "ckpt_contents.json").write_text("{}")
    os.mkfifo(step / "critic" / "ckpt_contents.json")  # not a regular file: not a manifest
    (step / "data.pt").write_bytes(b"d")
    seen = observe(str(step))
    assert seen.roles == ("actor", "critic") and seen.manifests == ("actor",) and seen.dataloader
    assert seen.marker_mtime_ns == os.stat(step / "actor" / "ckpt_contents.json").st_mtime_ns


def test_pruned_roles():
    actor = ["actor/model_world_size_2_rank_0.pt", "actor/huggingface/config.json"]
    critic = ["critic/model_world_size_2_rank_0.pt"]
    assert pruned_roles(actor + critic, 0, []) == ("actor", "critic")
    assert pruned_roles(actor, 0, ["critic"]) == ("actor",)
    assert pruned_roles(actor[:1], 0, ["actor", "critic"]) is None  # one shard gone, actor/ still there
    assert pruned_roles([*actor, "data.pt"], 0, []) is None  # data.pt is not retention's
    assert pruned_roles(actor, 1, []) is None  # and a modified or extra file never is
    assert pruned_roles([], 0, []) is None
    assert pruned_roles(["extra/x.pt"], 0, []) is None


def test_derived_run_id_is_unique_and_never_a_generic_name():
    docs = derive_run_id("/runs/exp1/verl/metrics.jsonl", "/runs/exp1/verl/checkpoints", "/runs/exp1/warden", "ab12")
    assert docs == "exp1-ab12"
    default = derive_run_id("/logs/gsm8k/qwen-ppo.jsonl", None, "/r/warden", "cd34")
    assert default == "qwen-ppo-cd34"
    from_root = derive_run_id("/x/metrics.jsonl", "/ck/gsm8k/exp7", "/r/warden", "ef56")
    assert from_root == "exp7-ef56"
    assert derive_run_id(None, None, "/runs/warden", "0a0b") == "verl-run-0a0b"


def test_step_set():
    steps = StepSet([[1, 3], [7, 7]])
    for step in (4, 5, 10):
        steps.add(step)
    assert steps.ranges() == [[1, 5], [7, 7], [10, 10]]
    assert 5 in steps and 6 not in steps and len(steps) == 7
    with pytest.raises(ValueError):
        StepSet([[3, 1]])


def test_markers_rebuild_the_state_and_are_idempotent(tmp_path):
    events = [
        (None, marker("start")),
        (1, marker("log", generation=0, start=0, end=10, sha256="a")),
        (1, marker("rollout", file="1.jsonl", sha256="d")),
        (2, marker("log", generation=0, start=10, end=20, sha256="b")),
        (2, marker("checkpoint", tracker_mtime_ns=99)),
        (2, marker("restart", generation=1)),
        (2, marker("log", generation=1, start=0, end=7, sha256="c")),
        (3, {"source": "elsewhere", "kind": "log"}),
    ]
    state = BridgeState()
    applied = [apply_marker(state, step, m) for step, m in events]
    assert applied == [True] * 7 + [False]
    again = [apply_marker(state, step, m) for step, m in events]  # replaying changes nothing
    assert again == applied
    assert state.started and state.checkpoints == {2: 99} and state.rollouts.ranges() == [[1, 1]]
    assert (state.log.generation, state.log.offset, state.log.line_sha256, state.log.last_step) == (1, 7, "c", 2)
    store = StateStore(str(tmp_path / "state"))
    store.save(state)
    loaded = store.load()
    assert loaded.to_dict() == state.to_dict()
    (tmp_path / "state" / "verl.json").write_text("{not json")
    with pytest.raises(Exception, match="delete it"):
        store.load()


def test_a_tracker_naming_a_step_whose_other_role_is_still_writing_is_not_complete():
    """Megatron async_save: the actor's manifest and the tracker are written, the critic's not yet."""
    from warden.layouts import StepContents, completion_blocker

    writing = StepContents(roles=("actor", "critic"), manifests=("actor",), dataloader=True)
    blocker = completion_blocker(6, 6, writing)
    assert blocker is not None and "critic/ has no ckpt_contents.json yet" in blocker
    done = StepContents(roles=("actor", "critic"), manifests=("actor", "critic"), dataloader=True)
    assert completion_blocker(6, 6, done) is None
    fsdp = StepContents(roles=("actor", "critic"), manifests=(), dataloader=True)  # no manifests at all
    assert completion_blocker(6, 6, fsdp) is None
