"""``WardenCallback``: Warden events from an HF ``transformers.Trainer`` (and TRL trainers).

Add one line to an existing script, then run the sidecars against the run directory::

    trainer = Trainer(..., callbacks=[WardenCallback(run_dir="runs/sft-1")])

On the world's process zero only (``state.is_world_process_zero``) it appends to
``<run_dir>/events.jsonl``:

================================  ======================  =====================================
Trainer hook                      event                   data
================================  ======================  =====================================
``on_train_begin`` (fresh)        ``run.started``         config digest, model/tokenizer paths,
                                                          world size, versions
``on_train_begin`` (resumed)      ``run.resumed``         ``from_step``, ``checkpoint``,
                                                          ``verification``, ``verified``
``on_log``                        ``step.completed``      mapped metric names, Warden aliases,
                                                          ``hf_logs`` (the original dict)
``on_save``                       ``checkpoint.saved``    ``path`` of ``checkpoint-{global_step}``,
                                                          ``root_digest``, ``file_count``
``on_step_end``                   ``reward.snapshot``     the step's best ``top_k`` samples recorded
                                                          with :meth:`WardenCallback.record_samples`
                                                          (only when some were; the typed
                                                          :class:`warden.payloads.RewardSnapshot`)
``on_train_end``                  ``run.finished``        status, last step, the train summary
================================  ======================  =====================================

``root_digest``/``file_count`` are the model_signing manifest root of the directory as the
callback hashes it right after the save (one extra read of the checkpoint, in the training
process; ``announce_digest=False`` leaves them out): the signer signs only those bytes.
They say what the directory held when the callback read it, not that the Trainer wrote it:
bytes changed between ``save_model`` and the hash are announced as if they were the
Trainer's (see docs/threat-model.md).

Under ``torchrun`` rank 0's ``on_save`` fires as soon as rank 0 finished its own part of the
save; the other ranks may still be writing their ``rng_state_{rank}.pth`` (and, with FSDP or
DeepSpeed, their shards). Before announcing, the callback waits until every rank's
``rng_state_{rank}.pth`` is there and nothing in the directory changed for
``settle_seconds`` (2), at most ``rank_wait_seconds`` (600); past that it writes
``checkpoint.saved`` with ``complete: false`` and ``waiting_for``, no digest, and the signer
signs nothing from that event (a watched root still signs it once complete and stable).

HF rotates checkpoints (``save_total_limit``) *before* ``on_save``, and a sidecar can be
behind: the signer treats a checkpoint that vanished before it was hashed as counted,
not as an error. A journal write failure is logged and never stops training unless
``strict=True``. Run directory: ``run_dir``, else ``$WARDEN_RUN_DIR``, else the
Trainer's ``output_dir``; run id: ``run_id``, else the journal's, else ``$WARDEN_RUN_ID``,
else a new one: the run directory's name, the UTC time and a random suffix
(``sft-1-20260102-030405-a1b2c3``), so two runs whose run directories share a name get two ids;
a resumed run keeps the id its journal holds.

``metrics_port`` (0, the default: off) serves ``/metrics`` on rank 0 with Warden's trainer's
families (:class:`trainer.metrics.TrainerMetrics`: ``warden_trainer_steps_total``,
``_last_step``, ``_reward_mean``, ``_kl``, ``_last_checkpoint_step``, ...; see
:mod:`trainer.integrations.hf_audit`) from ``on_train_begin`` to ``on_train_end``, so the
trainer alerts of ``alerts/rules/trainer.yml`` apply to HF runs.

Resume is verified: ``on_train_begin`` of a resumed run checks the checkpoint HF resumed from
(:func:`trainer.integrations.hf_resume.verify_hf_checkpoint`: the signature by ``trusted_keys``,
the signed run id and step, every file's bytes) and raises :class:`HFResumeRefused` before the
first step when it does not verify, or when no ``trusted_keys`` were given; ``verify_resume=False``
resumes unverified, and ``run.resumed`` says so. HF has loaded the weights by then, so pick the
checkpoint with :func:`trainer.integrations.hf_resume.warden_resume_checkpoint` before ``train()``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import os
import platform
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainer.integrations.hf_audit import DEFAULT_TOP_K, MAX_TEXT_CHARS, HFMetrics, SampleBuffer
from warden import journal as ev
from warden.errors import WardenError, quote_untrusted
from warden.ledger import read_ledger, reconcile
from warden.metric_names import HF_ALIASES, map_metrics, warden_aliases
from warden.payloads import CheckpointPruned, CheckpointSaved, RewardSnapshot, RunResumed, RunStarted, top_samples
from warden.runid import journal_run_id, new_genesis_nonce, sanitize_run_id
from warden.signing.manifest import DEFAULT_IGNORE_PATHS, Announced, announce_tree
from warden.stability import Stability, tree_state

log = logging.getLogger("warden.hf")
SOURCE = "hf"
HF_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")
SUMMARY_KEY = "train_runtime"  # present only in the Trainer's final summary log


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` with NaN/inf as None, tensors and numpy scalars as numbers, unknown objects as text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth < 8 and isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if depth < 8 and isinstance(value, list | tuple):
        return [json_safe(v, depth + 1) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return json_safe(item(), depth + 1)
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def step_payload(logs: dict[str, Any]) -> dict[str, Any]:
    """``step.completed`` data: mapped names, the Warden trainer's aliases, the original logs."""
    safe = json_safe(logs)
    data: dict[str, Any] = dict(map_metrics(safe).values)
    for alias, value in warden_aliases(safe, HF_ALIASES).items():
        data.setdefault(alias, value)
    data["source"] = SOURCE
    data["kind"] = "eval" if any(str(k).startswith("eval_") for k in logs) else "train"
    data["hf_logs"] = safe
    return data


def output_dir(args: TrainingArguments) -> str:
    """The Trainer's output directory, absolute (HF's default name when unset)."""
    return os.path.abspath(args.output_dir or "trainer_output")


def hf_checkpoint_steps(root: str) -> set[int]:
    """Steps of the ``checkpoint-N`` directories (not links) under ``root``."""
    steps = set()
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                step = step_of_checkpoint(entry.name)
                if step is not None and entry.is_dir(follow_symlinks=False):
                    steps.add(step)
    except OSError:
        return set()
    return steps


def step_of_checkpoint(name: str | None) -> int | None:
    """The step of ``checkpoint-N`` (exactly that spelling: no leading zeros, nothing after)."""
    base = os.path.basename(os.path.normpath(name)) if name else ""
    match = HF_CHECKPOINT.fullmatch(base)
    step = int(match.group(1)) if match else None
    return step if step is not None and base == f"checkpoint-{step}" else None


def new_run_id(run_dir: str) -> str:
    """A new run id: the run directory's name, the UTC time and a random suffix (as the verl
    bridge derives its ids), valid per :func:`warden.runid.sanitize_run_id`."""
    name = sanitize_run_id(os.path.basename(os.path.abspath(run_dir)), "hf-run")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return sanitize_run_id(f"{name[:100]}-{stamp}-{secrets.token_hex(3)}", "hf-run")


def resolve_run_id(journal_path: str, run_dir: str, explicit: str | None = None, *, mint: bool = True) -> str | None:
    """``explicit``, else the journal's run id (a resumed run keeps its id), else ``$WARDEN_RUN_ID``,
    else a new one (None with ``mint=False``)."""
    found = explicit or journal_run_id(journal_path) or os.environ.get("WARDEN_RUN_ID")
    return found or (new_run_id(run_dir) if mint else None)


def journal_writer(run_dir: str, run_id: str | None = None) -> ev.EventWriter:
    """The writer of ``<run_dir>/events.jsonl`` under :func:`resolve_run_id`'s id (the directory made)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, ev.JOURNAL_NAME)
    return ev.EventWriter(path, str(resolve_run_id(path, run_dir, run_id)))


def resumed_checkpoint(args: TrainingArguments, state: TrainerState) -> str | None:
    """The checkpoint HF resumed from, seen from ``on_train_begin``.

    transformers (5.x) passes callbacks no path: ``state`` holds the resumed ``trainer_state.json``
    (``global_step``) and ``args.resume_from_checkpoint`` is not what ``train()`` was given. The path
    is the ``resume_from_checkpoint`` local of ``Trainer._inner_training_loop`` (what HF loaded,
    ``True`` already resolved to a directory), found by walking up the calling frames; where that
    is not found, ``<output_dir>/checkpoint-{global_step}`` if it exists. None: not a resume.
    """
    frame = inspect.currentframe()
    try:
        depth = 0
        while frame is not None and depth < 16:
            if frame.f_code.co_name == "_inner_training_loop" and "resume_from_checkpoint" in frame.f_locals:
                value = frame.f_locals["resume_from_checkpoint"]
                return os.path.abspath(value) if isinstance(value, str | os.PathLike) and value else None
            frame, depth = frame.f_back, depth + 1
    finally:
        del frame
    if state.global_step <= 0:
        return None
    guess = os.path.join(output_dir(args), f"checkpoint-{state.global_step}")
    return guess if os.path.isdir(guess) else None


def rotation_removed(before: list[int], limit: int | None, best: int | None) -> set[int]:
    """The steps HF's ``rotate_checkpoints`` deletes from the checkpoint steps ``before`` it (sorted):
    the oldest, keeping ``save_total_limit``, the newest and the best model's. Pure."""
    if not limit or limit <= 0 or len(before) <= limit:
        return set()
    protected = {before[-1], *([best] if best is not None else [])}
    keep = max(limit, len(protected))
    deletable = [s for s in before if s not in protected]
    return set(deletable[: max(0, len(before) - keep)])


def checkpoint_digest(path: str) -> Announced | None:
    """The root digest and file count of ``path`` as the signer would sign it; None if it cannot be hashed.

    A symlink or special file inside (which the signer refuses anyway) or a file deleted
    meanwhile yields None: the signer then signs nothing without a matching stable state.
    """
    try:
        announced = announce_tree(path, DEFAULT_IGNORE_PATHS)
    except (WardenError, OSError) as exc:
        log.warning("warden: %s: no root digest announced: %s", path, str(exc)[:300])
        return None
    return announced


def rank_files(world_size: int, save_only_model: bool) -> list[str]:
    """The files every rank writes into a checkpoint itself: ``rng_state_{rank}.pth`` under
    ``torchrun`` with more than one process (rank 0's ``on_save`` may fire before they exist);
    none for one process or ``save_only_model``."""
    if world_size <= 1 or save_only_model:
        return []
    return [f"rng_state_{rank}.pth" for rank in range(world_size)]


def missing_files(present: Iterable[str], expected: Iterable[str]) -> list[str]:
    """The names of ``expected`` not in ``present``, in order."""
    have = set(present)
    return [name for name in expected if name not in have]


def wait_until_complete(
    path: str,
    expected: list[str],
    settle_seconds: float,
    timeout_seconds: float,
    poll_seconds: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], object] = time.sleep,
) -> list[str]:
    """Waits until every name of ``expected`` is in ``path`` and no entry changed for
    ``settle_seconds`` (other ranks' optimizer shards, a late flush); at most ``timeout_seconds``.

    Returns what was still missing or changing when time ran out ([] when complete).
    """
    stability = Stability()
    deadline = clock() + timeout_seconds
    while True:
        now = clock()
        tree = tree_state(path)
        if tree is None:
            return [f"{path} (gone)"]
        names = {os.path.relpath(entry[0], path) for entry in tree.fingerprint}
        missing = missing_files(names, expected)
        quiet = stability.quiet_for(path, tree.fingerprint, now, now)  # as seen here: files were just written
        if not missing and quiet >= settle_seconds:
            return []
        if now >= deadline:
            return missing or [f"{path} (still changing)"]
        pause(poll_seconds)


def _finite(value: Any) -> float | None:
    """A reward as a finite float; None for TRL's None (not scored), NaN, infinities and non-numbers."""
    item = getattr(value, "item", None)
    if callable(item):
        value = item()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from warden import __version__

    return {
        "warden": __version__,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "transformers": transformers.__version__,
        **_trl_version(),
    }


def _trl_version() -> dict[str, str]:
    """``{"trl": version}`` when TRL is imported (the run uses one of its trainers), else nothing."""
    trl = sys.modules.get("trl")
    version = getattr(trl, "__version__", None)
    return {"trl": str(version)} if version else {}


class WardenCallback(TrainerCallback):  # type: ignore[misc]
    """Writes the Warden journal from Trainer hooks; see the module docstring."""

    def __init__(
        self,
        run_dir: str | None = None,
        run_id: str | None = None,
        *,
        strict: bool = False,
        announce_digest: bool = True,
        rank_wait_seconds: float = 600.0,
        settle_seconds: float = 2.0,
        trusted_keys: Any = None,
        verify_resume: bool = True,
        top_k: int = DEFAULT_TOP_K,
        min_reward: float | None = None,
        max_text_chars: int = MAX_TEXT_CHARS,
        metrics_port: int = 0,
        metrics_listen: str = "127.0.0.1",
    ) -> None:
        if top_k < 0 or max_text_chars < 1 or not 0 <= metrics_port <= 65535:
            raise ValueError("WardenCallback: top_k >= 0, max_text_chars >= 1 and 0 <= metrics_port <= 65535")
        self.top_k, self.min_reward, self.max_text_chars = top_k, min_reward, max_text_chars
        self.metrics = HFMetrics(metrics_port, metrics_listen)
        self._samples = SampleBuffer()
        self._is_zero = True  # until a hook says otherwise
        self.trusted_keys = trusted_keys
        self.verify_resume = verify_resume
        self.run_dir = run_dir
        self.run_id = run_id
        self.strict = strict
        self.announce_digest = announce_digest
        self.rank_wait_seconds = rank_wait_seconds
        self.settle_seconds = settle_seconds
        self._writer: ev.EventWriter | None = None
        self._summary: dict[str, Any] | None = None

    # -- the journal ------------------------------------------------------------------------
    def resolve_run_dir(self, args: TrainingArguments) -> str:
        return os.path.abspath(self.run_dir or os.environ.get("WARDEN_RUN_DIR") or output_dir(args))

    def _journal(self, args: TrainingArguments) -> ev.EventWriter:
        if self._writer is None:
            self._writer = journal_writer(self.resolve_run_dir(args), self.run_id)
        return self._writer

    def _run_id_to_match(self, args: TrainingArguments, state: TrainerState) -> str | None:
        """The run id a resumed checkpoint must be signed for: the journal's (rank 0 opens it;
        the other ranks read it, and mint nothing)."""
        if state.is_world_process_zero:
            try:
                return self._journal(args).run_id
            except (OSError, ev.JournalError) as exc:
                log.error("warden: cannot open the journal: %s", exc)
        run_dir = self.resolve_run_dir(args)
        return resolve_run_id(os.path.join(run_dir, ev.JOURNAL_NAME), run_dir, self.run_id, mint=False)

    def _genesis_nonce(self, args: TrainingArguments) -> str | None:
        """The run's genesis nonce: the first run.started's in the journal, else a new one."""
        try:
            writer = self._journal(args)
            return read_ledger(writer.path, writer.run_id).genesis_nonce or new_genesis_nonce()
        except (OSError, ev.JournalError) as exc:
            log.error("warden: no genesis nonce (%s)", exc)
            return None

    def emit(
        self, args: TrainingArguments, state: TrainerState, etype: str, data: dict[str, Any], step: int | None
    ) -> ev.Event | None:
        """Appends one event on the world's process zero; None elsewhere or after a logged failure."""
        if not state.is_world_process_zero:
            return None
        try:
            return self._journal(args).emit(etype, data, step=step)
        except (OSError, ev.JournalError) as exc:
            if self.strict:
                raise
            log.error("warden: could not write %s at step %s: %s", etype, step, exc)
            return None

    # -- hooks --------------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._summary = None
        self._is_zero = bool(state.is_world_process_zero)
        self._samples.clear()
        checkpoint = resumed_checkpoint(args, state)
        if checkpoint is not None or state.global_step > 0:
            verification = self._verify_resume(args, state, checkpoint)
            resumed = RunResumed(
                source=SOURCE,
                genesis_nonce=self._genesis_nonce(args),
                from_step=state.global_step,
                checkpoint=checkpoint,
                verification=verification,
                extra={"verified": self.verify_resume},
            )
            self.emit(args, state, resumed.TYPE, resumed.to_data(), state.global_step)
            self._start_metrics(args, state)
            return
        model, tokenizer = kwargs.get("model"), kwargs.get("processing_class") or kwargs.get("tokenizer")
        started = RunStarted(
            source=SOURCE,
            genesis_nonce=self._genesis_nonce(args),
            config_digest=hashlib.sha256(args.to_json_string().encode("utf-8")).hexdigest(),
            model_path=getattr(model, "name_or_path", None) or None,
            tokenizer_path=getattr(tokenizer, "name_or_path", None) or None,
            world_size=args.world_size,
            versions=_versions(),
            extra={"max_steps": state.max_steps, "output_dir": output_dir(args)},
        )
        self.emit(args, state, started.TYPE, started.to_data(), None)
        self._start_metrics(args, state)

    def _start_metrics(self, args: TrainingArguments, state: TrainerState) -> None:
        """``/metrics`` on rank 0 (``metrics_port``; 0: not served), ``warden_trainer_run_info`` set."""
        if not state.is_world_process_zero:
            return
        writer = self._writer_or_none(args, state)
        self.metrics.start(writer.run_id if writer is not None else self.run_id, _versions())

    # -- reward snapshots ---------------------------------------------------------------------
    def record_samples(self, prompts: Iterable[Any], responses: Iterable[Any], rewards: Iterable[Any]) -> int:
        """Records scored samples of the current optimizer step; returns how many were taken.

        Call it with each batch the step scores (equally long sequences: prompts and responses
        as text, or chats as lists of ``{"content": ...}``; rewards as numbers, tensors' elements
        or numpy scalars). Several calls in one step add up (gradient accumulation; ``index``
        continues). At ``on_step_end`` the callback writes one ``reward.snapshot`` for the step
        (the best ``top_k`` at or above ``min_reward``, texts cut to ``max_text_chars``) and
        sets ``warden_trainer_reward_mean``/``_max`` from all of them. On other ranks than the
        world's process zero it keeps nothing (returns 0).
        """
        if not self._is_zero:
            return 0
        return self._samples.add(prompts, responses, rewards)

    def reward_function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a TRL reward function: ``fn(prompts=, completions=, **kw) -> list of float``)
        wrapped so that what it scores is recorded with :meth:`record_samples`; the trainer's only
        reward function (with several, wrap them together with :meth:`reward_functions`)."""
        return self.reward_functions([fn])[0]

    def reward_functions(
        self, fns: Iterable[Callable[..., Any]], weights: Iterable[float] | None = None
    ) -> list[Callable[..., Any]]:
        """TRL ``reward_funcs`` wrapped together: each scored batch is recorded once, with the reward
        TRL's GRPO trainer combines from them (``multi_objective_aggregation`` "sum_then_normalize",
        the default, before normalising): the ``weights``-weighted sum (``args.reward_weights``;
        default all 1) of the finite rewards, NaN (left out of the snapshot) where every function
        returned None. Pass the list as ``reward_funcs`` (the same order, sync functions).

        TRL calls the functions one after another with the same ``completions`` list; the batch is
        recorded when the last one returned. A batch where a function raised is never recorded.
        """
        funcs = list(fns)
        factors = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
        if not funcs or len(factors) != len(funcs):
            raise ValueError(f"reward_functions: {len(funcs)} functions and {len(factors)} weights")
        pending: dict[int, list[Any]] = {}
        batch: list[Any] = [None]  # identity of the completions list being scored

        def combine(outputs: dict[int, list[Any]]) -> list[float]:
            rows = zip(*(outputs[i] for i in range(len(funcs))), strict=True)
            combined = []
            for row in rows:
                scored = [(w, _finite(r)) for w, r in zip(factors, row, strict=True)]
                finite = [w * r for w, r in scored if r is not None]
                combined.append(math.fsum(finite) if finite else math.nan)
            return combined

        def wrap(position: int, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)  # TRL logs rewards/<__name__>
            def scored(*args: Any, **kwargs: Any) -> Any:
                prompts, completions = kwargs.get("prompts"), kwargs.get("completions")
                if batch[0] is not completions:
                    pending.clear()  # a new batch (or the last one failed half-way)
                    batch[0] = completions
                rewards = fn(*args, **kwargs)
                if prompts is None or completions is None or rewards is None:
                    return rewards
                pending[position] = list(rewards)
                if len(pending) == len(funcs):
                    try:
                        self.record_samples(prompts, completions, combine(pending))
                    finally:
                        pending.clear()
                        batch[0] = None
                return rewards

            return scored

        return [wrap(i, fn) for i, fn in enumerate(funcs)]

    def record_oom(self, phase: str = "step") -> None:
        """Counts an out-of-memory error in ``warden_trainer_oom_events_total{phase}``: HF has no
        hook for errors, so a script that catches ``torch.OutOfMemoryError`` calls this."""
        self.metrics.oom(phase)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero:
            self.metrics.step_begun()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Once per optimizer step: the step's ``reward.snapshot`` (when samples were recorded) and
        the step metrics."""
        self._is_zero = bool(state.is_world_process_zero)
        try:
            if not self._is_zero:
                return
            self.metrics.step_done(state.global_step, self._samples)
            if not len(self._samples) or self.top_k <= 0:
                return
            buf = self._samples
            samples = top_samples(
                buf.prompts, buf.responses, buf.rewards, self.top_k, self.min_reward, self.max_text_chars
            )
            payload = RewardSnapshot(samples=tuple(samples), k=self.top_k, min_reward=self.min_reward, source=SOURCE)
            self.emit(args, state, payload.TYPE, payload.to_data(), state.global_step)
        finally:
            self._samples.clear()

    def _verify_resume(self, args: TrainingArguments, state: TrainerState, checkpoint: str | None) -> str:
        """How the resumed checkpoint was verified; raises HFResumeRefused (after journalling
        ``checkpoint.rejected``) when it does not verify, unless ``verify_resume=False``."""
        from trainer.integrations.hf_resume import (
            HFResumeRefused,
            journal_rejection,
            load_trusted,
            verify_hf_checkpoint,
        )
        from trainer.verified_load import CheckpointRejected

        if not self.verify_resume:
            log.warning("warden: resuming from %s unverified (verify_resume=False)", checkpoint)
            return "skipped: verify_resume=False"
        path = checkpoint or os.path.join(output_dir(args), f"checkpoint-{state.global_step}")
        try:
            if checkpoint is None:
                raise CheckpointRejected(f"resumed at step {state.global_step}, but HF's checkpoint was not found")
            if self.trusted_keys is None:
                raise CheckpointRejected(
                    "no trusted_keys to verify it with (pass trusted_keys=, or verify_resume=False to "
                    "resume unverified)"
                )
            trusted = load_trusted(self.trusted_keys)
            verified = verify_hf_checkpoint(checkpoint, trusted, self._run_id_to_match(args, state))
            if verified.step != state.global_step:
                raise CheckpointRejected(f"signed step {verified.step}, but HF resumed at step {state.global_step}")
        except CheckpointRejected as exc:
            writer = self._writer_or_none(args, state)
            journal_rejection(writer, path, step_of_checkpoint(path), exc.reason, resumed_by="hf")
            self.close()
            raise HFResumeRefused(
                f"refusing to train on from {path}: {exc.reason}. Resume with the path "
                "warden_resume_checkpoint() returns, or pass verify_resume=False to resume unverified",
                (path,),
            ) from None
        return verified.how

    def _writer_or_none(self, args: TrainingArguments, state: TrainerState) -> ev.EventWriter | None:
        if not state.is_world_process_zero:
            return None
        try:
            return self._journal(args)
        except (OSError, ev.JournalError) as exc:
            log.error("warden: cannot open the journal: %s", exc)
            return None

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs:
            return
        if SUMMARY_KEY in logs:
            self._summary = json_safe(logs)
            return
        if state.is_world_process_zero:
            self.metrics.logged(json_safe(logs))
        self.emit(args, state, ev.STEP_COMPLETED, step_payload(logs), state.global_step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        root = output_dir(args)
        path = os.path.join(root, f"checkpoint-{state.global_step}")
        if state.is_world_process_zero and not os.path.isdir(path):
            log.warning("warden: %s is not there after on_save; no checkpoint.saved written", path)
            return
        saved = CheckpointSaved(source=SOURCE, path=path, root=root, layout="hf")
        if not state.is_world_process_zero:
            return
        expected = rank_files(args.world_size, bool(getattr(args, "save_only_model", False)))
        if expected:
            waiting = wait_until_complete(path, expected, self.settle_seconds, self.rank_wait_seconds)
            saved = replace(saved, world_size=args.world_size)
            if waiting:
                log.error(
                    "warden: %s: still waiting for %s after %.0fs; announced as incomplete (the signer will not "
                    "sign from this event)",
                    path,
                    ", ".join(waiting[:8]),
                    self.rank_wait_seconds,
                )
                saved = replace(saved, complete=False, waiting_for=tuple(waiting[:32]))
                self.emit(args, state, saved.TYPE, saved.to_data(), state.global_step)
                return
        if self.announce_digest:
            saved = saved.with_announced(checkpoint_digest(path))
        self.emit(args, state, saved.TYPE, saved.to_data(), state.global_step)
        self.metrics.checkpoint_done(state.global_step)
        try:
            self._account_for_rotation(args, state, root)
        except (OSError, ev.JournalError) as exc:
            log.error("warden: could not account for HF's checkpoint rotation: %s", exc)

    def _account_for_rotation(self, args: TrainingArguments, state: TrainerState, root: str) -> None:
        """``checkpoint.pruned`` for the announced checkpoints HF's rotation removed before this
        ``on_save`` (it rotates first); a checkpoint gone that the rule does not explain gets no such
        event, so the signer's reconciliation with the journal reports it as a violation."""
        writer = self._journal(args)
        ledger = read_ledger(writer.path, writer.run_id)
        on_disk = hf_checkpoint_steps(root)
        gone = {a.step for a in reconcile(ledger, on_disk).missing}
        if not gone:
            return
        best = step_of_checkpoint(getattr(state, "best_model_checkpoint", None))
        # The rule is applied to the checkpoints the journal announced only: a directory someone else
        # planted under the output dir is no checkpoint, so it can never explain a deletion.
        known = sorted(set(ledger.live))
        explained = rotation_removed(known, getattr(args, "save_total_limit", None), best)
        for step in sorted(gone):
            announced = ledger.live[step]
            if step not in explained:
                log.error(
                    "warden: %s is gone and HF's rotation does not explain it; not announced as pruned",
                    quote_untrusted(announced.path),
                )
                continue
            pruned = CheckpointPruned(
                path=announced.path,
                step=step,
                reason=f"save_total_limit {args.save_total_limit}",
                root_digest=announced.root_digest,
                source=SOURCE,
            )
            self.emit(args, state, pruned.TYPE, pruned.to_data(), step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        data = {
            "source": SOURCE,
            "status": "completed",
            "error": None,
            "last_step": state.global_step,
            "summary": self._summary,
        }
        self.emit(args, state, ev.RUN_FINISHED, data, state.global_step)
        self.close()

    def close(self) -> None:
        """Closes the journal (it is reopened if training starts again) and stops ``/metrics``."""
        self.metrics.stop()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
