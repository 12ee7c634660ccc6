"""``warden audit snapshot`` and ``list``: one step's record, verified, and the archived steps of a run.

- :func:`fetch_snapshot`: one step's record, its signature checked against trusted keys
  and its link to the previous record checked, in at most 3 store requests (the record,
  the previous record or the run's head for the first record). A step that is not there is
  told apart: ``missing`` (a violation) when it is proved archived (a delete marker or a
  retained version of it, a later record chained to it, or the signed head naming it or a
  later step whose record is gone too, or the run's head itself gone), else "not archived"
  (:class:`StepNotFound`, exit 3) naming the steps near it.
- :func:`list_steps`: the archived steps of a run.

The attacker in mind: :mod:`warden.archive.findings`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from warden.archive.errors import ObjectRefused, RecordInvalid, StepNotFound, StoreError
from warden.archive.findings import Break, code_kind, deleted_note, key_versions, read_head
from warden.archive.record import Record, object_hash, step_from_key, step_key, steps_prefix
from warden.archive.signing import verify_record
from warden.archive.store import DEFAULT_MAX_OBJECT_BYTES, Store
from warden.signing.keys import TrustedKeys

NEARBY = 5


@dataclass
class Snapshot:
    """A fetched record, its signer, and the state of its link to the previous record."""

    run_id: str
    step: int
    key: str
    record: dict[str, Any]
    key_id: str
    link: str
    problem: Break | None = None
    requests: int = 0
    seconds: float = 0.0


def fetch_snapshot(
    store: Store, run_id: str, step: int, trusted: TrustedKeys, max_record_bytes: int = DEFAULT_MAX_OBJECT_BYTES
) -> Snapshot:
    """The verified record of ``step``; see the module docstring.

    Raises StepNotFound (the step was never archived, as far as the store shows),
    RecordInvalid (the record does not verify, or it is proved archived and is gone:
    code ``missing``); link failures are a Break in the result's ``problem``.
    """
    started, before = time.perf_counter(), store.requests
    key = step_key(run_id, step)
    where = f"run {run_id} step {step} ({store.url}/{key})"
    try:
        body = store.get(key, max_record_bytes)
    except ObjectRefused as exc:
        raise RecordInvalid(f"{where}: {exc}", "malformed") from None
    if body is None:
        _missing(store, run_id, step, trusted)
    assert body is not None
    record, key_id = verify_record(body, trusted, where)
    result = Snapshot(run_id, step, key, dict(record.body), key_id, "")
    if record.run_id != run_id or record.step != step:
        result.problem = Break(
            step,
            "reordered",
            f"the object for run {run_id} step {step} holds the record of run {record.run_id} step {record.step}: "
            "records were moved or swapped",
        )
    elif record.prev_step is None:
        result.link, result.problem = _check_genesis(store, record, trusted)
    else:
        result.link, result.problem = _check_previous(store, record, trusted, max_record_bytes)
    result.requests = store.requests - before
    result.seconds = time.perf_counter() - started
    return result


def _check_genesis(store: Store, record: Record, trusted: TrustedKeys) -> tuple[str, Break | None]:
    read = read_head(store, record.run_id, trusted)
    head, problem, present = read.head, read.problem, read.present
    if problem is not None:
        return "first record of the run", problem
    if head is None:
        assert not present
        message = f"run {record.run_id} has records but its head object is missing: it was deleted"
        return "first record of the run", Break(None, "missing", message)
    if head.genesis is not None and head.genesis != record.prev:
        message = f"step {record.step} starts the chain from {record.prev}, but the run's genesis is {head.genesis}"
        return "first record of the run", Break(record.step, "altered", message)
    return f"first record of the run (genesis {record.prev[:16]}… matches the run's head)", None


def _check_previous(store: Store, record: Record, trusted: TrustedKeys, cap: int) -> tuple[str, Break | None]:
    assert record.prev_step is not None
    prev_step, run_id, step = record.prev_step, record.run_id, record.step
    if prev_step >= step:
        return "", Break(step, "reordered", f"step {step} links forward to step {prev_step}")
    try:
        prev_body = store.get(step_key(run_id, prev_step), cap)
    except ObjectRefused as exc:
        return "", Break(prev_step, "malformed", str(exc))
    if prev_body is None:
        message = f"step {prev_step}, which step {step} is chained to, is missing from the store"
        return "", Break(prev_step, "missing", message)
    if object_hash(prev_body) != record.prev:
        message = (
            f"step {prev_step} differs from the record step {step} was chained to "
            f"(SHA-256 {object_hash(prev_body)[:16]}…, expected {record.prev[:16]}…): it was altered or replaced"
        )
        return "", Break(prev_step, "altered", message)
    try:
        verify_record(prev_body, trusted, f"run {run_id} step {prev_step}")
    except RecordInvalid as exc:
        return "", Break(prev_step, code_kind(exc), str(exc))
    return f"chained to step {prev_step} (SHA-256 {record.prev[:16]}… matches)", None


def _missing(store: Store, run_id: str, step: int, trusted: TrustedKeys) -> None:
    """Raises RecordInvalid(``missing``) when ``step`` is proved archived, else StepNotFound."""
    where = f"run {run_id} step {step} is not in {store.url}"
    try:
        note = deleted_note(key_versions(store, step_key(run_id, step)))
    except StoreError:
        note = ""  # e.g. no s3:ListBucketVersions: the other proofs below still apply
    if note:
        raise RecordInvalid(f"{where}, but it was archived: it was deleted{note}", "missing")
    low = max(0, step - NEARBY)
    start = step_key(run_id, low - 1) if low > 0 else None
    keys = store.list_keys(steps_prefix(run_id), start_after=start, limit=2 * NEARBY + 1)
    nearby = tuple(s for s in (step_from_key(k) for k in keys) if s is not None)
    later = [s for s in nearby if s > step]
    if later:
        try:
            next_body = store.get(step_key(run_id, later[0]))
            following = verify_record(next_body, trusted, f"run {run_id} step {later[0]}")[0] if next_body else None
        except (RecordInvalid, ObjectRefused):
            following = None
        if following is not None and following.prev_step == step:
            raise RecordInvalid(
                f"{where}, but step {later[0]} is chained to it: the record was deleted or hidden by a delete marker",
                "missing",
            )
    read = read_head(store, run_id, trusted)
    head, problem = read.head, read.problem
    if head is None and problem is None and (nearby or store.list_keys(steps_prefix(run_id), limit=1)):
        raise RecordInvalid(
            f"{where}, and the run's head object is missing although the run has records: it was deleted, "
            f"so which steps were archived cannot be told from the store",
            "missing",
        )
    if problem is not None:
        raise RecordInvalid(f"{where}; the run's head does not verify either: {problem.message}", problem.kind)
    if head is not None and head.last_step == step:
        raise RecordInvalid(f"{where}, but the signed head names it as the newest archived record: deleted", "missing")
    if head is not None and head.last_step > step and store.get(step_key(run_id, head.last_step)) is None:
        raise RecordInvalid(
            f"{where}, and step {head.last_step}, which the signed head names, is missing too: "
            f"records up to step {head.last_step} were deleted; step {step} may be one of them",
            "missing",
        )
    beyond = (
        f" (the signed head is at step {head.last_step}: not archived yet?)" if head and step > head.last_step else ""
    )
    if not nearby:
        raise StepNotFound(f"run {run_id} step {step} was not archived: none near it in {store.url}{beyond}", nearby)
    listed = ", ".join(str(s) for s in nearby)
    raise StepNotFound(
        f"run {run_id} has no record for step {step} in {store.url} (not archived){beyond}; steps near it: {listed}",
        nearby,
    )


def list_steps(store: Store, run_id: str) -> list[int]:
    """The archived steps of ``run_id``, ascending."""
    return [s for s in (step_from_key(k) for k in store.list_keys(steps_prefix(run_id))) if s is not None]
