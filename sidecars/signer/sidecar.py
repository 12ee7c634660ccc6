"""The ``signer`` sidecar: signs announced checkpoints and re-verifies signed ones.

Inputs:
- ``checkpoint.saved`` events. When the event carries ``root_digest`` and ``file_count``
  (the Warden trainer always does; the HF callback does), the directory is hashed once
  and signed only if that hash is the announced one; otherwise nothing is signed:
  ``warden_signer_refused_total{reason}``, an error log naming path, expected and actual
  digest, and a violation. A ``step-N/`` of the run's own root announced without a digest
  is refused too (``no_digest``). If a valid ``.sig`` of the announced digest already
  exists (a replay after a crash) nothing is written; one that no longer matches (the
  same step saved again after a resume) is replaced. Announcements and what was signed
  are kept in ``<state_dir>/announced.json`` (:mod:`warden.signer.announcements`).
- :meth:`SignerSidecar.check`, every ``check_interval_seconds``:
  - the run's own root (``<run_dir>/checkpoints``) is audited and never signed: a
    ``step-N/`` no event announced (after ``stable_seconds``), a signed one whose ``.sig``
    was deleted, or a ``.sig`` that does not verify or names another run, step or digest
    is a violation (``warden_signer_violating_checkpoints{reason}``, counted once in
    ``warden_signer_violations_total``); a directory gone with its ``.sig`` was pruned;
  - the policy's ``watch`` roots (HF / verl / other Warden runs) are rescanned when
    inotify saw a change, when ``rescan_seconds`` passed (NFS) or when a pending
    checkpoint may have become stable; complete, stable, unsigned ones are signed (against
    the announced digest when an event carried one); exports the age of the newest
    unsigned checkpoint;
  - every signed checkpoint is re-verified once per ``reverify_interval_seconds`` (the
    first check does a whole round, later checks one checkpoint each); one signed by this
    signer whose ``.sig`` disappeared while its directory is still there fails with
    ``signature_missing``.

Signatures lie beside each directory (``step-N.sig``) and carry run id, step, trainer
version and the previous signed checkpoint's root digest. A checkpoint deleted while it
is hashed (retention) is logged and counted (``warden_signer_errors_total{kind=
"checkpoint_vanished"}``), never fatal; a signature written just as its directory
vanished or changed is removed again. On SIGTERM the current hash is abandoned within one
read and the event is retried on the next start (its cursor is not advanced).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric import ec

import warden.layouts as verl_layout
from sidecars.runtime import Outcome, RetryLater, Sidecar, SidecarContext, error_kind
from sidecars.signer.metrics import SignerMetrics
from warden.errors import ConfigError, IncompleteError
from warden.journal import CHECKPOINT_SAVED, RUN_STARTED, Event
from warden.logs import log_fields
from warden.payloads import CheckpointSaved, PayloadError, RunStarted
from warden.safeio import atomic_write_bytes
from warden.signer.announcements import (
    ANNOUNCED_FILE,
    NO_DIGEST,
    SIGNATURE_MISSING,
    SIGNATURE_REPLACED,
    UNSAFE_PATH,
    AnnouncementStore,
    Record,
    audit,
    removal_problem,
    statement_problem,
)
from warden.signer.policy import SIGNING_KEY_ENV, SignerPolicy
from warden.signer.watch import (
    VERL_TRACKER,
    Candidate,
    RootWatcher,
    StabilityTracker,
    TreeState,
    completion_blocker,
    layout_of,
    list_checkpoints,
    read_tracker,
    remove_stale_signature_temps,
    signed_steps_before,
    tree_state,
    unsafe_entries,
)
from warden.signing.dsse import SignResult, sign_checkpoint, signature_path_for
from warden.signing.errors import (
    AnnouncementMismatch,
    CheckpointChanged,
    CheckpointVanished,
    HashingCancelled,
    SignatureMissing,
    SignerError,
    UnsupportedSignature,
)
from warden.signing.keys import TrustedKeys, load_private_key, load_trusted_keys, trusted_keys_from
from warden.signing.manifest import Announced, Provenance
from warden.signing.verify import FILES_MISMATCH, VerifyResult, read_signed_statement, verify_checkpoint

T = TypeVar("T")
RUN_CHECKPOINTS = "checkpoints"
RUNS_FILE = "runs.json"
MAX_REMEMBERED_RUNS = 32


class BadEvent(IncompleteError):
    """A ``checkpoint.saved`` event without a usable ``data.path`` (logged, counted, skipped)."""


@dataclass(frozen=True)
class Root:
    """A directory of checkpoints the sidecar looks after."""

    path: str
    layout: str
    run_id: str | None
    default_run_id: str | None = None
    announced_only: bool = False
    """The run's own root: signed only on an event announcing the digest; the scan audits, never signs."""

    def extras(self) -> list[str]:
        """Files outside the checkpoint whose stability counts too (verl's tracker)."""
        return [os.path.join(self.path, VERL_TRACKER)] if self.layout == "verl" else []


@dataclass
class Unsigned:
    """A complete checkpoint without a signature, as last observed."""

    candidate: Candidate
    root: Root
    state: TreeState
    observed_at: float
    ready_at: float


def pruned_by_retention(candidate: Candidate, result: VerifyResult) -> tuple[str, ...] | None:
    """The role directories verl's retention removed, when that alone explains ``result``'s
    failure (:func:`warden.layouts.pruned_roles`); None for every other failure
    and every other layout."""
    if candidate.layout != "verl" or result.codes != [FILES_MISMATCH]:
        return None
    changed = len(result.modified) + len(result.extra)
    present = verl_layout.observe(candidate.path).roles
    return verl_layout.pruned_roles([d.name for d in result.missing], changed, present)


def gone_before_signing(candidate: Candidate) -> str | None:
    """Why there is nothing left to sign at ``candidate.path`` (removed by retention); None when there is.

    Gone: not a real directory any more; for verl also a directory without ``actor/``
    (verl's retention removes ``actor/`` and ``critic/`` and keeps the directory).
    """
    try:
        st = os.lstat(candidate.path)
    except OSError:
        return "deleted"
    if not stat.S_ISDIR(st.st_mode):
        return "deleted (not a directory any more)"
    if candidate.layout == "verl" and verl_layout.ACTOR not in verl_layout.observe(candidate.path).roles:
        return f"{verl_layout.ACTOR}/ removed by retention"
    return None


def signing_key(policy: SignerPolicy, policy_path: str | None) -> ec.EllipticCurvePrivateKey:
    """Loads the policy's (or ``$WARDEN_SIGNING_KEY``'s) key; refuses loose permissions or owners.

    A relative ``signing_key`` is relative to the policy file's directory (see policy.py).
    """
    path = policy.key_path(base=policy_dir(policy_path))
    if path is None:
        where = policy_path or "the signer policy"
        raise ConfigError(f"{where}: signing_key is not set; set it or {SIGNING_KEY_ENV} to a private key file")
    return load_private_key(path)


def policy_dir(policy_path: str | None) -> str | None:
    """The directory relative key paths of the policy resolve against; None without a policy file."""
    return os.path.dirname(os.path.abspath(policy_path)) if policy_path else None


def trust_set(key: ec.EllipticCurvePrivateKey, extra: str | None) -> TrustedKeys:
    """The signer's own public key, plus every key in ``extra`` (a .pub file or directory)."""
    own = trusted_keys_from([key.public_key()], "the signing key")
    if not extra:
        return own
    loaded = load_trusted_keys(extra)
    return TrustedKeys({**loaded.by_id, **own.by_id}, f"{loaded.source} and the signing key")


class SignerSidecar(Sidecar[SignerPolicy]):
    name = "signer"
    description = "hashes and signs checkpoints (checkpoint.saved, HF and verl roots), re-verifies them"
    default_port = 9461
    policy_schema = SignerPolicy
    handles = frozenset({CHECKPOINT_SAVED, RUN_STARTED})
    needs_run_dir = False

    def __init__(self, ctx: SidecarContext, use_watchdog: bool = True) -> None:
        super().__init__(ctx)
        self.key = signing_key(self.policy, ctx.policy_path)
        self.trusted = trust_set(self.key, self.policy.trusted_keys_path(policy_dir(ctx.policy_path)))
        self.metrics = SignerMetrics(ctx.registry)
        self.roots = self._roots()
        self.stability = StabilityTracker(self.policy.stable_seconds)
        self.watcher = RootWatcher([r.path for r in self.roots], use_watchdog)
        self.metrics.watchdog.set(1 if self.watcher.refresh() else 0)
        self.runs = RunRegistry(os.path.join(ctx.state_dir, RUNS_FILE))
        self.announced = AnnouncementStore(os.path.join(ctx.state_dir, ANNOUNCED_FILE))
        if self.announced.load_error:
            ctx.log.error(self.announced.load_error, extra=log_fields(sidecar=self.name))
        self._unannounced_since: dict[str, float] = {}
        self._violations: dict[str, str] = {}
        self._sig_checked: dict[str, tuple[tuple[object, ...], str | None]] = {}
        self._unsigned: dict[str, Unsigned] = {}
        self._failed: dict[str, tuple[tuple[tuple[str, int, int], ...], float]] = {}
        self._next_rescan = 0.0
        self._first_check = True
        self._reverify_queue: list[Candidate] = []
        self._next_reverify = 0.0
        self._invalid: set[str] = set()
        self._pruned: set[str] = set()

    def _roots(self) -> list[Root]:
        roots = []
        if self.policy.sign_run_checkpoints and self.ctx.run_dir:
            roots.append(Root(os.path.join(self.ctx.run_dir, RUN_CHECKPOINTS), "warden", None, announced_only=True))
        for spec in self.policy.watch:
            if spec.resolved not in {r.path for r in roots}:
                roots.append(Root(spec.resolved, spec.layout, spec.run_id, spec.effective_run_id))
        return roots

    # -- events ----------------------------------------------------------------------------
    def handle(self, event: Event) -> Outcome:
        if event.type == RUN_STARTED:
            try:
                version = RunStarted.from_data(event.data).warden_version
            except PayloadError:
                version = None
            self.runs.record(event.run_id, version)
            return Outcome.OK
        raw = event.data.get("path")
        if not isinstance(raw, str) or not raw:
            raise BadEvent(f"checkpoint.saved seq {event.seq} (step {event.step}) has no data.path; skipped")
        candidate = self._event_candidate(event, raw)
        self.runs.record(event.run_id, None)
        try:
            saved = CheckpointSaved.from_data(event.data)
        except PayloadError as exc:
            raise BadEvent(f"checkpoint.saved seq {event.seq} ({candidate.path}): {exc}; skipped") from None
        trainer_version = saved.trainer_version or self.runs.version(event.run_id)
        announced = saved.announced
        own = self._is_own(candidate)
        if not own and saved.complete is False:
            # the trainer side gave up waiting for the checkpoint (an HF rank's files never came): no
            # announcement to sign against; a watched root signs it once complete and stable
            self.ctx.log.warning(
                f"{candidate.path}: announced as incomplete ({str(list(saved.waiting_for or ()))[:200]}); "
                "not signed from this event",
                extra=self._fields(candidate),
            )
            return Outcome.OK
        record = None
        if own or announced is not None:
            record = self.announced.announce(candidate.path, candidate.step, event.run_id, announced)
        if own and announced is None:
            assert record is not None
            return self._refuse(candidate, record, NO_DIGEST, "a root_digest and file_count", "none announced")
        try:
            signed_root = self._already_signed(candidate, announced)
            if signed_root is not None:
                if record is not None:
                    self.announced.mark_signed(candidate.path, record, signed_root)
                return Outcome.OK
            result = self._sign(candidate, event.run_id, trainer_version, expected=announced)
            if record is not None:
                self.announced.mark_signed(candidate.path, record, result.root_digest)
        except AnnouncementMismatch as exc:
            assert record is not None
            gone = gone_before_signing(candidate)
            if gone is not None:  # retention got there first (verl keeps the directory): nothing to sign
                vanished = CheckpointVanished(f"{candidate.path}: {gone} while it was hashed", candidate.path)
                self._count(vanished, candidate.path)
                return Outcome.OK
            return self._refuse(candidate, record, exc.reason, exc.expected, exc.actual)
        except HashingCancelled:
            raise RetryLater(f"{candidate.path}: hashing abandoned on stop; the event will be retried") from None
        except CheckpointVanished as exc:
            self._count(exc, candidate.path)
        except SignerError as exc:
            self._count(exc, candidate.path)
            raise
        return Outcome.OK

    def _is_own(self, candidate: Candidate) -> bool:
        """True for a ``step-N/`` of the run's own root (``<run_dir>/checkpoints``)."""
        return any(r.announced_only and r.path == candidate.root for r in self.roots) and candidate.layout == "warden"

    def _refuse(self, candidate: Candidate, record: Record, reason: str, expected: str, actual: str) -> Outcome:
        """Signs nothing; counts, logs (path, expected, actual) and remembers the refusal."""
        self.metrics.refused.labels(reason).inc()
        self.announced.mark_refused(candidate.path, record, reason)
        self.ctx.log.error(
            f"refused to sign {candidate.path}: {reason}: expected {expected}, found {actual}",
            extra=self._fields(candidate, reason=reason, expected=expected, actual=actual),
        )
        return Outcome.VIOLATION

    def _event_candidate(self, event: Event, raw: str) -> Candidate:
        """The checkpoint an event names (``raw``: its data.path); relative paths are under the run dir."""
        base = self.ctx.run_dir or os.getcwd()
        path = os.path.normpath(raw if os.path.isabs(raw) else os.path.join(base, raw))
        if not os.path.lexists(path) and self.ctx.run_dir:
            # The trainer may see the run volume at another mount point than this container.
            moved = os.path.join(self.ctx.run_dir, RUN_CHECKPOINTS, os.path.basename(path))
            path = moved if os.path.lexists(moved) else path
        known = layout_of(os.path.basename(path))
        layout, step = known if known else ("warden", event.step if event.step is not None else 0)
        return Candidate(path, step, layout)

    def _already_signed(self, candidate: Candidate, announced: Announced | None = None) -> str | None:
        """The signed root digest when a ``.sig`` exists, verifies and (if announced) covers the
        announced digest; None otherwise. A mismatching one is about to be replaced (the same
        step saved again after a resume)."""
        if not os.path.lexists(candidate.signature_path):
            gone = gone_before_signing(candidate)
            if gone is not None:
                raise CheckpointVanished(f"{candidate.path}: {gone} before it could be signed", candidate.path)
            return None
        try:
            result = self._verify(candidate)
        except (SignatureMissing, UnsupportedSignature):
            return None
        if result.ok and (announced is None or announced.root_digest in _announcement_digests(result)):
            self.ctx.log.info("already signed", extra=self._fields(candidate))
            self._unsigned.pop(candidate.path, None)
            return result.signed_root_digest
        why = result.summary() if not result.ok else f"it signs root {result.signed_root_digest}, not the announced one"
        self.ctx.log.warning(f"replacing a signature that does not match: {why}", extra=self._fields(candidate))
        return None

    # -- signing ---------------------------------------------------------------------------
    def _timed(self, operation: str, call: Callable[[Any], T]) -> T:
        """Runs ``call(progress)``, feeding the bytes counter and, on success, the duration histogram."""
        start = time.monotonic()
        result = call(self.metrics.progress(operation))
        self.metrics.hash_seconds.labels(operation).observe(time.monotonic() - start)
        return result

    def _verify(self, candidate: Candidate) -> VerifyResult:
        return self._timed(
            "verify",
            lambda progress: verify_checkpoint(
                candidate.path,
                self.trusted,
                max_workers=self.policy.hash_workers,
                progress=progress,
                cancel=self.ctx.stop,
            ),
        )

    def _sign(
        self,
        candidate: Candidate,
        run_id: str | None,
        trainer_version: str | None,
        before: Unsigned | None = None,
        expected: Announced | None = None,
    ) -> SignResult:
        """Signs ``candidate`` (only if it hashes to ``expected``, when given: AnnouncementMismatch
        otherwise); removes the new ``.sig`` again if the directory vanished or changed meanwhile."""
        provenance = Provenance(
            run_id=run_id,
            step=candidate.step,
            trainer_version=trainer_version,
            parent_root_digest=self._parent_digest(candidate, run_id),
        )
        started = time.monotonic()
        result = self._timed(
            "sign",
            lambda progress: sign_checkpoint(
                candidate.path,
                self.key,
                provenance,
                max_workers=self.policy.hash_workers,
                progress=progress,
                cancel=self.ctx.stop,
                expected=expected,
                serialization=self.policy.signing_serialization(),
            ),
        )
        self._check_unchanged(candidate, result, before)
        self.metrics.signed.labels(candidate.layout).inc()
        self.metrics.last_signed.set(self.ctx.clock())
        self._unsigned.pop(candidate.path, None)
        self._failed.pop(candidate.path, None)
        self.ctx.log.info(
            "signed checkpoint",
            extra=self._fields(
                candidate,
                root_digest=result.root_digest,
                bytes=result.total_bytes,
                seconds=round(time.monotonic() - started, 3),
                parent=provenance.parent_root_digest,
                signature=result.signature_path,
            ),
        )
        return result

    def _check_unchanged(self, candidate: Candidate, result: SignResult, before: Unsigned | None) -> None:
        """Raises (after deleting the fresh ``.sig``) if the directory vanished or changed while hashed."""
        extras = before.root.extras() if before is not None else []
        after = tree_state(candidate.path, extras) if before is not None else None
        if not os.path.isdir(candidate.path) or (before is not None and after is None):
            self._discard(result.signature_path)
            raise CheckpointVanished(f"{candidate.path}: deleted while it was being signed", candidate.path)
        if before is not None and after is not None and after.fingerprint != before.state.fingerprint:
            self._discard(result.signature_path)
            raise CheckpointChanged(f"{candidate.path}: changed while it was being signed; it will be signed again")

    def _discard(self, signature_path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(signature_path)

    def _parent_digest(self, candidate: Candidate, run_id: str | None) -> str | None:
        """Root digest of the newest earlier signed checkpoint of the same run in the same root."""
        for _step, signature in signed_steps_before(candidate.root, candidate.layout, candidate.step):
            try:
                _key, statement = read_signed_statement(signature, self.trusted)
            except SignerError as exc:
                self.ctx.log.warning(f"previous signature skipped for the chain: {exc}", extra=self._fields(candidate))
                continue
            previous_run = statement.provenance.run_id
            if previous_run is not None and run_id is not None and previous_run != run_id:
                return None
            return statement.subject_digest
        return None

    def _count(self, exc: SignerError, path: str) -> None:
        """Counts and logs a failure of one checkpoint; a vanished one is a warning, not an error."""
        kind = error_kind(exc)
        self.metrics.errors.labels(kind).inc()
        fields = log_fields(sidecar=self.name, path=path, kind=kind)
        if isinstance(exc, CheckpointVanished):
            self.ctx.log.warning(f"{exc} (deleted by retention?); skipped", extra=fields)
        else:
            self.ctx.log.error(str(exc), extra=fields)

    def _fields(self, candidate: Candidate, **more: object) -> dict[str, Any]:
        return log_fields(sidecar=self.name, path=candidate.path, step=candidate.step, layout=candidate.layout, **more)

    # -- periodic check --------------------------------------------------------------------
    def check(self) -> Outcome:
        now = self.ctx.clock()
        due = self._roots_due(now)
        if due:
            self.metrics.watchdog.set(1 if self.watcher.refresh() else 0)
        for root in due:
            if not root.announced_only:
                self._scan(root, now)
        self.stability.forget(self._unsigned)
        outcome = self._sign_ready(now)
        self._publish_unsigned(self.ctx.clock())
        outcome = max(outcome, self._audit_own(now))
        if not self.ctx.stop.is_set():
            outcome = max(outcome, self._reverify(now))
        self._first_check = False
        return outcome

    def _roots_due(self, now: float) -> list[Root]:
        """Roots to rescan: all on the timer, else those inotify saw change or with a pending checkpoint due."""
        if now >= self._next_rescan or self._first_check:
            self._next_rescan = now + self.policy.rescan_seconds
            self.watcher.take_dirty()
            return list(self.roots)
        dirty = self.watcher.take_dirty()
        waiting = {u.root.path for u in self._unsigned.values() if u.ready_at <= now}
        return [r for r in self.roots if r.path in dirty or r.path in waiting]

    def _scan(self, root: Root, now: float) -> None:
        """Refreshes what is known about ``root``'s unsigned complete checkpoints."""
        remove_stale_signature_temps(root.path, now)
        tracker = read_tracker(root.path) if root.layout == "verl" else None
        grace = self.policy.stable_seconds
        seen = set()
        for candidate in list_checkpoints(root.path, root.layout):
            if os.path.lexists(candidate.signature_path) or completion_blocker(candidate, tracker):
                continue
            state = tree_state(candidate.path, root.extras())
            if state is None:
                continue
            wait = self.stability.remaining(candidate.path, state, now) if grace else 0.0
            ready_at = now + max(0.0, wait)
            failed = self._failed.get(candidate.path)
            if failed is not None and failed[0] == state.fingerprint:
                ready_at = max(ready_at, failed[1])  # the same content failed before: wait for its retry
            self._unsigned[candidate.path] = Unsigned(candidate, root, state, now, ready_at)
            seen.add(candidate.path)
        for path in [p for p, u in self._unsigned.items() if u.root == root and p not in seen]:
            del self._unsigned[path]
        for path in [p for p in self._failed if os.path.dirname(p) == root.path and p not in seen]:
            del self._failed[path]

    def _sign_ready(self, now: float) -> Outcome:
        """Signs the pending checkpoints that are stable now, oldest step first."""
        outcome = Outcome.OK
        ready = [u for u in self._unsigned.values() if u.ready_at <= now and u.observed_at == now]
        for item in sorted(ready, key=lambda u: (u.root.path, u.candidate.step)):
            if self.ctx.stop.is_set():
                return max(outcome, Outcome.INCOMPLETE)
            outcome = max(outcome, self._sign_pending(item, now))
        return outcome

    def _sign_pending(self, item: Unsigned, now: float) -> Outcome:
        """Signs a stable checkpoint of an hf/verl/other root; an announced digest must match."""
        record = self.announced.get(item.candidate.path)
        expected = record.announced if record is not None else None
        run_id = record.run_id if record is not None and record.run_id else self._run_id_for(item)
        try:
            result = self._sign(item.candidate, run_id, self.runs.version(run_id), before=item, expected=expected)
            if record is not None and expected is not None:
                self.announced.mark_signed(item.candidate.path, record, result.root_digest)
        except AnnouncementMismatch as exc:
            assert record is not None
            gone = gone_before_signing(item.candidate)
            if gone is not None:
                path = item.candidate.path
                self._count(CheckpointVanished(f"{path}: {gone} while it was hashed", path), path)
                self._unsigned.pop(item.candidate.path, None)
                return Outcome.OK
            self._failed[item.candidate.path] = (item.state.fingerprint, math.inf)
            item.ready_at = math.inf
            return self._refuse(item.candidate, record, exc.reason, exc.expected, exc.actual)
        except HashingCancelled:
            return Outcome.INCOMPLETE
        except CheckpointVanished as exc:
            self._count(exc, item.candidate.path)
            self._unsigned.pop(item.candidate.path, None)
        except CheckpointChanged as exc:
            self._count(exc, item.candidate.path)
            item.ready_at = now + self.policy.stable_seconds
        except SignerError as exc:
            self._count(exc, item.candidate.path)
            retry = math.inf if exc.exit_code == 1 else now + self.policy.rescan_seconds
            self._failed[item.candidate.path] = (item.state.fingerprint, retry)
            item.ready_at = retry
            return Outcome.VIOLATION if exc.exit_code == 1 else Outcome.INCOMPLETE
        return Outcome.OK

    def _run_id_for(self, item: Unsigned) -> str | None:
        """The policy's run id, else (warden layout) trainer_state.json's, else the root's name or the journal's."""
        if item.root.run_id:
            return item.root.run_id
        if item.root.layout == "warden":
            try:
                with open(os.path.join(item.candidate.path, "trainer_state.json"), encoding="utf-8") as fh:
                    run_id = json.load(fh).get("run_id")
                if isinstance(run_id, str) and run_id:
                    return run_id
            except (OSError, ValueError, AttributeError):
                pass
        if item.root.default_run_id:
            return item.root.default_run_id
        return self.runs.last_run_id or (os.path.basename(self.ctx.run_dir) if self.ctx.run_dir else None)

    def _publish_unsigned(self, now: float) -> None:
        self.metrics.unsigned.set(len(self._unsigned))
        newest = max((u.state.last_change for u in self._unsigned.values()), default=None)
        self.metrics.unsigned_age.set(0.0 if newest is None else max(0.0, now - newest))

    # -- the run's own root: audit, never sign ----------------------------------------------
    def _audit_own(self, now: float) -> Outcome:
        """Finds the own root's checkpoints that no valid announced signature covers; signs nothing.

        In every root, an entry named like a checkpoint that is not a real directory (a
        symlink to one included) is an ``unsafe_path`` violation: it is never listed, signed
        or verified. Own-root violations (gauge by reason, counter on first sight, error log): ``unannounced``
        (a ``step-N/`` no event named, after ``stable_seconds``), ``signature_missing`` (its
        ``.sig`` was deleted after signing), ``signature_replaced`` (a ``.sig`` that does
        not verify or names another run, step or digest), and refusals. A directory gone
        together with its ``.sig`` was pruned (its record is dropped), unless an older one is
        still there: retention removes the oldest first, so that is ``removed_out_of_order``.
        """
        found: dict[str, str] = {}
        for root in self.roots:
            for candidate in unsafe_entries(root.path, root.layout):
                found[candidate.path] = UNSAFE_PATH  # never listed, so never signed or verified
        for root in (r for r in self.roots if r.announced_only):
            listed = list_checkpoints(root.path, root.layout)
            for candidate in listed:
                reason = self._audit_one(candidate, now)
                if reason is not None:
                    found[candidate.path] = reason
            present = {c.path for c in listed}
            present_steps = [c.step for c in listed]
            for path, record in self.announced.under(root.path):
                if path in present or os.path.lexists(signature_path_for(path)):
                    continue
                problem = removal_problem(record.step, present_steps) if record.signed_digest else None
                if problem is not None:
                    found[path] = problem  # kept (and paging) while an older checkpoint remains
                else:
                    self.announced.forget(path)  # pruned by retention: directory and .sig both gone
            for path in [p for p in self._unannounced_since if os.path.dirname(p) == root.path and p not in present]:
                del self._unannounced_since[path]
            for sig_path in [p for p in self._sig_checked if os.path.dirname(p) == root.path]:
                if sig_path[: -len(".sig")] not in present:
                    del self._sig_checked[sig_path]  # bounded by the checkpoints listed
        return self._publish_violations(found)

    def _audit_one(self, candidate: Candidate, now: float) -> str | None:
        record = self.announced.get(candidate.path)
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
        return audit(record, False, quiet, self.policy.stable_seconds)

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
            self.ctx.log.error(
                f"{signature}: not the signature the signer wrote: {problem}", extra=self._fields(candidate)
            )
        return SIGNATURE_REPLACED

    def _read_signature_problem(self, candidate: Candidate, record: Record | None) -> str | None:
        try:
            _key, statement = read_signed_statement(candidate.signature_path, self.trusted)
        except SignatureMissing:
            return None
        except SignerError as exc:
            return str(exc)[:300]
        name = os.path.basename(candidate.path)
        problem = statement_problem(name, candidate.step, record, statement, set(self.runs.versions))
        if problem is None and (record is None or record.signed_digest is None):
            # this run's valid signature (before an upgrade, or a crash before it was recorded): adopt it
            base = record or Record(candidate.step, statement.provenance.run_id)
            self.announced.mark_signed(candidate.path, base, statement.subject_digest)
        return problem

    def _publish_violations(self, found: dict[str, str]) -> Outcome:
        """Counts new (path, reason) pairs, logs them, sets the gauge; VIOLATION while any remain."""
        for path, reason in found.items():
            if self._violations.get(path) != reason:
                self.metrics.violations.labels(reason).inc()
                if reason != SIGNATURE_REPLACED:  # that one was logged with its detail
                    self.ctx.log.error(
                        f"{path}: checkpoint violation: {reason}; it will not be signed",
                        extra=log_fields(sidecar=self.name, path=path, reason=reason),
                    )
        self._violations = found
        for reason in self.metrics.violating_reasons:
            self.metrics.violating.labels(reason).set(sum(1 for r in found.values() if r == reason))
        return Outcome.VIOLATION if found else Outcome.OK

    # -- re-verification -------------------------------------------------------------------
    def _reverify(self, now: float) -> Outcome:
        """Verifies queued signed checkpoints (all of them in the first check, else one); refills on time."""
        if not self.policy.reverify_interval_seconds:
            return Outcome.OK
        if not self._reverify_queue and now >= self._next_reverify:
            self._reverify_queue = [
                c
                for root in self.roots
                for c in list_checkpoints(root.path, root.layout)
                if os.path.lexists(c.signature_path) or self._was_signed(c)
            ] + self._signed_outside_roots()
            self._invalid &= {c.path for c in self._reverify_queue}
            self._pruned &= {c.path for c in self._reverify_queue}
            self._next_reverify = now + self.policy.reverify_interval_seconds
            if not self._reverify_queue:
                self.metrics.last_reverify.set(self.ctx.clock())
        outcome = Outcome.OK
        budget = len(self._reverify_queue) if self._first_check else 1
        while self._reverify_queue and budget > 0 and not self.ctx.stop.is_set():
            budget -= 1
            outcome = max(outcome, self._reverify_one(self._reverify_queue.pop(0)))
            if not self._reverify_queue:
                self.metrics.last_reverify.set(self.ctx.clock())
        self.metrics.invalid.set(len(self._invalid))
        return outcome

    def _signed_outside_roots(self) -> list[Candidate]:
        """Checkpoints signed from an event (the verl bridge's ``checkpoint.saved``) in a directory
        no root watches: re-verified too, so verl's retention there is counted as pruned."""
        watched = {r.path for r in self.roots}
        out = []
        for path, _record in self.announced.signed():
            known = layout_of(os.path.basename(path))
            if known is not None and os.path.dirname(path) not in watched and os.path.isdir(path):
                out.append(Candidate(path, known[1], known[0]))
        return out

    def _was_signed(self, candidate: Candidate) -> bool:
        """True when the signer signed (or adopted) this checkpoint: it stays in re-verification."""
        record = self.announced.get(candidate.path)
        return record is not None and record.signed_digest is not None

    def _reverify_one(self, candidate: Candidate) -> Outcome:
        try:
            result = self._verify(candidate)
        except HashingCancelled:
            self._reverify_queue.insert(0, candidate)
            return Outcome.OK
        except SignatureMissing as exc:
            if not os.path.isdir(candidate.path):
                self._invalid.discard(candidate.path)  # pruned: the directory went with its .sig
                return Outcome.OK
            self._count(exc, candidate.path)
            self.metrics.verifications.labels("failed").inc()
            self.metrics.verify_failures.labels(SIGNATURE_MISSING).inc()
            self._invalid.add(candidate.path)
            self.ctx.log.error(
                f"re-verification failed: {candidate.signature_path} was deleted after signing",
                extra=self._fields(candidate, codes=[SIGNATURE_MISSING]),
            )
            return Outcome.VIOLATION
        except CheckpointVanished as exc:
            self._count(exc, candidate.path)
            self._invalid.discard(candidate.path)
            return Outcome.OK
        except SignerError as exc:
            self._count(exc, candidate.path)
            self.metrics.verifications.labels("incomplete").inc()
            return Outcome.INCOMPLETE
        if result.ok:
            self.metrics.verifications.labels("ok").inc()
            self._invalid.discard(candidate.path)
            return Outcome.OK
        pruned = pruned_by_retention(candidate, result)
        if pruned:
            self._invalid.discard(candidate.path)
            if candidate.path not in self._pruned:
                self._pruned.add(candidate.path)
                self.metrics.pruned.labels(candidate.layout).inc()
                self.ctx.log.info(
                    f"pruned by retention, not tampered with: {', '.join(r + '/' for r in pruned)} removed as a "
                    "whole, every other signed file unchanged",
                    extra=self._fields(candidate, removed=list(pruned)),
                )
            return Outcome.OK
        self._pruned.discard(candidate.path)
        self.metrics.verifications.labels("failed").inc()
        self.metrics.verify_failures.labels(result.codes[0]).inc()
        self._invalid.add(candidate.path)
        self.ctx.log.error(
            f"re-verification failed: {result.summary()}", extra=self._fields(candidate, codes=result.codes)
        )
        return Outcome.VIOLATION

    def close(self) -> None:
        self.watcher.close()


class RunRegistry:
    """Run ids seen in the journal and their trainer versions, kept in ``<state_dir>/runs.json``.

    ``run.started`` is read once (the cursor moves past it), so the version it carries is
    saved for the checkpoints of that run signed after a restart.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.versions: dict[str, str | None] = {}
        self.last_run_id: str | None = None
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
            self.versions = {str(k): v if isinstance(v, str) else None for k, v in raw.get("versions", {}).items()}
            last = raw.get("last_run_id")
            self.last_run_id = last if isinstance(last, str) else None
        except (OSError, ValueError, AttributeError):
            pass

    def version(self, run_id: str | None) -> str | None:
        return self.versions.get(run_id) if run_id else None

    def record(self, run_id: str, version: str | None) -> None:
        """Remembers ``run_id`` (and its version, when given); writes the file only on a change."""
        known = self.versions.get(run_id)
        new_version = version or known
        if run_id == self.last_run_id and run_id in self.versions and new_version == known:
            return
        self.versions.pop(run_id, None)
        self.versions[run_id] = new_version
        while len(self.versions) > MAX_REMEMBERED_RUNS:
            del self.versions[next(iter(self.versions))]
        self.last_run_id = run_id
        document = {"versions": self.versions, "last_run_id": run_id}
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(document, indent=1).encode("utf-8"))


def _announcement_digests(result: VerifyResult) -> set[str | None]:
    """The digests of a verified signature an announcement can equal: the signed root (files
    serialization) and, for shards, the per-file root recorded beside it."""
    files_root = result.provenance.files_root_digest if result.provenance is not None else None
    return {result.signed_root_digest, files_root} - {None}
