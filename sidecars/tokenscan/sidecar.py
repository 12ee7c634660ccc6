"""The ``tokenscan`` sidecar: scans the policy's directories and every ``model.loading`` path.

Each watched directory is scanned when it is first seen, when watchdog reports a change
below it (after the change has settled for :data:`SETTLE_SECONDS`), and every
``rescan_interval_seconds``. Approval is the primary control and a person's decision: a
directory without an approval record is *unapproved* (TS1103: a low finding under the
policy's ``unapproved: warn``, high under ``block``), and its review report (the resolved
files and their digests, the rendered conversations, the default system prompt, the pipeline
rules) is written to ``<state_dir>/review/`` for that person; the sidecar never approves
anything itself. ``warden scan tokenizer PATH --approve --state-dir DIR`` pins every file's
SHA-256 under ``<state_dir>/approved/``; every later scan compares the current manifest with
the approved one, and a difference is a TS1101 drift finding (time-of-check/time-of-use) until
the files are restored or re-approved. Behavioural findings are evidence beside the decision.

:meth:`check` runs every ``check_interval_seconds`` and scans only what is due, so the
outcome it returns is that of the directories scanned in that round.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

from sidecars.runtime import Outcome, Sidecar, SidecarContext
from sidecars.tokenscan.metrics import TokenscanMetrics
from sidecars.tokenscan.watch import DirWatcher
from warden.journal import MODEL_LOADING, Event
from warden.logs import log_fields, utc_timestamp
from warden.safeio import atomic_write_bytes
from warden.tokenscan.approval import review
from warden.tokenscan.findings import Finding, count_by_severity
from warden.tokenscan.manifest import Approval, ApprovalStore, HashCache, ManifestError
from warden.tokenscan.policy import TokenscanPolicy, default_policy
from warden.tokenscan.scanner import DirectoryScan, scan_directory

SETTLE_SECONDS = 1.0
MAX_LOGGED_FINDINGS = 20


@dataclass
class _Dir:
    label: str
    source: str
    last_scan: float | None = None
    drifting: bool = False
    summary: tuple[int, ...] | None = None


class TokenscanSidecar(Sidecar[TokenscanPolicy]):
    name = "tokenscan"
    description = "whitelist and supply-chain scan of tokenizer/model dirs (policy paths, model.loading events)"
    default_port = 9463
    policy_schema = TokenscanPolicy
    handles = frozenset({MODEL_LOADING})
    needs_run_dir = False

    def default_policy(self) -> TokenscanPolicy:
        return default_policy()

    def __init__(self, ctx: SidecarContext) -> None:
        super().__init__(ctx)
        self.store = ApprovalStore(ctx.state_dir)
        self.cache = HashCache()
        self.metrics = TokenscanMetrics(ctx.registry)
        self.watcher = DirWatcher() if self.policy.watch else None
        self.dirs: dict[str, _Dir] = {}
        self.reviewed: set[str] = set()  # unapproved directories whose report was announced
        for path in self.policy.paths:
            self._track(os.path.abspath(os.path.expanduser(path)), "policy")

    def _track(self, path: str, source: str) -> _Dir:
        known = self.dirs.get(path)
        if known is not None:
            return known
        label = path if len(self.dirs) < self.policy.max_watched_paths else "other"
        state = _Dir(label, source)
        if label != "other":
            self.dirs[path] = state
            self.metrics.watched.set(len(self.dirs))
            if self.watcher is not None:
                self.watcher.watch(path)
        return state

    def handle(self, event: Event) -> Outcome:
        path = event.data.get("path")
        if not isinstance(path, str) or not path:
            self.ctx.log.warning("model.loading event without a path", extra=log_fields(seq=event.seq))
            return Outcome.OK
        full = os.path.abspath(os.path.join(self.ctx.run_dir or "", os.path.expanduser(path)))
        return self._scan(full, self._track(full, str(event.data.get("kind") or "event")))

    def check(self) -> Outcome:
        now = time.monotonic()
        changed = set(self.watcher.take_settled(SETTLE_SECONDS)) if self.watcher else set()
        worst = Outcome.OK
        for path, state in list(self.dirs.items()):
            due = state.last_scan is None or now - state.last_scan >= self.policy.rescan_interval_seconds
            if due or path in changed:
                worst = max(worst, self._scan(path, state))
        return worst

    # -- one scan ----------------------------------------------------------------------
    def _scan(self, path: str, state: _Dir) -> Outcome:
        scan = scan_directory(path, self.policy, with_manifest=True, hash_cache=self.cache)
        scan, approved = self._approval(path, scan)
        code = scan.outcome(self.policy.fail_severity)
        state.last_scan = time.monotonic()
        self.metrics.record(state.label, scan, code, self.ctx.clock())
        self.metrics.state(state.label, approved, state.drifting)
        self.metrics.approved_dirs.set(sum(1 for p in self.dirs if self._has_approval(p)))
        self._log(path, state, scan, code)
        if self.watcher is not None and state.label != "other":
            self.watcher.watch(path)  # a directory that did not exist before may exist now
        return Outcome(code)

    def _has_approval(self, path: str) -> bool:
        try:
            return self.store.load(path) is not None
        except ManifestError:
            return False

    def _approval(self, path: str, scan: DirectoryScan) -> tuple[DirectoryScan, bool]:
        """The scan compared with the approved manifest (drift findings added), or a clean scan
        of a directory without a record approved (see :func:`~warden.tokenscan.approval.review`);
        and whether the directory is approved."""
        state = self.dirs.get(path)
        loaded: Approval | ManifestError | None
        try:
            loaded = self.store.load(path)
        except ManifestError as exc:
            loaded = exc
        decided = review(loaded, scan, False, self.policy)
        if loaded is None and scan.review is not None:
            self._write_review(path, decided.scan)
        if decided.drift is not None and state is not None:
            if decided.drift and not state.drifting:
                self.metrics.drift_detected.inc()
            state.drifting = bool(decided.drift)
        return decided.scan, decided.approved

    def _write_review(self, path: str, scan: DirectoryScan) -> None:
        """The review report of an unapproved directory, for the person who decides (atomic:
        another process reads it); logged once per directory."""
        name = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:24] + ".json"
        target = os.path.join(self.ctx.state_dir, "review", name)
        doc = {"path": path, "scanned_at": utc_timestamp(self.ctx.clock()), **scan.to_dict(self.policy.fail_severity)}
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            atomic_write_bytes(target, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8"))
        except OSError as exc:
            self.ctx.log.warning("review report not written", extra=log_fields(path=path, error=str(exc)))
            return
        if path not in self.reviewed:
            self.reviewed.add(path)
            self.ctx.log.warning(
                "directory not approved: review its report, then approve it",
                extra=log_fields(
                    sidecar=self.name,
                    path=path,
                    report=target,
                    approve=f"warden scan tokenizer {path} --approve --state-dir DIR",
                ),
            )

    def _log(self, path: str, state: _Dir, scan: DirectoryScan, code: int) -> None:
        counts = count_by_severity(scan.findings)
        summary = (code, *counts.values(), len(scan.errors))
        if summary == state.summary:
            return
        state.summary = summary
        fields = log_fields(
            sidecar=self.name,
            path=path,
            source=state.source,
            outcome=code,
            errors=scan.errors[:5],
            duration_seconds=round(scan.duration_seconds, 4),
            **counts,
        )
        if code == 0:
            self.ctx.log.info("directory scanned clean", extra=fields)
            return
        self.ctx.log.warning(
            "directory scan found problems" if code == 1 else "directory scan incomplete", extra=fields
        )
        for f in scan.findings[:MAX_LOGGED_FINDINGS]:
            self._log_finding(f)

    def _log_finding(self, f: Finding) -> None:
        self.ctx.log.warning(
            f"{f.id} {f.rule.name}: {f.message}",
            extra=log_fields(sidecar=self.name, id=f.id, severity=f.severity.label, path=f.location, fix=f.fix),
        )

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
