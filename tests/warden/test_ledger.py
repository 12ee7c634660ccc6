"""warden.ledger: the journal as the index of what exists, against a model, over generated histories.

Each history is a random sequence of saves, announced prunes, silent deletions (the storage
writer), re-saves of a step and journal restarts (a reopened writer), written to a real journal;
the ledger read back must agree with a plain model of what the journal says and of what the disk
holds: every checkpoint saved and not pruned is live, and reconcile() names exactly the live ones
that were deleted without an event.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden import journal as ev
from warden.ledger import build_ledger, read_ledger, reconcile
from warden.payloads import CheckpointPruned, CheckpointSaved

RUN = "run-under-test"
STEPS = st.integers(min_value=0, max_value=12)
ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("save"), STEPS),
        st.tuples(st.just("prune"), STEPS),
        st.tuples(st.just("delete"), STEPS),
        st.tuples(st.just("restart"), st.just(0)),
        st.tuples(st.just("other_run"), STEPS),
    ),
    max_size=40,
)


def _play(journal: str, actions: list[tuple[str, int]]) -> tuple[set[int], set[int]]:
    """Writes the history; returns (steps the journal should call live, steps on disk)."""
    live: set[int] = set()
    disk: set[int] = set()
    writer = ev.EventWriter(journal, RUN)
    try:
        for action, step in actions:
            if action == "restart":
                writer.close()
                writer = ev.EventWriter(journal, RUN)
            elif action == "save":
                saved = CheckpointSaved(path=f"/ckpt/step-{step:09d}", root_digest=f"{step:064x}", file_count=3)
                writer.emit(saved.TYPE, saved.to_data(), step=step)
                live.add(step)
                disk.add(step)
            elif action == "prune" and step in live:
                pruned = CheckpointPruned(path=f"/ckpt/step-{step:09d}", step=step, reason="retention")
                writer.emit(pruned.TYPE, pruned.to_data(), step=step)
                live.discard(step)
                disk.discard(step)
            elif action == "delete":
                disk.discard(step)
            elif action == "other_run":
                with ev.EventWriter(journal, "another-run") as other:
                    saved = CheckpointSaved(path=f"/elsewhere/step-{step:09d}")
                    other.emit(saved.TYPE, saved.to_data(), step=step)
                writer.close()
                writer = ev.EventWriter(journal, RUN)
    finally:
        writer.close()
    return live, disk


@settings(
    max_examples=int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(actions=ACTIONS)
def test_the_ledger_agrees_with_the_history(tmp_path_factory, actions):
    journal = str(tmp_path_factory.mktemp("ledger") / ev.JOURNAL_NAME)
    live, disk = _play(journal, actions)
    ledger = read_ledger(journal, RUN)
    assert set(ledger.live) == live
    found = reconcile(ledger, disk)
    assert {a.step for a in found.missing} == live - disk
    assert found.ok == (live <= disk)
    assert found.unannounced == ()


def test_a_payload_that_does_not_parse_is_counted_not_trusted():
    bad = ev.Event(seq=1, run_id=RUN, type=ev.CHECKPOINT_SAVED, time="t", step=3, data={"path": 7})
    pruned_bad = ev.Event(seq=2, run_id=RUN, type=ev.CHECKPOINT_PRUNED, time="t", step=3, data={"path": "x"})
    ledger = build_ledger([bad, pruned_bad], RUN)
    assert ledger.live == {} and ledger.unreadable == 2


def test_an_incomplete_announcement_is_not_live_and_unannounced_steps_are_named():
    incomplete = CheckpointSaved(path="/c/step-000000005", complete=False, waiting_for=("rank 1",))
    event = ev.Event(seq=1, run_id=RUN, type=ev.CHECKPOINT_SAVED, time="t", step=5, data=incomplete.to_data())
    ledger = build_ledger([event], RUN)
    assert ledger.live == {}
    assert reconcile(ledger, [5, 9]).unannounced == (5, 9)
