"""What ``warden audit`` does, as functions over a :class:`~sidecars.archiver.store.Store`.

- :func:`fetch_snapshot`: one step's record, its signature checked against trusted keys
  and its link to the previous record checked, in at most 3 store requests: the record,
  then the previous record (or the run's head, for the first record). A missing step
  costs a listing of the steps around it, and one read of the next record, which tells
  "never archived" from "deleted" (the next record links to it).
- :func:`verify_run`: the whole chain in step order; the first break is reported as
  ``missing`` (a linked record is gone, e.g. hidden by a delete marker; a gap after the
  step the signed head names is only noted as pending: uploads there may be in flight), ``reordered``
  (a record under another step's key, or linking backwards), ``altered`` (signature
  fails, or a record's bytes differ from what the next one was chained to),
  ``wrong_key`` (signed by a key that is not trusted) or ``unexpected`` (a foreign object).
- :func:`list_steps`: the archived steps of a run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sidecars.archiver.errors import RecordInvalid, StepNotFound, StoreError
from sidecars.archiver.record import Head, Record, head_key, object_hash, step_from_key, step_key, steps_prefix
from sidecars.archiver.signing import verify_head, verify_record
from sidecars.archiver.store import Store
from sidecars.signer.keys import TrustedKeys

NEARBY = 5
FETCH_WINDOW = 1000


@dataclass(frozen=True)
class Break:
    """The first problem found: at which step, what kind, and a sentence for humans."""

    step: int | None
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "message": self.message}


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


def _code_kind(exc: RecordInvalid) -> str:
    return "wrong_key" if exc.code == "wrong_key" else "altered"


def _deletion_note(store: Store, run_id: str, step: int) -> str:
    """' (a delete marker hides N retained version(s))' when the store shows one; else ''."""
    try:
        versions = store.versions(step_key(run_id, step))
    except StoreError:
        return ""
    if versions and versions[0].is_delete_marker:
        kept = sum(1 for v in versions if not v.is_delete_marker)
        return f" (a delete marker hides {kept} retained version(s) of it)"
    return ""


# --- one step -------------------------------------------------------------------------------------


def fetch_snapshot(store: Store, run_id: str, step: int, trusted: TrustedKeys) -> Snapshot:
    """The verified record of ``step``; see the module docstring.

    Raises StepNotFound (nothing stored for the step), ChainBroken via a Break in the
    result's ``problem`` (link failures), RecordInvalid (the record itself does not verify).
    """
    started, before = time.perf_counter(), store.requests
    key = step_key(run_id, step)
    body = store.get(key)
    if body is None:
        _missing(store, run_id, step, trusted)
    assert body is not None
    record, key_id = verify_record(body, trusted, f"run {run_id} step {step} ({store.url}/{key})")
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
        result.link, result.problem = _check_previous(store, record, trusted)
    result.requests = store.requests - before
    result.seconds = time.perf_counter() - started
    return result


def _check_genesis(store: Store, record: Record, trusted: TrustedKeys) -> tuple[str, Break | None]:
    head_body = store.get(head_key(record.run_id))
    if head_body is None:
        return f"first record of the run (genesis {record.prev[:16]}…; no head to compare with)", None
    try:
        head, _ = verify_head(head_body, trusted, f"run {record.run_id} head")
    except RecordInvalid as exc:
        return "first record of the run", Break(None, _code_kind(exc), str(exc))
    if head.genesis is not None and head.genesis != record.prev:
        message = f"step {record.step} starts the chain from {record.prev}, but the run's genesis is {head.genesis}"
        return "first record of the run", Break(record.step, "altered", message)
    return f"first record of the run (genesis {record.prev[:16]}… matches the run's head)", None


def _check_previous(store: Store, record: Record, trusted: TrustedKeys) -> tuple[str, Break | None]:
    assert record.prev_step is not None
    prev_step, run_id, step = record.prev_step, record.run_id, record.step
    if prev_step >= step:
        return "", Break(step, "reordered", f"step {step} links forward to step {prev_step}")
    prev_body = store.get(step_key(run_id, prev_step))
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
        return "", Break(prev_step, _code_kind(exc), str(exc))
    return f"chained to step {prev_step} (SHA-256 {record.prev[:16]}… matches)", None


def _missing(store: Store, run_id: str, step: int, trusted: TrustedKeys) -> None:
    """Raises StepNotFound naming the steps around ``step``, or ChainBroken-worthy RecordInvalid."""
    low = max(0, step - NEARBY)
    start = step_key(run_id, low - 1) if low > 0 else None
    keys = store.list_keys(steps_prefix(run_id), start_after=start, limit=2 * NEARBY + 1)
    nearby = tuple(s for s in (step_from_key(k) for k in keys) if s is not None)
    later = [s for s in nearby if s > step]
    if later:
        next_body = store.get(step_key(run_id, later[0]))
        try:
            following = verify_record(next_body, trusted, f"run {run_id} step {later[0]}")[0] if next_body else None
        except RecordInvalid:
            following = None
        if following is not None and following.prev_step == step:
            raise RecordInvalid(
                f"run {run_id} step {step} is not in {store.url}, but step {later[0]} is chained to it: "
                "the record was deleted or hidden by a delete marker",
                "missing",
            )
    if not nearby:
        raise StepNotFound(f"run {run_id} has no record for step {step}, and none near it in {store.url}", nearby)
    listed = ", ".join(str(s) for s in nearby)
    raise StepNotFound(f"run {run_id} has no record for step {step} in {store.url}; steps near it: {listed}", nearby)


# --- the whole run ----------------------------------------------------------------------------------


@dataclass
class RunReport:
    """The result of :func:`verify_run`."""

    run_id: str
    store: str
    checked: int = 0
    first_step: int | None = None
    last_step: int | None = None
    head: Head | None = None
    after_head: list[int] = field(default_factory=list)
    pending_gaps: list[int] = field(default_factory=list)
    key_ids: set[str] = field(default_factory=set)
    problem: Break | None = None
    requests: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "store": self.store,
            "ok": self.problem is None,
            "records_checked": self.checked,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "head_step": self.head.last_step if self.head else None,
            "after_head": self.after_head,
            "pending_gaps": self.pending_gaps,
            "key_ids": sorted(self.key_ids),
            "break": self.problem.to_dict() if self.problem else None,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
        }


def _bodies(store: Store, keys: list[str], workers: int) -> Iterator[bytes | None]:
    """The bodies of ``keys`` in order, fetched concurrently a window at a time."""
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(keys), FETCH_WINDOW):
            yield from pool.map(store.get, keys[start : start + FETCH_WINDOW])


class _Walk:
    """The chain walk of :func:`verify_run`: feed records in step order, stop at the first break."""

    def __init__(self, store: Store, report: RunReport, trusted: TrustedKeys) -> None:
        self.store, self.report, self.trusted = store, report, trusted
        self.prev_step: int | None = None
        self.prev_hash: str | None = None
        self.hashes: dict[int, str] = {}

    def missing(self, step: int, before: int) -> Break:
        note = _deletion_note(self.store, self.report.run_id, step)
        return Break(step, "missing", f"step {step}, which step {before} is chained to, is missing{note}")

    def feed(self, step: int, body: bytes | None) -> Break | None:
        run_id = self.report.run_id
        if body is None:
            return Break(step, "missing", f"step {step} was listed but could not be read (deleted meanwhile?)")
        try:
            record, key_id = verify_record(body, self.trusted, f"run {run_id} step {step}")
        except RecordInvalid as exc:
            return Break(step, _code_kind(exc), str(exc))
        if record.run_id != run_id or record.step != step:
            return Break(
                step,
                "reordered",
                f"the object for step {step} holds the record of run {record.run_id} step {record.step}",
            )
        problem = self._link(step, record)
        if problem is not None and problem.kind == "missing" and self._beyond_head(problem.step):
            # Not yet covered by the head: an upload window still in flight (or an archiver
            # that stopped mid-window, whose spool still holds it). Noted, not a violation.
            assert problem.step is not None
            self.report.pending_gaps.append(problem.step)
            problem = None
        self.prev_step, self.prev_hash = step, object_hash(body)
        self.hashes[step] = self.prev_hash
        self.report.checked += 1
        self.report.key_ids.add(key_id)
        return problem

    def _beyond_head(self, step: int | None) -> bool:
        head = self.report.head
        return step is not None and (head is None or step > head.last_step)

    def _link(self, step: int, record: Record) -> Break | None:
        head = self.report.head
        if record.prev_step != self.prev_step:
            if record.prev_step is not None and (self.prev_step is None or record.prev_step > self.prev_step):
                return self.missing(record.prev_step, step)
            follows = f"the record before it is step {self.prev_step}" if self.prev_step is not None else "it is first"
            linked = f"step {record.prev_step}" if record.prev_step is not None else "nothing (genesis)"
            return Break(step, "reordered", f"step {step} is chained to {linked}, but {follows}")
        if self.prev_step is None:
            if head is not None and head.genesis is not None and record.prev != head.genesis:
                return Break(step, "altered", f"step {step} starts from {record.prev}, not the genesis {head.genesis}")
            return None
        if record.prev != self.prev_hash:
            return Break(
                self.prev_step,
                "altered",
                f"step {self.prev_step} differs from the record step {step} was chained to: altered or replaced",
            )
        return None

    def finish(self, steps: list[int]) -> Break | None:
        head = self.report.head
        if head is None:
            return None
        self.report.after_head = [s for s in steps if s > head.last_step]
        if head.last_step not in self.hashes:
            note = _deletion_note(self.store, self.report.run_id, head.last_step)
            return Break(head.last_step, "missing", f"the head names step {head.last_step}, which is missing{note}")
        if self.hashes[head.last_step] != head.last_hash:
            return Break(head.last_step, "altered", f"step {head.last_step} differs from the one the head names")
        return None


def verify_run(store: Store, run_id: str, trusted: TrustedKeys, workers: int = 16) -> RunReport:
    """Walks the chain of ``run_id``; the report's ``problem`` is the first break (None: intact).

    Raises StepNotFound when the store has nothing for the run, StoreError when it cannot be read.
    """
    started, before = time.perf_counter(), store.requests
    report = RunReport(run_id, store.url)
    head_body = store.get(head_key(run_id))
    if head_body is not None:
        try:
            report.head = verify_head(head_body, trusted, f"run {run_id} head")[0]
        except RecordInvalid as exc:
            report.problem = Break(None, _code_kind(exc), str(exc))
    keys = store.list_keys(steps_prefix(run_id))
    if not keys and head_body is None:
        raise StepNotFound(f"run {run_id} has no archived records in {store.url}")
    foreign = next((k for k in keys if step_from_key(k) is None), None)
    if foreign is not None and report.problem is None:
        report.problem = Break(None, "unexpected", f"{foreign} is not a step record: nothing else belongs there")
    steps = [s for s in (step_from_key(k) for k in keys) if s is not None]
    if steps:
        report.first_step, report.last_step = steps[0], steps[-1]
    walk = _Walk(store, report, trusted)
    if report.problem is None:
        keys = [step_key(run_id, s) for s in steps]
        for step, body in zip(steps, _bodies(store, keys, workers), strict=True):
            report.problem = walk.feed(step, body)
            if report.problem is not None:
                break
        else:
            report.problem = walk.finish(steps)
    report.requests = store.requests - before
    report.seconds = time.perf_counter() - started
    return report


def list_steps(store: Store, run_id: str) -> list[int]:
    """The archived steps of ``run_id``, ascending."""
    return [s for s in (step_from_key(k) for k in store.list_keys(steps_prefix(run_id))) if s is not None]


def ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` -> ``1-3, 7, 9-10``."""
    parts: list[str] = []
    start = prev = None
    for step in steps:
        if prev is not None and step == prev + 1:
            prev = step
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = step
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(parts)
