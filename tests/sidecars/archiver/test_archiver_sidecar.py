"""The archiver sidecar in this process: records, replays, bad events, conflicts, crash points."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support import free_port

from sidecars.runtime import Outcome
from tests.warden.archive.archiver_helpers import CONFIG_DIGEST, Harness, metric, snapshot_data
from warden.archive.chain import ChainState
from warden.archive.errors import ObjectLockMissing
from warden.archive.lookup import fetch_snapshot, list_steps
from warden.archive.record import head_key, step_key
from warden.archive.spool import Spool
from warden.archive.store import FileStore, S3Store, open_store
from warden.archive.verify import verify_run
from warden.signing.keys import load_trusted_keys


class Crash(BaseException):
    """Stands for the process dying at this point: nothing catches it."""


@pytest.fixture
def harness(tmp_path, keys):
    return Harness(tmp_path, f"file://{tmp_path}/archive", keys[0])


def verified(h: Harness, public_key: str):
    store = open_store(h.store_url)
    report = verify_run(store, h.run_id, load_trusted_keys(public_key))
    return store, report


def test_snapshots_become_a_signed_chain_with_a_checkpoint_reference(harness, keys):
    harness.start()
    harness.snapshots([1, 2])
    harness.journal.emit("checkpoint.saved", {"path": "/runs/x/checkpoints/step-000000002"}, step=2)
    harness.snapshots([3, 4, 5])
    outcome, sidecar = harness.once()
    assert outcome is Outcome.OK
    store, report = verified(harness, keys[1])
    assert report.problem is None and report.checked == 5 and report.head.last_step == 5
    assert report.head.genesis == CONFIG_DIGEST and report.head.first_step == 1
    first = fetch_snapshot(store, "run-1", 1, load_trusted_keys(keys[1]))
    assert first.record["prev"] == CONFIG_DIGEST and first.record["prev_step"] is None
    assert first.record["checkpoint"] is None
    third = fetch_snapshot(store, "run-1", 3, load_trusted_keys(keys[1]))
    assert third.record["checkpoint"] == {"step": 2, "path": "/runs/x/checkpoints/step-000000002"}
    assert [s["index"] for s in third.record["samples"]] == [
        s["index"] for s in sorted(snapshot_data(3)["samples"], key=lambda s: (-s["reward"], s["index"]))[:3]
    ]
    assert metric(sidecar, "warden_archiver_records_archived_total") == 5
    assert metric(sidecar, "warden_archiver_spool_depth") == 0
    assert harness.spooled_files() == []


def test_a_replayed_journal_archives_nothing_twice(harness, keys):
    harness.start()
    harness.snapshots(range(1, 6))
    assert harness.once()[0] is Outcome.OK
    os.unlink(harness.state_dir / "cursor.json")  # the whole journal is delivered again
    outcome, sidecar = harness.once()
    assert outcome is Outcome.OK and metric(sidecar, "warden_archiver_replayed_steps_total") == 5
    # A resumed trainer re-running steps 4-5 with other samples: the first record of a step stands.
    harness.journal.emit("run.resumed", {"from_step": 3})
    harness.snapshots([4, 5], seed=99)
    harness.snapshots([6])
    outcome, sidecar = harness.once()
    assert outcome is Outcome.OK and metric(sidecar, "warden_archiver_replayed_steps_total") == 0
    assert metric(sidecar, "warden_archiver_superseded_snapshots_total") == 2  # counted, never silent
    assert verified(harness, keys[1])[1].problem is None
    assert list_steps(open_store(harness.store_url), "run-1") == [1, 2, 3, 4, 5, 6]


def test_a_lost_state_directory_continues_the_stored_chain(harness, keys):
    harness.start()
    harness.snapshots(range(1, 4))
    assert harness.once()[0] is Outcome.OK
    shutil.rmtree(harness.state_dir)
    harness.snapshots(range(4, 7))
    outcome, sidecar = harness.once()
    assert outcome is Outcome.OK and metric(sidecar, "warden_archiver_conflicts_total") == 0
    report = verified(harness, keys[1])[1]
    assert report.problem is None and report.checked == 6 and report.head.genesis == CONFIG_DIGEST


def test_a_chain_signed_by_another_key_is_not_extended(tmp_path, keys):
    from tests.warden.archive.archiver_helpers import make_keys

    h = Harness(tmp_path, f"file://{tmp_path}/archive", keys[0])
    h.start()
    h.snapshots([1])
    assert h.once()[0] is Outcome.OK
    shutil.rmtree(h.state_dir)
    h.private_key = make_keys(tmp_path / "other")[0]
    h.snapshots([2])
    outcome, sidecar = h.once()
    assert outcome is Outcome.INCOMPLETE  # neither forks nor adopts: the events wait in the journal
    assert metric(sidecar, "warden_sidecar_errors_total", sidecar="archiver", kind="retry_later") == 1
    assert h.spooled_files() == []


def raw_line(h: Harness, seq: int, step: int, data_json: str) -> None:
    line = (
        f'{{"v":1,"seq":{seq},"run_id":"{h.run_id}","type":"reward.snapshot",'
        f'"time":"2026-11-30T00:00:00.000000Z","step":{step},"data":{data_json}}}\n'
    )
    with open(h.run_dir / "events.jsonl", "ab") as fh:
        fh.write(line.encode("utf-8", "surrogatepass"))


def test_bad_events_are_archived_with_notes_or_refused(harness, keys):
    harness.start()  # seq 1
    harness.journal.emit("reward.snapshot", {"k": 4}, step=1)  # no samples at all
    huge = {"samples": [{"index": 0, "prompt": "p" * 100_000, "response": "ok", "reward": 1.0}]}
    harness.journal.emit("reward.snapshot", huge, step=2)
    harness.journal.emit("reward.snapshot", {"samples": [{"index": 0, "prompt": "p"}]}, step=3)
    harness.journal.emit("reward.snapshot", snapshot_data(4), step=None)  # no step: cannot be keyed
    harness.journal.close()
    raw_line(harness, 6, 5, '{"samples":[{"index":0,"prompt":"lone \\udc80","response":"r","reward":0.5}]}')
    with open(harness.run_dir / "events.jsonl", "ab") as fh:  # raw invalid UTF-8: a corrupt journal line
        fh.write(b'{"v":1,"seq":7,"run_id":"run-1","type":"reward.snapshot","time":"t","step":6,"data":"\xff\xfe"}\n')
    raw_line(harness, 8, 7, json.dumps(snapshot_data(7)))
    outcome, sidecar = harness.once()
    assert outcome is Outcome.INCOMPLETE  # the step-less event could not be archived
    store, report = verified(harness, keys[1])
    assert report.problem is None and list_steps(store, "run-1") == [1, 2, 3, 5, 7]
    trusted = load_trusted_keys(keys[1])
    one = fetch_snapshot(store, "run-1", 1, trusted).record
    assert one["samples"] == [] and "no 'samples'" in one["notes"][0]
    two = fetch_snapshot(store, "run-1", 2, trusted).record
    assert two["samples"][0]["truncated"] and two["samples"][0]["original_bytes"] == {"prompt": 100_000}
    assert len(two["samples"][0]["prompt"]) == 256 and "truncated from 100000 to 256 bytes" in two["notes"][0]
    three = fetch_snapshot(store, "run-1", 3, trusted).record
    assert three["samples"] == [] and "dropped" in three["notes"][0]
    five = fetch_snapshot(store, "run-1", 5, trusted).record
    assert five["samples"][0]["prompt"] == "lone \ufffd" and five["samples"][0]["repaired"]
    seven = fetch_snapshot(store, "run-1", 7, trusted).record
    assert seven["prev_step"] == 5  # the corrupt line (step 6) was skipped by the journal reader
    for reason, count in (("no_samples", 1), ("truncated_text", 1), ("dropped_sample", 1), ("repaired_text", 1)):
        assert metric(sidecar, "warden_archiver_event_problems_total", reason=reason) == count
    assert metric(sidecar, "warden_archiver_event_problems_total", reason="unusable_event") == 1
    assert metric(sidecar, "warden_sidecar_errors_total", sidecar="archiver", kind="journal_corrupt_line") == 1


def test_an_unusable_run_id_is_refused(harness):
    harness.journal.close()
    with open(harness.run_dir / "events.jsonl", "ab") as fh:
        fh.write(b'{"v":1,"seq":1,"run_id":"../etc","type":"reward.snapshot","time":"t","step":1,"data":{}}\n')
    outcome, sidecar = harness.once()
    assert outcome is Outcome.INCOMPLETE
    assert metric(sidecar, "warden_archiver_event_problems_total", reason="unusable_event") == 1
    assert not os.path.exists(harness.root / "archive" / "runs")


def test_a_conflicting_object_is_a_violation_and_never_overwritten(harness, keys):
    harness.start()
    assert harness.once()[0] is Outcome.OK
    store = open_store(harness.store_url)
    store.create(step_key("run-1", 2), b"someone else's bytes")  # e.g. a second archiver on the same run
    harness.snapshots([1, 2, 3])
    outcome, sidecar = harness.once()
    assert outcome is Outcome.VIOLATION
    assert metric(sidecar, "warden_archiver_conflicts_total") == 1
    assert store.get(step_key("run-1", 2)) == b"someone else's bytes"
    assert harness.spooled_files() == [".conflicts/run-1/000000000002.json"]
    report = verified(harness, keys[1])[1]
    assert (
        report.problem is not None and report.problem.step == 2 and report.problem.kind == "malformed"
    )  # not a bundle at all


def test_object_lock_required_on_a_store_without_it_refuses_to_start(harness):
    harness.policy_fields["retention"] = {"mode": "COMPLIANCE", "days": 1}
    with pytest.raises(ObjectLockMissing, match="Object Lock") as info:
        harness.sidecar()
    assert info.value.exit_code == 2


def test_an_unreachable_store_spools_and_a_later_pass_drains_in_order(
    tmp_path, keys, seaweed, lock_bucket, s3env, monkeypatch
):
    s3env(seaweed)
    h = Harness(tmp_path, f"s3://{lock_bucket}/a", keys[0])
    h.start()
    assert h.once()[0] is Outcome.OK  # run.started looks the run up in the store
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    h.snapshots(range(1, 8))
    outcome, sidecar = h.once()
    assert outcome is Outcome.INCOMPLETE
    assert metric(sidecar, "warden_archiver_spool_depth") == 7
    assert metric(sidecar, "warden_archiver_store_errors_total", kind="connect") >= 1
    assert metric(sidecar, "warden_archiver_store_up") == 0
    assert metric(sidecar, "warden_archiver_spool_oldest_age_seconds") >= 0
    s3env(seaweed)
    outcome, sidecar = h.once()
    assert outcome is Outcome.OK and h.spooled_files() == []
    assert metric(sidecar, "warden_archiver_records_archived_total") == 7
    assert verified(h, keys[1])[1].problem is None


# --- crash points: the process "dies" (an uncatchable exception) between two steps --------------


def crash_once(monkeypatch, owner, name):
    original = getattr(owner, name)
    state = {"fired": False}

    def dying(*args, **kwargs):
        if not state["fired"]:
            state["fired"] = True
            raise Crash(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, dying)
    return state


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (ChainState, "advance"),  # record spooled, chain head not saved
        (Spool, "remove"),  # record stored, still spooled
        (Spool, "set_head"),  # batch stored, head not spooled
        (S3Store, "put"),  # records stored and forgotten, head not put
    ],
)
def test_a_crash_at_each_point_loses_and_duplicates_nothing(
    tmp_path, keys, seaweed, lock_bucket, s3env, monkeypatch, owner, name
):
    s3env(seaweed)
    run_id = f"crash-{name}"
    h = Harness(tmp_path, f"s3://{lock_bucket}", keys[0], run_id, retention={"mode": "COMPLIANCE", "days": 1})
    h.start()
    h.snapshots(range(1, 7))
    state = crash_once(monkeypatch, owner, name)
    with pytest.raises(Crash):
        h.once()
    assert state["fired"]
    h.snapshots(range(7, 9))
    assert h.once()[0] is Outcome.OK
    client = seaweed.client()
    listing = client.list_object_versions(Bucket=lock_bucket, Prefix=f"runs/{run_id}/steps/")
    versions = [v["Key"] for v in listing.get("Versions", [])]
    assert sorted(versions) == [step_key(run_id, s) for s in range(1, 9)]  # exactly one version each
    assert not listing.get("DeleteMarkers")
    assert h.spooled_files() == []
    report = verified(h, keys[1])[1]
    assert report.problem is None and report.head.last_step == 8
    assert open_store(h.store_url).get(head_key(run_id)) is not None


def test_the_same_drill_on_moto_a_second_s3_implementation(tmp_path, keys, moto, s3env, monkeypatch):
    s3env(moto)
    bucket = moto.make_bucket(lock=True)
    h = Harness(tmp_path, f"s3://{bucket}/m", keys[0], retention={"mode": "COMPLIANCE", "days": 1})
    h.start()
    h.snapshots(range(1, 9))
    state = crash_once(monkeypatch, Spool, "remove")
    with pytest.raises(Crash):
        h.once()
    assert state["fired"]
    os.unlink(h.state_dir / "cursor.json")  # and a full replay on top
    outcome, sidecar = h.once()
    assert outcome is Outcome.OK and metric(sidecar, "warden_archiver_conflicts_total") == 0
    listing = moto.client().list_object_versions(Bucket=bucket, Prefix="m/runs/run-1/steps/")
    assert sorted(v["Key"] for v in listing["Versions"]) == [f"m/{step_key('run-1', s)}" for s in range(1, 9)]
    assert verified(h, keys[1])[1].problem is None


def test_records_after_the_newest_present_may_be_in_flight_but_a_gap_before_it_is_missing(harness, keys, monkeypatch):
    harness.start()
    harness.snapshots(range(1, 4))
    assert harness.once()[0] is Outcome.OK  # head at step 3
    harness.snapshots(range(4, 7))
    crash_once(monkeypatch, FileStore, "put")  # records 4-6 stored, the head is not moved
    with pytest.raises(Crash):
        harness.once()
    report = verified(harness, keys[1])[1]
    assert report.problem is None and report.head.last_step == 3 and report.after_head == [4, 5, 6]
    archive = harness.root / "archive"
    os.unlink(archive / step_key("run-1", 6))  # the newest: as if its put were still in flight
    report = verified(harness, keys[1])[1]
    assert report.problem is None and report.after_head == [4, 5]
    os.unlink(archive / step_key("run-1", 4))  # before the newest present (5 is chained to it): deleted
    report = verified(harness, keys[1])[1]
    assert [(f.kind, f.step) for f in report.findings] == [("missing", 4)]
