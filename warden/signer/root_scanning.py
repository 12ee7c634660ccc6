"""Walking the checkpoint roots: sign what is complete and stable, audit the run's own root.

Every check (``check_interval_seconds``):

- the policy's ``watch`` roots (HF / verl / other Warden runs) are rescanned when inotify
  saw a change, when ``rescan_seconds`` passed (NFS) or when a pending checkpoint may have
  become stable; complete, stable, unsigned ones are signed (against the announced digest
  when an event carried one); exports the age of the newest unsigned checkpoint;
- the run's own root (``<run_dir>/checkpoints``) is audited and never signed: a ``step-N/``
  no event announced (after ``stable_seconds``), a signed one whose ``.sig`` was deleted,
  or a ``.sig`` that does not verify or names another run, step or digest is a violation
  (``warden_signer_violating_checkpoints{reason}``, counted once in
  ``warden_signer_violations_total``); an announced checkpoint gone from disk was pruned only if the
  journal says so (``checkpoint.pruned``, :mod:`warden.ledger`), else it is a violation.
"""

from __future__ import annotations

import json
import math
import os
import time

from warden.errors import ExitCode
from warden.journal import JOURNAL_NAME
from warden.ledger import Ledger, read_ledger
from warden.logs import log_fields
from warden.safeio import read_regular_below
from warden.signer.announcements import (
    REMOVED_WITHOUT_RETENTION,
    SIGNATURE_REPLACED,
    UNSAFE_PATH,
    Record,
    audit,
    statement_problem,
)
from warden.signer.operations import count, fields, gone_before_signing, refuse, sign
from warden.signer.state import Root, SignerState, Unsigned
from warden.signer.watch import (
    Candidate,
    RootWatcher,
    StabilityTracker,
    completion_blocker,
    list_checkpoints,
    read_tracker,
    remove_stale_signature_temps,
    tree_state,
    unsafe_entries,
)
from warden.signing.errors import (
    AnnouncementMismatch,
    CheckpointChanged,
    CheckpointVanished,
    HashingCancelled,
    SignatureMissing,
    SignerError,
)
from warden.signing.verify import read_signed_statement

MAX_STATE_BYTES = 1 << 20
"""Cap on a watched checkpoint's ``trainer_state.json`` read for its run id."""


class RootScan:
    """The periodic look at every root: signs the watched roots' stable checkpoints, audits the own root."""

    def __init__(self, state: SignerState, use_watchdog: bool = True) -> None:
        self.state = state
        self.stability = StabilityTracker(state.policy.stable_seconds)
        self.watcher = RootWatcher([r.path for r in state.roots], use_watchdog)
        state.metrics.watchdog.set(1 if self.watcher.refresh() else 0)
        self._next_rescan = 0.0
        self._unannounced_since: dict[str, float] = {}
        self._violations: dict[str, str] = {}
        self._sig_checked: dict[str, tuple[tuple[object, ...], str | None]] = {}
        self._gone_since: dict[str, float] = {}  # watched roots: announced checkpoints not on disk, since

    def check(self, now: float, first: bool) -> ExitCode:
        """Rescans the roots that are due (all of them on the ``first`` check), signs what is ready, audits."""
        due = self._roots_due(now, first)
        if due:
            self.state.metrics.watchdog.set(1 if self.watcher.refresh() else 0)
        for root in due:
            if not root.announced_only:
                self._scan(root, now)
        self.stability.forget(self.state.unsigned)
        outcome = self._sign_ready(now)
        self._publish_unsigned(self.state.clock())
        return max(outcome, self._audit_own(now))

    def close(self) -> None:
        self.watcher.close()

    # -- watched roots: sign what is complete and stable -------------------------------------
    def _roots_due(self, now: float, first: bool) -> list[Root]:
        """Roots to rescan: all on the timer, else those inotify saw change or with a pending checkpoint due."""
        if now >= self._next_rescan or first:
            self._next_rescan = now + self.state.policy.rescan_seconds
            self.watcher.take_dirty()
            return list(self.state.roots)
        dirty = self.watcher.take_dirty()
        waiting = {u.root.path for u in self.state.unsigned.values() if u.ready_at <= now}
        return [r for r in self.state.roots if r.path in dirty or r.path in waiting]

    def _scan(self, root: Root, now: float) -> None:
        """Refreshes what is known about ``root``'s unsigned complete checkpoints."""
        unsigned, failed = self.state.unsigned, self.state.failed
        remove_stale_signature_temps(root.path, now)
        tracker = read_tracker(root.path) if root.layout == "verl" else None
        grace = self.state.policy.stable_seconds
        seen = set()
        for candidate in list_checkpoints(root.path, root.layout):
            if os.path.lexists(candidate.signature_path) or completion_blocker(candidate, tracker):
                continue
            state = tree_state(candidate.path, root.extras())
            if state is None:
                continue
            wait = self.stability.remaining(candidate.path, state, now) if grace else 0.0
            ready_at = now + max(0.0, wait)
            failure = failed.get(candidate.path)
            if failure is not None and failure[0] == state.fingerprint:
                ready_at = max(ready_at, failure[1])  # the same content failed before: wait for its retry
            unsigned[candidate.path] = Unsigned(candidate, root, state, now, ready_at)
            seen.add(candidate.path)
        for path in [p for p, u in unsigned.items() if u.root == root and p not in seen]:
            del unsigned[path]
        for path in [p for p in failed if os.path.dirname(p) == root.path and p not in seen]:
            del failed[path]

    def _sign_ready(self, now: float) -> ExitCode:
        """Signs the pending checkpoints that are stable now, oldest step first."""
        outcome = ExitCode.OK
        ready = [u for u in self.state.unsigned.values() if u.ready_at <= now and u.observed_at == now]
        for item in sorted(ready, key=lambda u: (u.root.path, u.candidate.step)):
            if self.state.stop.is_set():
                return max(outcome, ExitCode.INCOMPLETE)
            outcome = max(outcome, self._sign_pending(item, now))
        return outcome

    def _sign_pending(self, item: Unsigned, now: float) -> ExitCode:
        """Signs a stable checkpoint of an hf/verl/other root; an announced digest must match."""
        state, path = self.state, item.candidate.path
        record = state.announced.get(path)
        expected = record.announced if record is not None else None
        run_id = record.run_id if record is not None and record.run_id else self._run_id_for(item)
        try:
            result = sign(state, item.candidate, run_id, state.runs.version(run_id), before=item, expected=expected)
            if record is not None and expected is not None:
                state.announced.mark_signed(path, record, result.root_digest)
        except AnnouncementMismatch as exc:
            assert record is not None
            gone = gone_before_signing(item.candidate)
            if gone is not None:
                count(state, CheckpointVanished(f"{path}: {gone} while it was hashed", path), path)
                state.unsigned.pop(path, None)
                return ExitCode.OK
            state.failed[path] = (item.state.fingerprint, math.inf)
            item.ready_at = math.inf
            return refuse(state, item.candidate, record, exc.reason, exc.expected, exc.actual)
        except HashingCancelled:
            return ExitCode.INCOMPLETE
        except CheckpointVanished as exc:
            count(state, exc, path)
            state.unsigned.pop(path, None)
        except CheckpointChanged as exc:
            count(state, exc, path)
            item.ready_at = now + state.policy.stable_seconds
        except SignerError as exc:
            count(state, exc, path)
            retry = math.inf if exc.exit_code == 1 else now + state.policy.rescan_seconds
            state.failed[path] = (item.state.fingerprint, retry)
            item.ready_at = retry
            return ExitCode.VIOLATION if exc.exit_code == 1 else ExitCode.INCOMPLETE
        return ExitCode.OK

    def _run_id_for(self, item: Unsigned) -> str | None:
        """The policy's run id, else (warden layout) trainer_state.json's, else the root's name or the journal's."""
        if item.root.run_id:
            return item.root.run_id
        if item.root.layout == "warden":
            try:  # the storage writer's file: no link followed, no blocking, capped
                raw = read_regular_below(item.candidate.path, "trainer_state.json", MAX_STATE_BYTES)
                run_id = json.loads(raw).get("run_id")
                if isinstance(run_id, str) and run_id:
                    return run_id
            except (OSError, ValueError, AttributeError, RecursionError):
                pass
        if item.root.default_run_id:
            return item.root.default_run_id
        run_dir = self.state.run_dir
        return self.state.runs.last_run_id or (os.path.basename(run_dir) if run_dir else None)

    def _publish_unsigned(self, now: float) -> None:
        unsigned = self.state.unsigned
        self.state.metrics.unsigned.set(len(unsigned))
        newest = max((u.state.last_change for u in unsigned.values()), default=None)
        self.state.metrics.unsigned_age.set(0.0 if newest is None else max(0.0, now - newest))

    # -- the run's own root: audit, never sign ----------------------------------------------
    def _audit_own(self, now: float) -> ExitCode:
        """Finds the own root's checkpoints that no valid announced signature covers; signs nothing.

        In every root, an entry named like a checkpoint that is not a real directory (a
        symlink to one included) is an ``unsafe_path`` violation: it is never listed, signed
        or verified. Own-root violations (gauge by reason, counter on first sight, error log): ``unannounced``
        (a ``step-N/`` no event named, after ``stable_seconds``), ``signature_missing`` (its
        ``.sig`` was deleted after signing), ``signature_replaced`` (a ``.sig`` that does
        not verify or names another run, step or digest), refusals, and
        ``removed_without_retention``: an announced checkpoint gone from disk is retired only
        when the journal holds its ``checkpoint.pruned`` (:func:`warden.ledger.read_ledger`, the
        rule ``--resume`` uses too); deleting every checkpoint at once is therefore no retention.
        """
        found: dict[str, str] = {}
        for root in self.state.roots:
            for candidate in unsafe_entries(root.path, root.layout):
                found[candidate.path] = UNSAFE_PATH  # never listed, so never signed or verified
        for root in self.state.roots:
            if root.announced_only:
                self._audit_root(root, now, found)
            else:
                self._reconcile_watched(root, now, found)
        return self._publish_violations(found)

    def _reconcile_watched(self, root: Root, now: float, found: dict[str, str]) -> None:
        """A watched (HF, verl, other) root's announced checkpoints against the journal: one gone from
        disk without its ``checkpoint.pruned`` for ``stable_seconds`` (the HF callback announces HF's
        rotation right after it happened) is ``removed_without_retention``."""
        present = {c.path for c in list_checkpoints(root.path, root.layout)}
        gone = [(p, r) for p, r in self.state.announced.under(root.path) if p not in present]
        for path in [p for p in self._gone_since if os.path.dirname(p) == root.path and p in present]:
            del self._gone_since[path]
        ledgers: dict[str | None, Ledger] = {}
        for path, record in gone:
            if self._retired(record, ledgers):
                self.state.announced.forget(path)
                self._gone_since.pop(path, None)
            else:
                ledger = ledgers[record.run_id]
                grace = self.state.policy.stable_seconds
                quiet = ledger.newest_saved_at is not None and time.time() - ledger.newest_saved_at >= grace
                if quiet or now - self._gone_since.setdefault(path, now) >= grace:
                    found.setdefault(path, REMOVED_WITHOUT_RETENTION)

    def _audit_root(self, root: Root, now: float, found: dict[str, str]) -> None:
        """Adds the violations of one own root to ``found``; forgets what left it."""
        announced = self.state.announced
        listed = list_checkpoints(root.path, root.layout)
        for candidate in listed:
            reason = self._audit_one(candidate, now)
            if reason is not None:
                found[candidate.path] = reason
        present = {c.path for c in listed}
        gone = [(path, record) for path, record in announced.under(root.path) if path not in present]
        ledgers: dict[str | None, Ledger] = {}
        for path, record in gone:
            if self._retired(record, ledgers):
                announced.forget(path)  # retired, and the journal says so
            else:
                found.setdefault(path, REMOVED_WITHOUT_RETENTION)  # pages until restored (a link there: unsafe_path)
        for path in [p for p in self._unannounced_since if os.path.dirname(p) == root.path and p not in present]:
            del self._unannounced_since[path]
        for sig_path in [p for p in self._sig_checked if os.path.dirname(p) == root.path]:
            if sig_path[: -len(".sig")] not in present:
                del self._sig_checked[sig_path]  # bounded by the checkpoints listed

    def _retired(self, record: Record, ledgers: dict[str | None, Ledger]) -> bool:
        """True when the journal retired ``record``'s checkpoint (``checkpoint.pruned``, not saved again
        since); ``ledgers`` caches one ledger per run id for the check."""
        if record.run_id not in ledgers:
            ledgers[record.run_id] = self._ledger(record.run_id)
        ledger = ledgers[record.run_id]
        return record.step in ledger.pruned and record.step not in ledger.live

    def _ledger(self, run_id: str | None) -> Ledger:
        """What the run's journal says exists (read only when an announced checkpoint is gone)."""
        if not self.state.run_dir:
            return Ledger(run_id or "")
        return read_ledger(os.path.join(self.state.run_dir, JOURNAL_NAME), run_id)

    def _audit_one(self, candidate: Candidate, now: float) -> str | None:
        record = self.state.announced.get(candidate.path)
        signature = candidate.signature_path
        if os.path.lexists(signature):
            self._unannounced_since.pop(candidate.path, None)
            return self._signature_problem(candidate, record)
        since = self._unannounced_since.setdefault(candidate.path, now) if record is None else now
        try:
            st = os.lstat(candidate.path)
            quiet = max(now - since, now - max(st.st_mtime, st.st_ctime))
        except OSError:
            return None
        return audit(record, False, quiet, self.state.policy.stable_seconds)

    def _signature_problem(self, candidate: Candidate, record: Record | None) -> str | None:
        """``signature_replaced`` when the ``.sig`` does not verify or belongs elsewhere (cached by stat)."""
        signature = candidate.signature_path
        try:
            st = os.lstat(signature)
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, record)
        cached = self._sig_checked.get(signature)
        if cached is not None and cached[0] == key:
            problem = cached[1]
        else:
            problem = self._read_signature_problem(candidate, record)
            self._sig_checked[signature] = (key, problem)
        if problem is None:
            return None
        if candidate.path not in self._violations:
            self.state.log.error(
                f"{signature}: not the signature the signer wrote: {problem}", extra=fields(self.state, candidate)
            )
        return SIGNATURE_REPLACED

    def _read_signature_problem(self, candidate: Candidate, record: Record | None) -> str | None:
        try:
            _key, statement = read_signed_statement(candidate.signature_path, self.state.trusted)
        except SignatureMissing:
            return None
        except SignerError as exc:
            return str(exc)[:300]
        name = os.path.basename(candidate.path)
        problem = statement_problem(name, candidate.step, record, statement, set(self.state.runs.versions))
        if problem is None and (record is None or record.signed_digest is None):
            # this run's valid signature (before an upgrade, or a crash before it was recorded): adopt it
            base = record or Record(candidate.step, statement.provenance.run_id)
            self.state.announced.mark_signed(candidate.path, base, statement.subject_digest)
        return problem

    def _publish_violations(self, found: dict[str, str]) -> ExitCode:
        """Counts new (path, reason) pairs, logs them, sets the gauge; VIOLATION while any remain."""
        metrics = self.state.metrics
        for path, reason in found.items():
            if self._violations.get(path) != reason:
                metrics.violations.labels(reason).inc()
                if reason != SIGNATURE_REPLACED:  # that one was logged with its detail
                    self.state.log.error(
                        f"{path}: checkpoint violation: {reason}; it will not be signed",
                        extra=log_fields(sidecar=self.state.name, path=path, reason=reason),
                    )
        self._violations = found
        for reason in metrics.violating_reasons:
            metrics.violating.labels(reason).set(sum(1 for r in found.values() if r == reason))
        return ExitCode.VIOLATION if found else ExitCode.OK
