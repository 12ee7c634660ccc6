"""``warden audit verify-run``: the whole run, as a function over a :class:`~warden.archive.store.Store`.

:func:`verify_run` checks the whole run, in ~ records + records/1000 + a few requests: the
head is read first (records are stored before the head that covers them, so a listing
taken after it holds every record the head names), then one paginated listing of the
run (ListObjectVersions where the store keeps versions, so delete markers are seen,
else ListObjectsV2 / a directory scan), then every record is fetched and verified
concurrently, and the chain is checked locally. Every finding is reported (the first is
the ``break``); kinds:

``missing``
    a record proved archived is gone: delete-marked, a gap before the newest record
    present (only after the newest record present may uploads still be in flight), the
    step the head names, or the head itself while the run has records or retained head
    versions;
``rolled_back``
    the current head names an older step than a retained version of the head (versioned
    stores), or the anchor (:mod:`warden.archive.anchor`) has snapshots the store's newest
    record is behind;
``altered``, ``wrong_key``, ``malformed``, ``reordered``, ``unexpected``
    a record or head whose signature or bytes do not verify, signed by an untrusted key,
    unparseable or not a regular file / over the size cap, under another step's key or
    linking backwards, or a foreign object under the run's steps.

A record newer than the head is fine (the head lags the records it covers). The attacker
in mind: :mod:`warden.archive.findings`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from warden.archive.anchor import DEFAULT_GRACE_SECONDS, JournalAnchor, anchor_findings
from warden.archive.errors import ObjectRefused, RecordInvalid, StepNotFound, StoreError
from warden.archive.findings import MAX_HEAD_BYTES, Break, HeadRead, code_kind, deleted_note, read_head
from warden.archive.record import Head, Record, clip, head_key, object_hash, step_from_key, step_key, steps_prefix
from warden.archive.signing import verify_head, verify_record
from warden.archive.store import DEFAULT_MAX_OBJECT_BYTES, Store, VersionEntry
from warden.signing.keys import TrustedKeys

FETCH_WINDOW = 1000
MAX_FINDINGS = 50


def may_be_a_replay(versions: list[VersionEntry], position: int, content_md5: str | None) -> bool:
    """Whether the head version at ``position`` (newest first) could be a copy of an older one (pure).

    Whoever holds no key can only roll the head back by putting an older signed head's bytes
    again (a copy). Where the current version's ETag is the MD5 of the bytes read (a single-part
    put, no SSE-KMS), a copy of an older version carries that version's ETag; if no older
    version has it, apart from identical re-puts right before it, the current head was written
    fresh, by the signer, and is the newest: no older version needs to be read. Anything else
    (a multipart or KMS ETag that says nothing about the bytes, an ETag seen before) may be a
    replay, and the older versions are read and compared by their signed step.
    """
    current = versions[position]
    if content_md5 is None or current.etag.strip('"') != content_md5:
        return True
    older = versions[position + 1 :]
    adjacent = 0
    while adjacent < len(older) and older[adjacent].etag == current.etag:
        adjacent += 1
    return any(v.etag == current.etag for v in older[adjacent:])


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
    key_ids: set[str] = field(default_factory=set)
    findings: list[Break] = field(default_factory=list)
    versioned: bool = False
    head_versions_read: int = 0
    anchor: str | None = None
    anchor_recent: list[int] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0

    @property
    def problem(self) -> Break | None:
        """The first finding (None: intact)."""
        return self.findings[0] if self.findings else None

    def add(self, finding: Break) -> None:
        if len(self.findings) < MAX_FINDINGS and not any(
            f.step == finding.step and f.kind == finding.kind for f in self.findings
        ):
            self.findings.append(finding)

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
            "key_ids": sorted(self.key_ids),
            "break": self.problem.to_dict() if self.problem else None,
            "findings": [f.to_dict() for f in self.findings],
            "versioned": self.versioned,
            "head_versions_read": self.head_versions_read,
            "anchor": self.anchor,
            "anchor_within_grace": self.anchor_recent,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Fetched:
    """A record read and verified by a worker: only what the chain walk needs (bounded memory)."""

    step: int
    record: Record | None
    key_id: str = ""
    digest: str = ""
    problem: Break | None = None


def _fetch(store: Store, run_id: str, step: int, trusted: TrustedKeys, cap: int) -> Fetched:
    key = step_key(run_id, step)
    try:
        body = store.get(key, cap)
    except ObjectRefused as exc:
        return Fetched(step, None, problem=Break(step, "malformed", str(exc)))
    if body is None:
        return Fetched(step, None, problem=Break(step, "missing", f"step {step} was listed but is gone (deleted)"))
    try:
        record, key_id = verify_record(body, trusted, f"run {run_id} step {step}")
    except RecordInvalid as exc:
        return Fetched(step, None, problem=Break(step, code_kind(exc), str(exc)))
    return Fetched(step, dataclasses.replace(record, body={}), key_id, object_hash(body))


@dataclass
class _Listing:
    """One listing of a run: present steps, delete-marked steps, foreign keys, the head's versions."""

    steps: list[int] = field(default_factory=list)
    deleted: dict[int, str] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    head_versions: list[VersionEntry] = field(default_factory=list)
    head_deleted: str = ""
    versioned: bool = False


def _list_run(store: Store, run_id: str) -> _Listing:
    listing = _Listing()
    prefix, head = steps_prefix(run_id), head_key(run_id)
    try:
        entries = store.list_versions(f"runs/{run_id}/")
    except StoreError:
        entries = None  # e.g. no s3:ListBucketVersions: fall back to the current keys
    if entries is None:
        keys = store.list_keys(prefix)
    else:
        listing.versioned = True
        by_key: dict[str, list[VersionEntry]] = {}
        for entry in entries:
            by_key.setdefault(entry.key, []).append(entry)
        keys = []
        for key, versions in sorted(by_key.items()):
            if key == head:
                listing.head_versions = [v for v in versions if not v.is_delete_marker]
                listing.head_deleted = deleted_note(versions)
            elif key.startswith(prefix):
                note = deleted_note(versions)
                if note and step_from_key(key) is not None:
                    listing.deleted[step_from_key(key) or 0] = note
                elif any(v.is_latest and not v.is_delete_marker for v in versions):
                    keys.append(key)
    for key in keys:
        step = step_from_key(key)
        if step is None:
            listing.foreign.append(key)
        else:
            listing.steps.append(step)
    listing.steps.sort()
    return listing


def _head_findings(
    store: Store, report: RunReport, listing: _Listing, current_head: HeadRead, trusted: TrustedKeys
) -> list[Break]:
    run_id, head, read_version = report.run_id, report.head, current_head.version
    if not current_head.present:
        if listing.head_deleted or listing.head_versions:
            note = listing.head_deleted or f" ({len(listing.head_versions)} retained version(s) of it)"
            return [Break(None, "missing", f"the run's head object was deleted{note}")]
        if listing.steps or listing.deleted:
            count = len(listing.steps) + len(listing.deleted)
            return [
                Break(None, "missing", f"the run's head object is missing, but the run has {count} records: deleted")
            ]
        return []
    if head is None:
        return []
    # Rollback: a retained version of the head older than the one read naming a later step.
    # S3 lists the versions of a key newest first (LastModified has only a second's precision).
    versions = listing.head_versions
    position = next((i for i, v in enumerate(versions) if v.version_id == read_version), None)
    if position is None or not may_be_a_replay(versions, position, current_head.content_md5):
        return []
    current = versions[position]
    seen, older = {current.etag}, []
    for version in versions[position + 1 :]:  # versions newer than the one read were put meanwhile
        if version.etag not in seen:
            seen.add(version.etag)
            older.append(version)

    def read(version: VersionEntry) -> tuple[VersionEntry, Head | None, Break | None]:
        try:
            blob = store.read(head_key(run_id), MAX_HEAD_BYTES, version.version_id)
            if blob is None:
                return version, None, None
            return (
                version,
                verify_head(blob.body, trusted, f"run {run_id} head version {clip(version.version_id)}")[0],
                None,
            )
        except (RecordInvalid, ObjectRefused) as exc:
            kind = code_kind(exc) if isinstance(exc, RecordInvalid) else "malformed"
            return version, None, Break(None, kind, f"a retained version of the head does not verify: {exc}")

    findings: list[Break] = []
    with ThreadPoolExecutor(8) as pool:
        for version, old, problem in pool.map(read, older):
            report.head_versions_read += 1
            if problem is not None:
                findings.append(problem)
            elif old is not None and old.last_step > head.last_step:
                findings.append(
                    Break(
                        head.last_step,
                        "rolled_back",
                        f"the current head names step {head.last_step}, but a retained older version of it "
                        f"(version {clip(version.version_id, 80)}) names step {old.last_step}: "
                        "the head was moved backwards",
                    )
                )
    findings.sort(key=lambda f: f.kind != "rolled_back")
    return findings[:1]


class _Walk:
    """The chain walk of :func:`verify_run`: feed records in step order; every break is reported."""

    def __init__(self, report: RunReport, deleted: dict[int, str]) -> None:
        self.report, self.deleted = report, deleted
        self.prev_step: int | None = None
        self.prev_hash: str | None = None
        self.hashes: dict[int, str] = {}

    def feed(self, fetched: Fetched) -> None:
        step, record, report = fetched.step, fetched.record, self.report
        if fetched.problem is not None or record is None:
            assert fetched.problem is not None
            report.add(fetched.problem)
            self.prev_step, self.prev_hash = step, None  # cannot vouch for the next link
            return
        if record.run_id != report.run_id or record.step != step:
            report.add(
                Break(
                    step,
                    "reordered",
                    f"the object for step {step} holds the record of run {clip(record.run_id)} step {record.step}",
                )
            )
            self.prev_step, self.prev_hash = step, None
            return
        problem = self._link(step, record)
        if problem is not None:
            report.add(problem)
        self.prev_step, self.prev_hash = step, fetched.digest
        self.hashes[step] = fetched.digest
        report.checked += 1
        report.key_ids.add(fetched.key_id)

    def _link(self, step: int, record: Record) -> Break | None:
        head = self.report.head
        if record.prev_step != self.prev_step:
            if record.prev_step is not None and (self.prev_step is None or record.prev_step > self.prev_step):
                gone = record.prev_step
                note = self.deleted.get(gone, "")
                return Break(gone, "missing", f"step {gone}, which step {step} is chained to, is missing{note}")
            follows = f"the record before it is step {self.prev_step}" if self.prev_step is not None else "it is first"
            linked = f"step {record.prev_step}" if record.prev_step is not None else "nothing (genesis)"
            return Break(step, "reordered", f"step {step} is chained to {linked}, but {follows}")
        if self.prev_step is None:
            if head is not None and head.genesis is not None and record.prev != head.genesis:
                return Break(step, "altered", f"step {step} starts from {record.prev}, not the genesis {head.genesis}")
            return None
        if self.prev_hash is not None and record.prev != self.prev_hash:
            return Break(
                self.prev_step,
                "altered",
                f"step {self.prev_step} differs from the record step {step} was chained to: altered or replaced",
            )
        return None

    def finish(self, steps: list[int]) -> None:
        head, report = self.report.head, self.report
        if head is None:
            return
        report.after_head = [s for s in steps if s > head.last_step]
        if head.last_step not in steps:
            note = self.deleted.get(head.last_step, "")
            report.add(
                Break(head.last_step, "missing", f"the head names step {head.last_step}, which is missing{note}")
            )
        elif head.last_step in self.hashes and self.hashes[head.last_step] != head.last_hash:
            report.add(Break(head.last_step, "altered", f"step {head.last_step} differs from the one the head names"))


def verify_run(
    store: Store,
    run_id: str,
    trusted: TrustedKeys,
    workers: int = 16,
    *,
    max_record_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
    anchor: JournalAnchor | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
    clock: Callable[[], float] = time.time,
) -> RunReport:
    """Checks the whole run (see the module docstring); the report's ``findings`` are the breaks.

    Raises StepNotFound when the store has nothing for the run (and no anchor says it
    should), StoreError when it cannot be read.
    """
    started, before = time.perf_counter(), store.requests
    report = RunReport(run_id, store.url, anchor=anchor.source if anchor else None)
    current_head = read_head(store, run_id, trusted)
    head, head_present = current_head.head, current_head.present
    report.head = head
    if current_head.problem is not None:
        report.add(current_head.problem)
    listing = _list_run(store, run_id)
    report.versioned = listing.versioned
    if (
        not head_present
        and not listing.steps
        and not listing.deleted
        and not listing.head_versions
        and not (anchor and anchor.steps)
    ):
        raise StepNotFound(f"run {run_id} has no archived records in {store.url}")
    for finding in _head_findings(store, report, listing, current_head, trusted):
        report.add(finding)
    for step, note in sorted(listing.deleted.items()):
        report.add(Break(step, "missing", f"step {step} was deleted{note}"))
    for key in listing.foreign[:1]:
        report.add(Break(None, "unexpected", f"{clip(key)} is not a step record: nothing else belongs there"))
    steps = listing.steps
    if steps:
        report.first_step, report.last_step = steps[0], steps[-1]
    walk = _Walk(report, listing.deleted)
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(steps), FETCH_WINDOW):
            window = steps[start : start + FETCH_WINDOW]
            for fetched in pool.map(lambda s: _fetch(store, run_id, s, trusted, max_record_bytes), window):
                walk.feed(fetched)
    walk.finish(steps)
    if anchor is not None:
        findings, report.anchor_recent = anchor_findings(anchor, steps, head, clock(), grace)
        for finding in findings:
            report.add(finding)
    report.findings.sort(key=lambda f: (f.step is not None, f.step or 0))
    report.requests = store.requests - before
    report.seconds = time.perf_counter() - started
    return report
