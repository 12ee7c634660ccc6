"""The verl bridge: turns what an unmodified verl run writes into Warden journal events.

One :meth:`VerlBridge.run_pass` looks at each input once and emits what became complete:

==========================================  ====================  =============================
verl writes                                 the bridge emits      when
==========================================  ====================  =============================
file logger line ``{"step", "data"}``       ``step.completed``    the line has its newline
file logger truncated (verl restarted)      ``run.resumed``       on detection; lines re-read
``rollout_data_dir/{step}.jsonl``           ``reward.snapshot``   the dump is complete
``global_step_N/`` + tracker naming ``N``   ``checkpoint.saved``  both stable ``stable_seconds``
(a new, empty journal)                      ``run.started``       first pass
==========================================  ====================  =============================

Every event carries a marker (``data["bridge"]``, see :mod:`sidecars.bridge.state`), and
on start the bridge replays the markers written after its last state save, so a crash
between writing an event and saving the state never duplicates the event.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry

import warden.layouts as ckpt
import warden.runid as runid
from sidecars.bridge.errors import BridgeConfigError, BridgeError, BridgeIncomplete
from sidecars.bridge.metrics import BridgeMetrics
from sidecars.bridge.rollouts import (
    DumpFile,
    Evidence,
    later_written,
    list_dumps,
    parse_dump,
    snapshot_payload,
    waiting_reason,
)
from sidecars.bridge.state import MARKER_KEY, BridgeState, StateStore, apply_marker, marker
from sidecars.bridge.verl_log import LogLine, tail
from warden import __version__
from warden.errors import WardenError
from warden.journal import (
    JOURNAL_NAME,
    MAX_LINE_BYTES,
    STEP_COMPLETED,
    Cursor,
    EventTooLarge,
    EventWriter,
    JournalError,
    JournalReader,
    JournalTruncated,
)
from warden.ledger import read_ledger
from warden.logs import log_fields
from warden.metric_names import map_metrics, prometheus_name, warden_aliases
from warden.payloads import CheckpointSaved, RunResumed, RunStarted
from warden.safeio import open_regular_fd
from warden.signing.manifest import announce_tree
from warden.stability import Stability, tree_state
from warden.statedir import resolve_state_dir

SOURCE = "verl"
TRAINING_PREFIXES = ("actor/", "critic/", "training/", "timing_s/", "perf/")


def sanitize_run_id(text: str) -> str:
    """A run id usable as one key segment, ``verl-run`` when nothing usable is left."""
    return runid.sanitize_run_id(text, "verl-run")


GENERIC_NAMES = frozenset(
    {"metrics", "metric", "verl", "log", "logs", "warden", "run", "runs", "checkpoints", "checkpoint", "ckpt",
     "rollouts", "train", "training", "output", "outputs", "data", "tmp", "jsonl", "verl-run"}
)  # fmt: skip
"""Path components that name no experiment (the docs' ``.../verl/metrics.jsonl`` among them)."""


def derive_run_id(verl_log: str | None, checkpoint_root: str | None, run_dir: str, suffix: str) -> str:
    """``<name>-<suffix>``: the first path component that names an experiment, then ``suffix``.

    Looked at in order: the file logger's stem (verl's default path is
    ``<project>/<experiment>.jsonl``), the checkpoint root's name (verl's default
    ``checkpoints/<project>/<experiment>``), the log's directory, the run directory and
    its parent. Generic names (:data:`GENERIC_NAMES`, e.g. ``metrics`` of
    ``VERL_FILE_LOGGER_PATH=.../metrics.jsonl``) are skipped; ``verl-run`` when none is
    left. The suffix (random, from the caller) makes two experiments with the same paths
    on two machines, or the same name in one store, two runs.
    """
    candidates: list[str] = []
    if verl_log:
        log_path = os.path.abspath(verl_log)
        candidates.append(os.path.splitext(os.path.basename(log_path))[0])
    if checkpoint_root:
        candidates.append(os.path.basename(os.path.abspath(checkpoint_root)))
    if verl_log:
        candidates.append(os.path.basename(os.path.dirname(os.path.abspath(verl_log))))
    run = os.path.abspath(run_dir)
    candidates += [os.path.basename(run), os.path.basename(os.path.dirname(run))]
    names = (runid.sanitize_run_id(c, "") for c in candidates)
    name = next((n for n in names if n and n.lower() not in GENERIC_NAMES), "verl-run")
    return runid.sanitize_run_id(f"{name[:100]}-{suffix}", "verl-run")


@dataclass(frozen=True)
class BridgeConfig:
    """Inputs (at least one), where the journal goes, and the selection and timing knobs."""

    run_dir: str
    verl_log: str | None = None
    rollout_dir: str | None = None
    checkpoint_root: str | None = None
    state_dir: str | None = None
    run_id: str | None = None
    stable_seconds: float = 30.0
    top_k: int = 4
    min_reward: float | None = None
    max_text_chars: int = 4000
    save_every: int = 256

    def __post_init__(self) -> None:
        if not (self.verl_log or self.rollout_dir or self.checkpoint_root):
            raise BridgeConfigError("nothing to bridge: pass --verl-log, --rollout-dir and/or --checkpoint-root")
        if self.stable_seconds < 0:
            raise BridgeConfigError(f"--stable-seconds: must be >= 0, got {self.stable_seconds}")
        if not 1 <= self.top_k <= 1000:
            raise BridgeConfigError(f"--top-k: must be between 1 and 1000, got {self.top_k}")
        if self.max_text_chars < 1:
            raise BridgeConfigError(f"--max-text-chars: must be >= 1, got {self.max_text_chars}")
        if self.run_id is not None and sanitize_run_id(self.run_id) != self.run_id:
            raise BridgeConfigError(f"--run-id {self.run_id!r}: use letters, digits, '.', '_' and '-' only")
        for flag, path in (("--rollout-dir", self.rollout_dir), ("--checkpoint-root", self.checkpoint_root)):
            if path and os.path.exists(path) and not os.path.isdir(path):
                raise BridgeConfigError(f"{flag} {path}: not a directory")

    @property
    def journal_path(self) -> str:
        return os.path.join(self.run_dir, JOURNAL_NAME)

    @property
    def resolved_state_dir(self) -> str:
        return resolve_state_dir(self.state_dir, "bridge", self.run_dir)

    def default_run_id(self, suffix: str | None = None) -> str:
        """A new run id, unique: a readable name (:func:`derive_run_id`) plus a random suffix.

        Used once, for a new journal; the journal (and the bridge state) keep it afterwards.
        """
        return derive_run_id(self.verl_log, self.checkpoint_root, self.run_dir, suffix or secrets.token_hex(4))

    def digest(self) -> str:
        """SHA-256 of the bridge's inputs: the ``config_digest`` of the ``run.started`` it writes."""
        inputs = {"source": SOURCE, "verl_log": self.verl_log, "rollout_dir": self.rollout_dir}
        inputs["checkpoint_root"] = self.checkpoint_root
        text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class PassReport:
    """What one pass did: events by type, items still waiting, skipped input, unreadable input."""

    emitted: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    restarts: int = 0

    @property
    def exit_code(self) -> int:
        """0, or 3 when an input could not be read."""
        return 3 if self.incomplete else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "emitted": dict(sorted(self.emitted.items())),
            "pending": self.pending,
            "problems": self.problems,
            "incomplete": self.incomplete,
            "log_restarts": self.restarts,
            "exit_code": self.exit_code,
        }


def resume_step(first_step: int, metrics: dict[str, Any]) -> int:
    """The step a restarted verl resumed from, given the first line of its new log.

    verl logs validation-only metrics at the resumed step itself (``val_before_train``)
    and training metrics from the step after it.
    """
    training = any(str(k).startswith(TRAINING_PREFIXES) for k in metrics)
    return max(0, first_step - 1) if training else first_step


def shrink(payload: dict[str, Any]) -> bool:
    """Makes an event over the line limit smaller: drops ``verl_metrics``, then halves ``samples``.

    Returns False when there is nothing left to drop. Says what it dropped in ``truncated_for_size``.
    """
    if payload.get("verl_metrics") is not None:
        payload["verl_metrics"] = None
        payload["truncated_for_size"] = f"verl_metrics dropped: over the {MAX_LINE_BYTES}-byte line limit"
        return True
    samples = payload.get("samples")
    if isinstance(samples, list) and samples:
        payload["samples"] = samples[: len(samples) // 2]
        payload["truncated_for_size"] = f"samples cut to the best {len(payload['samples'])} to fit the line limit"
        return True
    return False


def save_identity(step: int, tracker: ckpt.Tracker | None, contents: ckpt.StepContents) -> int | None:
    """What identifies one save of ``global_step_<step>`` (the same step saved again after a
    restart is a new save): the mtime of verl's manifests when it has them, else the mtime of
    the tracker write naming the step; None when neither."""
    if contents.manifests:
        return contents.marker_mtime_ns
    if tracker is not None and tracker.step == step:
        return tracker.mtime_ns
    return None


def step_payload(metrics: dict[str, Any]) -> dict[str, Any]:
    """``step.completed`` data: mapped names, the Warden trainer's aliases, the originals."""
    mapped = map_metrics(metrics)
    data: dict[str, Any] = dict(mapped.values)
    for alias, value in warden_aliases(metrics).items():
        data.setdefault(alias, value)
    data["source"] = SOURCE
    data["verl_metrics"] = metrics
    return data


class VerlBridge:
    """Owns the journal writer and the state; :meth:`run_pass` does one round."""

    def __init__(
        self,
        cfg: BridgeConfig,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.log = log or logging.getLogger("warden.bridge")
        self.registry = registry or CollectorRegistry()
        self.metrics = BridgeMetrics(self.registry)
        self.dump_stability = Stability()
        self.checkpoint_stability = Stability()
        self.store = StateStore(cfg.resolved_state_dir)
        self.state = self.store.load()
        self.run_id = self._resolve_run_id()
        os.makedirs(cfg.run_dir, exist_ok=True)
        try:
            self.writer = EventWriter(cfg.journal_path, self.run_id)
        except (OSError, JournalError) as exc:
            raise BridgeIncomplete(f"{cfg.journal_path}: cannot open the journal ({exc})") from exc
        self._unsaved = 0
        self._report = PassReport()
        self.heartbeat = time.monotonic()
        self.reconciled = self._reconcile()

    # -- start-up ---------------------------------------------------------------------------
    def _resolve_run_id(self) -> str:
        existing = runid.journal_run_id(self.cfg.journal_path)
        if existing and self.cfg.run_id and existing != self.cfg.run_id:
            raise BridgeConfigError(
                f"{self.cfg.journal_path} belongs to run {existing!r}, not --run-id {self.cfg.run_id!r}; "
                "pass the same --run-id or another --run-dir"
            )
        run_id = existing or self.cfg.run_id or self.state.run_id or self.cfg.default_run_id()
        self.state.run_id = run_id
        return run_id

    def _reconcile(self) -> int:
        """Applies the markers of events written after the last state save; returns how many."""
        reader = JournalReader(
            self.cfg.journal_path, Cursor(self.state.journal_offset, self.state.journal_seq), on_problem=self._warn
        )
        try:
            events = [event for event, _ in reader.read_available()]
        except JournalTruncated:
            self.log.warning("journal shorter than the bridge state: rebuilding the state from the whole journal")
            self.state = BridgeState(run_id=self.run_id)
            reader = JournalReader(self.cfg.journal_path, Cursor(), on_problem=self._warn)
            events = [event for event, _ in reader.read_available()]
        except OSError as exc:
            raise BridgeIncomplete(f"{self.cfg.journal_path}: cannot read the journal ({exc.strerror})") from exc
        applied = sum(apply_marker(self.state, e.step, e.data.get(MARKER_KEY)) for e in events)
        if not self.state.started and reader.cursor.seq > 0:
            self.state.started = True  # a journal someone else started: no run.started of ours
        self.state.journal_offset, self.state.journal_seq = reader.cursor.offset, reader.cursor.seq
        if applied:
            self.log.info(
                "replayed events written after the last state save",
                extra=log_fields(events=applied, journal=self.cfg.journal_path),
            )
        return applied

    def _warn(self, message: str) -> None:
        self.log.warning(message)

    # -- emitting -----------------------------------------------------------------------------
    def _emit(self, etype: str, data: dict[str, Any], step: int | None, mark: dict[str, Any]) -> bool:
        """Writes one event with its marker, then rolls the state forward over it.

        An event over the journal's line limit is shrunk (:func:`shrink`); False when even
        that is too large (the caller skips the item). Raises BridgeIncomplete when the
        journal cannot be written.
        """
        payload = {**data, MARKER_KEY: mark}
        while True:
            try:
                self.writer.emit(etype, payload, step=step)
                break
            except EventTooLarge as exc:
                if not shrink(payload):
                    self._problem("event", f"{etype} for step {step}: {exc}; skipped")
                    return False
            except JournalError as exc:
                self.metrics.errors.labels("journal_write").inc()
                raise BridgeIncomplete(f"{self.cfg.journal_path}: cannot write {etype} for step {step}: {exc}") from exc
        apply_marker(self.state, step, mark)
        self.metrics.emitted.labels(etype).inc()
        self._report.emitted[etype] = self._report.emitted.get(etype, 0) + 1
        self._unsaved += 1
        if self._unsaved >= self.cfg.save_every:
            self.save()
        return True

    def save(self) -> None:
        """Fsyncs the journal, then saves the state that accounts for it."""
        try:
            fd = os.open(self.cfg.journal_path, os.O_RDONLY)
            try:
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        except OSError as exc:
            raise BridgeIncomplete(f"{self.cfg.journal_path}: cannot fsync the journal ({exc.strerror})") from exc
        self.state.journal_offset, self.state.journal_seq = size, self.writer.last_seq
        self.store.save(self.state)
        self._unsaved = 0

    def _start(self) -> None:
        if self.state.started:
            return
        inputs = {
            "verl_log": self.cfg.verl_log,
            "rollout_dir": self.cfg.rollout_dir,
            "checkpoint_root": self.cfg.checkpoint_root,
        }
        nonce = read_ledger(self.cfg.journal_path, self.run_id).genesis_nonce or runid.new_genesis_nonce()
        started = RunStarted(
            source=SOURCE,
            config_digest=self.cfg.digest(),
            versions={"warden": __version__},
            genesis_nonce=nonce,
            extra={"inputs": inputs},
        )
        self._emit(started.TYPE, started.to_data(), None, marker("start"))

    # -- one pass -----------------------------------------------------------------------------
    def run_pass(self) -> PassReport:
        """Looks at every input once, emits what is complete, saves the state; returns the report."""
        self._report = report = PassReport()
        now = self.clock()
        self._start()
        if self.cfg.verl_log:
            self._pass_log(self.cfg.verl_log)
        if self.cfg.rollout_dir:
            self._pass_rollouts(self.cfg.rollout_dir, now)
        if self.cfg.checkpoint_root:
            self._pass_checkpoints(self.cfg.checkpoint_root, now)
        self.save()
        self.metrics.last_pass.set(self.clock())
        self.heartbeat = time.monotonic()
        return report

    def _unreadable(self, path: str, what: str, exc: OSError) -> None:
        message = f"{path}: cannot read {what} ({exc.strerror or exc})"
        self._report.incomplete.append(message)
        self.metrics.errors.labels(f"{what.replace(' ', '_')}_unreadable").inc()
        self.log.error(message, extra=log_fields(path=path))

    def _problem(self, source: str, message: str) -> None:
        self._report.problems.append(message)
        self.metrics.skipped.labels(source).inc()
        self.log.warning(message, extra=log_fields(source=source))

    # -- the file logger ------------------------------------------------------------------
    def _pass_log(self, path: str) -> None:
        pos = self.state.log
        try:
            read = tail(path, pos)
        except OSError as exc:
            self._unreadable(path, "verl log", exc)
            return
        if not read.exists:
            why = "missing (verl restarting?)" if pos.offset else "not there yet"
            self._report.pending.append(f"{path}: {why}; waiting for it")
            return
        if read.restart:
            first = next((line for line in read.lines if line.step is not None), None)
            self._restart(path, read.restart, first)
        pos = self.state.log
        pos.file_id = read.file_id
        for line in read.lines:
            if line.problem or line.step is None or line.metrics is None:
                self._problem("log", f"{path}: {line.problem}")
                pos.offset, pos.line_start, pos.line_sha256 = line.end, line.start, line.sha256 or None
                continue
            if not self._step_completed(line):
                pos.offset, pos.line_start, pos.line_sha256 = line.end, line.start, line.sha256

    def _resume_step(self, first: LogLine | None) -> int | None:
        """The step verl resumed from: told by the new log's first line, else by the tracker now."""
        if first is not None and first.step is not None:
            return resume_step(first.step, first.metrics or {})
        if self.cfg.checkpoint_root:
            with contextlib.suppress(OSError):
                tracker = ckpt.read_tracker(self.cfg.checkpoint_root)
                return tracker.step if tracker is not None else None
        return None

    def _restart(self, path: str, reason: str, first: LogLine | None) -> None:
        generation = self.state.log.generation + 1
        from_step, checkpoint = self._resume_step(first), None
        if from_step is not None and self.cfg.checkpoint_root:
            candidate = ckpt.step_dir(os.path.abspath(self.cfg.checkpoint_root), from_step)
            checkpoint = candidate if os.path.isdir(candidate) else None
        resumed = RunResumed(
            source=SOURCE,
            genesis_nonce=read_ledger(self.cfg.journal_path, self.run_id).genesis_nonce,
            from_step=from_step,
            checkpoint=checkpoint,
            verification="not verified by the bridge",
            extra={"reason": f"verl's file logger {path}: {reason}"},
        )
        self.log.warning("verl restarted: its log was truncated", extra=log_fields(path=path, reason=reason))
        self._emit(resumed.TYPE, resumed.to_data(), from_step, marker("restart", generation=generation))
        self.metrics.restarts.inc()
        self._report.restarts += 1

    def _step_completed(self, line: LogLine) -> bool:
        assert line.step is not None and line.metrics is not None
        data = step_payload(line.metrics)
        mark = marker("log", generation=self.state.log.generation, start=line.start, end=line.end, sha256=line.sha256)
        if not self._emit(STEP_COMPLETED, data, line.step, mark):
            return False
        values = map_metrics(line.metrics).values
        originals = {prometheus_name(k): k for k in line.metrics}
        self.metrics.verl.update(values, originals)
        self.metrics.last_step.set(line.step)
        return True

    # -- rollout dumps ----------------------------------------------------------------------
    def _log_mtime_ns(self) -> int | None:
        if not self.cfg.verl_log:
            return None
        try:
            return os.stat(self.cfg.verl_log).st_mtime_ns
        except OSError:
            return None

    def _pass_rollouts(self, directory: str, now: float) -> None:
        try:
            dumps = list_dumps(directory)
        except OSError as exc:
            self._unreadable(directory, "rollout dir", exc)
            return
        later = later_written(dumps)
        log_step, log_mtime = self.state.log.last_step, self._log_mtime_ns()
        waiting: list[str] = []
        for dump in dumps:
            if dump.step in self.state.rollouts:
                continue
            fingerprint = (dump.size, dump.mtime_ns)
            quiet = self.dump_stability.quiet_for(dump.path, fingerprint, dump.newest_change, now)
            evidence = Evidence(log_step, log_mtime, dump.step in later, quiet, self.cfg.stable_seconds)
            reason = waiting_reason(dump, evidence) or self._snapshot(dump)
            if reason:
                waiting.append(reason)
        self.dump_stability.forget(d.path for d in dumps if d.step not in self.state.rollouts)
        self.metrics.pending.labels("rollout").set(len(waiting))
        self._report.pending.extend(waiting)

    def _snapshot(self, dump: DumpFile) -> str | None:
        """Emits ``reward.snapshot`` for a dump whose writer is done; else says why it waits."""
        try:
            fd = open_regular_fd(dump.path)
            with open(fd, "rb") as fh:
                content = fh.read()
                after = os.fstat(fh.fileno())
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._unreadable(dump.path, "rollout dump", exc)
            return None
        if (after.st_size, after.st_mtime_ns) != (dump.size, dump.mtime_ns):
            return f"{dump.path}: changed while it was read; waiting"
        parsed = parse_dump(content)
        if parsed.torn:
            return f"{dump.path}: partial (its last line has no newline yet); waiting"
        payload = snapshot_payload(parsed, self.cfg.top_k, self.cfg.min_reward, self.cfg.max_text_chars)
        dropped = payload.extra["dropped"]
        if dropped:
            self._problem("rollout", f"{dump.path}: {dropped} rows without input/output/score; dropped")
        payload = replace(payload, source=SOURCE, extra={**payload.extra, "file": os.path.abspath(dump.path)})
        digest = hashlib.sha256(content).hexdigest()
        self._emit(
            payload.TYPE,
            payload.to_data(),
            dump.step,
            marker("rollout", file=os.path.basename(dump.path), sha256=digest),
        )
        return None

    # -- checkpoints ------------------------------------------------------------------------
    def _pass_checkpoints(self, root: str, now: float) -> None:
        """Emits ``checkpoint.saved`` for each ``global_step_N/`` that became complete and stable
        (:func:`warden.layouts.completion_blocker`: named by the tracker, or
        finished per verl's manifests with ``async_save``), once per save."""
        try:
            tracker = ckpt.read_tracker(root)
            steps = ckpt.list_steps(root)
        except OSError as exc:
            self._unreadable(os.path.join(root, ckpt.TRACKER), "checkpoint tracker", exc)
            return
        waiting: list[str] = []
        named = tracker.step if tracker is not None else None
        if tracker is not None and named is None:
            waiting.append(f"{os.path.join(root, ckpt.TRACKER)}: holds {tracker.text!r}, not a step (being written?)")
        if named is not None and named not in steps:
            missing = ckpt.step_dir(root, named)
            waiting.append(f"{ckpt.TRACKER} names step {named} but {missing} does not exist; waiting")
        emitted = max(self.state.checkpoints, default=None)
        considered = []
        for step in steps:
            path = os.path.abspath(ckpt.step_dir(root, step))
            contents = ckpt.observe(path)
            save_id = save_identity(step, tracker, contents)
            if save_id is not None and self.state.checkpoints.get(step) == save_id:
                continue  # this save of the step was reported
            blocker = ckpt.completion_blocker(step, named, contents)
            if blocker is not None or save_id is None:
                newer = (named is None or step > named) and (emitted is None or step > emitted)
                if newer:
                    waiting.append(f"{path}: {blocker}; not complete")
                continue
            considered.append(step)
            reason = self._checkpoint(root, step, tracker if named == step else None, save_id, now)
            if reason:
                waiting.append(reason)
        self.checkpoint_stability.forget(considered)
        self.metrics.pending.labels("checkpoint").set(len(waiting))
        self._report.pending.extend(waiting)

    def _checkpoint(self, root: str, step: int, tracker: ckpt.Tracker | None, save_id: int, now: float) -> str | None:
        """Emits ``checkpoint.saved`` with the root digest once ``step`` is stable; else says why it waits."""
        path = os.path.abspath(ckpt.step_dir(root, step))
        tree = tree_state(path)
        if tree is None:
            return f"{path}: gone; waiting"
        extra = (tracker.size, tracker.mtime_ns, tracker.text) if tracker is not None else None
        fingerprint = (tree.fingerprint, extra)
        newest = max(tree.last_change, tracker.newest_change if tracker is not None else 0.0)
        quiet = self.checkpoint_stability.quiet_for(step, fingerprint, newest, now)
        why = f"named by {ckpt.TRACKER}" if tracker is not None else f"{ckpt.CONTENTS_MANIFEST} written (async_save)"
        if quiet < self.cfg.stable_seconds:
            return f"{path}: {why}; unchanged for {quiet:.0f}s of {self.cfg.stable_seconds:.0f}s"
        try:
            announced = announce_tree(path)
        except (WardenError, OSError) as exc:
            self.metrics.errors.labels("checkpoint_hash").inc()
            return f"{path}: cannot hash it for the announcement ({str(exc)[:200]}); not announced"
        if tree_state(path) != tree:
            return f"{path}: changed while it was hashed; waiting"
        saved = CheckpointSaved(
            source=SOURCE,
            path=path,
            root=os.path.abspath(root),
            layout="verl",
            extra={"complete_by": "tracker" if tracker is not None else "ckpt_contents"},
        ).with_announced(announced)
        self._emit(saved.TYPE, saved.to_data(), step, marker("checkpoint", tracker_mtime_ns=save_id))
        fields = log_fields(path=path, step=step, root_digest=announced.root_digest)
        self.log.info("verl checkpoint complete", extra=fields)
        return None

    # -- service ----------------------------------------------------------------------------
    def close(self) -> None:
        """Saves the state (best effort) and closes the journal."""
        with contextlib.suppress(BridgeError):
            self.save()
        self.writer.close()
        self.metrics.up.set(0)
