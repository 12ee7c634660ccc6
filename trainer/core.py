"""The PPO trainer: builds everything from a config, trains, checkpoints, resumes, reports.

Python API::

    from trainer.config import load_config
    from trainer.core import PPOTrainer
    trainer = PPOTrainer(load_config("trainer/configs/demo.yaml"), run_dir="/tmp/run")
    trainer.train(max_steps=2)
    trainer.close()

A step is five phases, one method each (:meth:`PPOTrainer.train_step`): rollout (each
data-parallel rank generates its share of the batch; the shares are gathered), score (each
rank scores its share), experience (log-probs, values, advantages), update, bookkeeping
(metrics, events, snapshots). Test hooks run before the step, outside it. What a checkpoint
holds and how it is restored lives in :mod:`trainer.train_state`.

Only rank 0 writes events, checkpoints and serves /metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer import checkpoint as ckpt
from trainer import elastic, fsdp, lora, space
from trainer.algorithm import Experience, Precision, Trainables, make_experience, ppo_update
from trainer.config import TrainerConfig
from trainer.data import PromptRow, PromptSampler, batch_digest, encode_prompts, left_pad, load_prompts
from trainer.distributed import (
    DistInfo,
    all_gather_objects,
    all_gather_rows,
    barrier,
    broadcast_object,
    init_distributed,
    pick_device,
    pin_gpus,
    rank_slice,
    shutdown,
)
from trainer.metrics import TrainerMetrics
from trainer.models import DTYPES, load_causal_lm, load_critic, unwrap
from trainer.resume import ResumeResult, find_resume_point
from trainer.rewards import RewardSources, build_reward
from trainer.rollout import SamplingPlan, build_rollout
from trainer.rollout_split import rollout_layout
from trainer.rollout_vllm import RolloutCollector, SchedulerState
from trainer.saver import CheckpointSaver, SaveTiming
from trainer.setup import ResolvedPaths, check_environment, resolve_paths
from trainer.staging import HostArena, HostMemoryError, available_host_bytes, reserve_arena
from trainer.tokenizer import load_tokenizer
from trainer.train_state import capture_rng, estimate_state_bytes, fill_checkpoint, restore_rng, seed_everything
from warden import journal as ev
from warden.errors import ConfigError, IncompleteError, ViolationError, quote_untrusted
from warden.ledger import read_ledger
from warden.payloads import (
    CheckpointPruned,
    CheckpointRejection,
    CheckpointSaved,
    CheckpointSkipped,
    RewardSnapshot,
    RunResumed,
    RunStarted,
    top_samples,
)
from warden.runid import journal_run_id, new_genesis_nonce

__all__ = ["PPOTrainer", "StepResult", "TrainingFailed", "capture_rng", "restore_rng"]

log = logging.getLogger("warden.trainer")


class TrainingFailed(IncompleteError):
    """Training stopped on an error that the config says is fatal (an OOM with oom.action=fail)."""


class NoSpaceForCheckpoint(ViolationError):
    """``checkpoint.on_no_space: fail`` and the next checkpoint would not fit (exit 1, the run stops)."""


STAGING_SLACK_BYTES = 16 << 20
"""Host buffer beyond the state's estimate: RNG state, step counters, anything small besides weights and moments."""
SPACE_MARGIN_BYTES = 64 << 20
"""Free bytes a save must leave beyond the checkpoint itself (the journal, logs, the filesystem's own)."""


@dataclass
class StepResult:
    step: int
    metrics: dict[str, Any]


def _versions() -> dict[str, str]:
    import transformers

    from warden import __version__

    return {
        "warden": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


@dataclass
class Batch:
    """One step's prompts, ``rollout.n`` copies each: every list has B = train_batch_size x n entries."""

    rows: list[PromptRow]
    ids: list[list[int]]
    groups: torch.Tensor  # (B,) prompt index within the step
    index: tuple[int, ...] = ()  # the sampler's prompt indices (train_batch_size of them, before the n copies)

    @property
    def prompts(self) -> list[str]:
        return [r.prompt for r in self.rows]


@dataclass
class Rollout:
    """The whole batch's prompts and responses (gathered from every rank) and its texts."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor
    responses: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T)
    texts: list[str]
    seconds: float  # generation (and the gather)
    decode_seconds: float = 0.0
    local_seconds: float = 0.0  # this rank's own generation, before waiting for the others


@dataclass
class Scored:
    scores: torch.Tensor  # (B,) float32 on the device
    parts: dict[str, torch.Tensor]  # per reward function, (B,), when there are several
    seconds: float
    local_seconds: float = 0.0  # this rank's own scoring, before waiting for the others


def response_length_stats(mask: torch.Tensor, stop_ids: tuple[int, ...], responses: torch.Tensor) -> dict[str, float]:
    """verl's ``response_length/{mean,max,min,clip_ratio}``: clipped = full length without a stop token. Pure."""
    lengths = mask.sum(dim=1).float()
    stopped = torch.isin(responses, torch.tensor(stop_ids, device=responses.device)) & mask.bool()
    clipped = (lengths == mask.shape[1]) & ~stopped.any(dim=1)
    return {
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float(clipped.float().mean()),
    }


def verl_names(m: dict[str, Any]) -> dict[str, Any]:
    """The step's metrics under verl's names (``actor/pg_loss``, ``critic/score/mean``, ``timing_s/gen``...). Pure."""
    t = m["timings"]
    pairs = {
        "critic/score/mean": m["reward_mean"],
        "critic/score/max": m["reward_max"],
        "critic/score/min": m["reward_min"],
        "critic/rewards/mean": m["reward_mean"],
        "actor/pg_loss": m["policy_loss"],
        "actor/pg_clipfrac": m["clip_fraction"],
        "actor/pg_clipfrac_lower": m["clip_fraction_lower"],
        "actor/ppo_kl": m["approx_kl"],
        "actor/entropy": m["entropy"],
        "actor/grad_norm": m["grad_norm"],
        "actor/lr": m["lr"],
        "actor/reward_kl_penalty": m["kl"],
        "actor/reward_kl_penalty_coeff": m["kl_coef"],
        "timing_s/gen": t["rollout_s"],
        "timing_s/reward": t["reward_s"],
        "timing_s/old_log_prob": t["experience_s"],
        "timing_s/update_actor": t["update_s"],
        "timing_s/step": t["step_s"],
        "perf/throughput": m["tokens_per_second"],
    }
    if "kl_loss" in m:
        pairs["actor/kl_loss"] = m["kl_loss"]
    if "value_loss" in m:
        pairs["critic/vf_loss"] = m["value_loss"]
        pairs["critic/vf_clipfrac"] = m["vf_clip_fraction"]
    return pairs


class PPOTrainer:
    """One run. ``resume`` is ``auto``, ``never`` or a checkpoint path; ``resume_with_changes``
    lets a resume apply a changed config (see :mod:`trainer.train_state`); ``resume_past_missing``
    lets ``auto`` go on although announced checkpoints are gone (see :mod:`trainer.resume`)."""

    def __init__(
        self,
        cfg: TrainerConfig,
        run_dir: str,
        *,
        resume: str = "auto",
        config_name: str = "run",
        emit_events: bool = True,
        serve_metrics: bool = True,
        instrumented: bool = True,
        resume_with_changes: bool = False,
        resume_past_missing: bool = False,
    ) -> None:
        self.cfg = cfg
        self.resume_past_missing = resume_past_missing
        self.instrumented = instrumented  # False: no events, metrics or snapshots per step (benchmarks)
        self.resume_with_changes = resume_with_changes
        self.config_changes: list[str] = []
        self.skipped_updates = 0
        self.run_dir = os.path.abspath(run_dir)
        pin_gpus(cfg.run.gpu_uuids)
        self.dist: DistInfo = init_distributed(cfg.run.device)
        from trainer.config import validate

        validate(cfg, "<config>", self.dist.world_size)
        self.nccl_env = check_environment(cfg.preflight)
        self.device = pick_device(cfg.run.device, self.dist)
        if cfg.run.torch_threads:
            torch.set_num_threads(cfg.run.torch_threads)
        self.paths: ResolvedPaths = resolve_paths(cfg, self.run_dir)
        # Not writable by others whatever the umask: sidecars refuse a journal others can write.
        os.makedirs(self.run_dir, mode=0o755, exist_ok=True)
        self.metrics = TrainerMetrics()
        self._announced_digests: dict[str, str] = {}  # path -> root digest, for checkpoint.pruned
        # Steps this run announced and has not retired: the only ones retention counts or removes.
        self._live_steps: set[int] = set()
        self.metrics.world_size.set(self.dist.world_size)
        self.metrics.restart_count.set(elastic.restart_count(os.environ) or 0)
        self.journal: ev.EventWriter | None = None
        journal_path = os.path.join(self.run_dir, ev.JOURNAL_NAME)
        self.run_id = cfg.run.run_id or journal_run_id(journal_path) or _new_run_id(config_name)
        # Rank 0's: another rank may look before the journal exists, or a second later (the id has the time).
        self.run_id = str(broadcast_object(self.run_id, self.dist))
        if self.dist.is_main and emit_events:
            self.journal = ev.EventWriter(journal_path, self.run_id)
        seed_everything(cfg.run.seed)
        self._build_models()
        self._build_data()
        self.step = 0
        self.phase = "rollout"
        self._oom_hook_fired = False
        self.resumed: ResumeResult | None = None
        self.genesis_nonce: str | None = None  # set by a resume from the checkpoint, else in _announce
        self.checkpoint_world_size: int | None = None  # set by a resume: the world size that wrote it
        self._state_bytes = estimate_state_bytes(self)
        self.saver = self._build_saver()
        self._announce(resume)
        self._server = self._serve_metrics() if serve_metrics and self.dist.is_main else None

    # -- construction ------------------------------------------------------------------
    def emit(self, etype: str, data: dict[str, Any], step: int | None = None) -> None:
        if self.journal is not None:
            self.journal.emit(etype, data, step=step)

    @property
    def has_critic(self) -> bool:
        return self.cfg.algorithm.adv_estimator != "grpo"

    def _build_models(self) -> None:
        cfg, paths = self.cfg, self.paths
        self.emit(ev.MODEL_LOADING, {"path": paths.tokenizer, "kind": "tokenizer"})
        self.tokenizer = load_tokenizer(paths.tokenizer, cfg.model.allowed_tokenizer_classes)
        self.tokenizer.padding_side = "left"
        lora_cfg = cfg.model.lora
        shared_critic = lora_cfg is not None and lora_cfg.critic == "shared" and self.has_critic
        kinds = [("actor", paths.actor)] + [("reference", paths.actor)] * (lora_cfg is None)
        kinds += [("critic", paths.critic)] * (self.has_critic and not shared_critic)
        for kind, path in kinds:
            self.emit(ev.MODEL_LOADING, {"path": path, "kind": kind})
        compute = DTYPES[cfg.model.dtype] if cfg.model.dtype != "float32" else None
        self.precision = Precision(self.device.type, compute)
        self.lora: lora.LoraModels | None = None
        self.critic: Any = None
        self.rollout: Any = None
        if lora_cfg is not None:
            # One base in the run's dtype with float32 adapters; the reference is that base, adapters off.
            self.lora = lora.build(paths.actor, cfg, self.device, shared_critic)
            self.actor = self.lora.peft
            self.ref: Any = lora.ReferencePolicy(self.lora)
            if shared_critic:
                self.critic = lora.SharedCritic(self.lora, lora.hidden_size(self.lora), self.device)
        else:
            # float32 master weights for what is trained; the frozen reference computes in the run's dtype
            self.actor = load_causal_lm(paths.actor, "float32", self.device)
            self.ref = load_causal_lm(paths.actor, cfg.model.dtype, self.device).eval().requires_grad_(False)
        if self.has_critic and self.critic is None:
            self.critic = load_critic(paths.critic, "float32", self.device)
        self.actor.config.use_cache = True
        self.stop_ids = stop_token_ids(self.tokenizer.eos_token_id, cfg.rollout.stop_token_ids)
        self._place_models(compute)
        self._build_optimizers()
        if not self.sharded:
            if cfg.rollout.devices:  # the engine in its own process on its own devices (trainer/rollout_split.py)
                from trainer.rollout_split import SplitRollout

                self.rollout = SplitRollout(
                    cfg, unwrap(self.actor), paths.actor, self.stop_ids, self.tokenizer.pad_token_id
                )
            else:
                self.rollout = build_rollout(  # LoRA: sampled from the adapted base itself, never a copy of it
                    cfg,
                    unwrap(self.actor),
                    paths.actor,
                    self.stop_ids,
                    self.tokenizer.pad_token_id,
                    compute if self.lora is None else None,
                )
        if getattr(self.rollout, "static", False):
            log.info(
                "rollout: static KV cache with the compiled forward, prompts padded to %d tokens",
                cfg.data.max_prompt_tokens,
            )
        # warden_rollout_*: the vLLM scheduler's state at scrape time (zeros for the HF engine).
        self.metrics.registry.register(RolloutCollector(lambda: getattr(self.rollout, "scheduler", SchedulerState())))
        self.reward = build_reward(cfg.reward, self._reward_sources())

    def _place_models(self, compute: torch.dtype | None) -> None:
        """Spreads the models over the ranks: fsdp2 shards the actor, critic and reference (the rollout
        gets its whole copy first), else DDP wraps the trained ones when there are several ranks."""
        self.sharded = self.cfg.parallel.strategy == "fsdp2" and self.dist.world_size > 1
        self.shard_layout = fsdp.ShardLayout()
        if self.sharded:
            # Its own whole copy, taken before sharding: generate's length differs between ranks, so no
            # collective may run inside it; refreshed from the gathered weights after each update.
            pad = self.tokenizer.pad_token_id
            self.rollout = build_rollout(
                self.cfg, self.actor, self.paths.actor, self.stop_ids, pad, compute or torch.float32
            )
            world = self.dist.world_size
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            group = fsdp.shard_group_size(self.cfg.parallel.shard_group_size, world, local)
            mesh = fsdp.make_mesh(self.device, world, group)
            self.shard_layout = fsdp.layout_of(mesh)
            for model in (self.actor, self.critic, self.ref):
                if model is not None:
                    fsdp.shard_model(model, mesh)
        elif self.dist.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.actor = DDP(self.actor, device_ids=ids)
            self.critic = DDP(self.critic, device_ids=ids) if self.critic is not None else None

    def _build_optimizers(self) -> None:
        p = self.cfg.ppo
        # LoRA: the actor's adapter only (a shared critic's adapter is the critic's optimizer's)
        actor_params = (
            list(self.actor.parameters()) if self.lora is None else self.lora.adapter_params(lora.ACTOR_ADAPTER)
        )
        self.actor_opt = torch.optim.AdamW(actor_params, lr=p.actor_lr, weight_decay=p.weight_decay)
        self.actor_sched = _warmup(self.actor_opt, p.warmup_steps)
        self.critic_opt: Any = None
        self.critic_sched: Any = None
        if self.critic is not None:
            critic_params = (
                self.critic.trained_parameters()
                if isinstance(self.critic, lora.SharedCritic)
                else list(self.critic.parameters())
            )
            self.critic_opt = torch.optim.AdamW(critic_params, lr=p.critic_lr, weight_decay=p.weight_decay)
            self.critic_sched = _warmup(self.critic_opt, p.warmup_steps)
        scaler = torch.amp.GradScaler(self.device.type) if self.precision.needs_scaler else None
        self.trainables = Trainables(self.actor, self.actor_opt, self.critic, self.critic_opt, scaler)
        from trainer.ppo import AdaptiveKLController, FixedKLController

        alg = self.cfg.algorithm
        self.kl_ctl: Any = (
            AdaptiveKLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)
            if alg.kl_controller == "adaptive"
            else FixedKLController(alg.kl_coef)
        )

    def _reward_sources(self) -> RewardSources:
        paths, cfg = self.paths, self.cfg
        forbidden = [("model.actor_path", paths.actor), ("model.critic_path", paths.critic)]
        forbidden += [("model.tokenizer_path", paths.tokenizer), ("model.reward_model_path", paths.reward_model)]
        forbidden += [(f"data.train_files[{i}]", os.path.dirname(f)) for i, f in enumerate(paths.train_files)]
        forbidden += [(f"validation.files[{i}]", os.path.dirname(f)) for i, f in enumerate(cfg.validation.files)]

        def tokenizer_of(path: str) -> Any:
            self.emit(ev.MODEL_LOADING, {"path": path, "kind": "reward_tokenizer"})
            return load_tokenizer(path, cfg.model.allowed_tokenizer_classes)

        return RewardSources(cfg.reward.code_dir, paths.reward_model, tuple(forbidden), tokenizer_of, str(self.device))

    def _encode(self, rows: list[PromptRow]) -> list[list[int]]:
        d = self.cfg.data
        return encode_prompts(rows, self.tokenizer, d.max_prompt_tokens, d.truncation, d.apply_chat_template)

    def _build_data(self) -> None:
        d, v = self.cfg.data, self.cfg.validation
        self.prompts = load_prompts(self.paths.train_files, d.prompt_key, d.ground_truth_key, d.data_source_key)
        self.prompt_ids = self._encode(self.prompts)
        self.sampler = PromptSampler(len(self.prompts), self.cfg.ppo.train_batch_size, self.cfg.run.seed, d.shuffle)
        self.val_prompts: list[PromptRow] = []
        self.val_ids: list[list[int]] = []
        if v.every_steps:
            rows = load_prompts(v.files, d.prompt_key, d.ground_truth_key, d.data_source_key, "validation.files")
            self.val_prompts = rows[: v.max_prompts] if v.max_prompts else rows
            self.val_ids = self._encode(self.val_prompts)

    def _announce(self, resume: str) -> None:
        # One read of the journal (rank 0, which owns it) for the resume's reconciliation, the steps
        # retention may remove and the run's genesis nonce.
        ledger = read_ledger(os.path.join(self.run_dir, ev.JOURNAL_NAME), self.run_id) if self.dist.is_main else None
        self.resumed = find_resume_point(self, resume, ledger)
        if self.resumed is not None and self.sharded:  # a collective: rank 0 loaded before the others
            self.rollout.sync_weights(fsdp.rollout_source(self.actor))
        if ledger is not None:
            self._live_steps = set(ledger.live)
        # The run's genesis nonce: the checkpoint's (a resume), else the journal's first run.started
        # of this run id (a torchrun restart before the first checkpoint), else a new one.
        if self.resumed is not None and self.resumed.cross_run:
            self.genesis_nonce = None  # the checkpoint's nonce is its own run's, not this one's
        journal_nonce = ledger.genesis_nonce if ledger is not None else None
        self.genesis_nonce = self.genesis_nonce or journal_nonce or new_genesis_nonce()
        if self.resumed is not None:
            changed: dict[str, Any] = {"config_digest": self.cfg.digest(), "changed_keys": self.config_changes}
            if self.config_changes:
                changed["config"] = self.cfg.to_dict()
                log.warning("resume applies a changed config: %s", ", ".join(self.config_changes))
            config_digest = changed.pop("config_digest")
            resumed = RunResumed(
                from_step=self.step,
                checkpoint=self.resumed.path,
                verification=self.resumed.verification,
                config_digest=config_digest,
                genesis_nonce=self.genesis_nonce,
                extra={**self.resumed.event_fields(), **changed, **self._elastic_fields()},
            )
            self.emit(resumed.TYPE, resumed.to_data(), step=self.step)
            return
        started = RunStarted(
            rollout_layout=rollout_layout(self.cfg, self.device, self.dist.world_size),
            config_digest=self.cfg.digest(),
            model_path=self.paths.actor,
            tokenizer_path=self.paths.tokenizer,
            world_size=self.dist.world_size,
            versions=_versions(),
            genesis_nonce=self.genesis_nonce,
            extra={
                "config": self.cfg.to_dict(),
                "nccl_env": self.nccl_env,
                "device": str(self.device),
                # A torchrun restart before the first checkpoint starts over: say what it threw away.
                **(self._elastic_fields() if elastic.restart_count(os.environ) else {}),
            },
        )
        self.emit(started.TYPE, started.to_data())

    def _serve_metrics(self) -> Any:
        self.metrics.info.info({"run_id": self.run_id, **_versions()})
        layout = rollout_layout(self.cfg, self.device, self.dist.world_size).to_data()
        self.metrics.rollout_layout.info({k: ",".join(v) if isinstance(v, list) else str(v) for k, v in layout.items()})
        if not self.cfg.run.metrics_port:
            return None
        from warden.httpserve import MetricsServer

        try:
            return MetricsServer(self.metrics.registry, self.cfg.run.metrics_listen, self.cfg.run.metrics_port).start()
        except OSError as exc:
            raise ConfigError(
                f"run.metrics_port: cannot listen on {self.cfg.run.metrics_port} ({exc.strerror}); "
                "set another port or 0 to disable"
            ) from None

    def _elastic_fields(self) -> dict[str, Any]:
        """World size before and after, the lost steps and torchrun's restart count (rank 0 reads the journal)."""
        if self.journal is None:
            return {}
        history = elastic.read_step_history(self.journal.path)
        fields = elastic.resume_fields(
            history,
            self.step,
            self.checkpoint_world_size,
            self.dist.world_size,
            elastic.restart_count(os.environ),
        )
        self.metrics.resume_lost_steps.set(fields["lost_steps"])
        if fields["world_size_changed"] or fields["lost_steps"]:
            log.warning(
                "resumed at step %d with world size %s (was %s); %d completed step(s) after the checkpoint "
                "are trained again (restart %s)",
                self.step,
                fields["new_world_size"],
                fields["old_world_size"],
                fields["lost_steps"],
                fields["restart_count"],
            )
        return fields

    # -- the loop ------------------------------------------------------------------------
    def train(self, max_steps: int | None = None) -> list[StepResult]:
        """Runs until ``max_steps`` (absolute step number; default cfg.max_steps)."""
        target = self.cfg.max_steps if max_steps is None else max_steps
        results = []
        status, error = "completed", None
        try:
            while self.step < target:
                result = self._guarded_step()
                if result is not None:
                    results.append(result)
                    self._maybe_validate()
                    self._maybe_checkpoint(final=self.step >= target)
        except KeyboardInterrupt:
            status, error = "interrupted", "SIGINT/SIGTERM"
            raise
        except BaseException as exc:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            try:
                self._finish_saves(failing=status != "completed")
            finally:
                self.emit(ev.RUN_FINISHED, {"status": status, "error": error, "last_step": self.step}, step=self.step)
        return results

    def _finish_saves(self, failing: bool) -> None:
        """The final checkpoint, SIGTERM or a failure: a save in flight is finished, never abandoned
        (a writer error is raised, or only logged when the run is failing already)."""
        if self.saver.in_flight:
            log.info("waiting for the checkpoint being written before exiting")
        try:
            self.saver.wait()
        except Exception as exc:
            if not failing:
                raise
            log.error("the checkpoint writer failed too: %s", quote_untrusted(exc, 300))

    def _test_hooks(self, step: int) -> None:
        """``oom.raise_at_step``: an OutOfMemoryError at that step, once (drills and tests)."""
        if self.cfg.oom.raise_at_step == step and not self._oom_hook_fired:
            self._oom_hook_fired = True
            raise torch.OutOfMemoryError("raised by the oom.raise_at_step test hook")

    def _guarded_step(self) -> StepResult | None:
        self.phase = "rollout"
        try:
            self._test_hooks(self.step + 1)
            return self.train_step()
        except torch.OutOfMemoryError as exc:
            self.metrics.oom.labels(self.phase).inc()
            self.emit(
                ev.OOM,
                {"phase": self.phase, "error": str(exc)[:500], "action": self.cfg.oom.action},
                step=self.step + 1,
            )
            log.error("out of memory in %s at step %d (oom.action=%s)", self.phase, self.step + 1, self.cfg.oom.action)
            self.trainables.zero_grad()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.cfg.oom.action == "fail":
                raise TrainingFailed(
                    f"out of memory in {self.phase} at step {self.step + 1}; lower the batch or set oom.action: skip"
                ) from None
            return None

    def train_step(self) -> StepResult:
        """One PPO step: rollout, score, experience, update, bookkeeping (one method each)."""
        step, t_start = self.step + 1, time.perf_counter()
        batch = self._next_batch()
        t_data = time.perf_counter() - t_start
        self.phase = "rollout"
        rollout = self._rollout(batch, step)
        scored = self._score(batch, rollout)
        own = torch.tensor([rollout.local_seconds + scored.local_seconds], dtype=torch.float64, device=self.device)
        rank_s = [float(s) for s in all_gather_rows(own, self.dist).tolist()]
        self.phase = "experience"
        t0 = time.perf_counter()
        exp = self._experience(batch, rollout, scored)
        t_exp = time.perf_counter() - t0
        self.phase = "update"
        t0 = time.perf_counter()
        stats = self._update(exp, step)
        timings: dict[str, Any] = {
            "data_s": t_data,
            "rollout_s": rollout.seconds,
            "reward_s": scored.seconds,
            "experience_s": t_exp,
            "update_s": time.perf_counter() - t0,
            "rank_rollout_s": rank_s,  # each rank's own generation + scoring, in rank order
        }
        self.step = step
        return self._bookkeeping(step, batch, rollout, scored, exp, stats, timings, t_start)

    # -- phases --------------------------------------------------------------------------
    def _next_batch(self) -> Batch:
        index = self.sampler.next_batch()
        n = self.cfg.rollout.n
        rows = [self.prompts[i] for i in index for _ in range(n)]
        ids = [self.prompt_ids[i] for i in index for _ in range(n)]
        return Batch(rows, ids, torch.arange(len(index)).repeat_interleave(n), tuple(index))

    def _generate(self, ids: list[list[int]], seed: int, temperature: float) -> Rollout:
        """Generates this rank's share of ``ids`` (left-padded for the whole batch) and gathers every rank's."""
        t0 = time.perf_counter()
        fixed = self.cfg.data.max_prompt_tokens if getattr(self.rollout, "static", False) else None
        prompt_ids, prompt_mask = left_pad(ids, self.tokenizer.pad_token_id, fixed)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        mine = rank_slice(len(ids), self.dist)
        plan = SamplingPlan(seed, mine.start, len(ids), temperature)
        t_own = time.perf_counter()
        responses, mask = self.rollout.generate(prompt_ids[mine], prompt_mask[mine], plan)
        own = time.perf_counter() - t_own
        responses, mask = all_gather_rows(responses, self.dist), all_gather_rows(mask, self.dist)
        seconds = time.perf_counter() - t0  # generation only, as verl's timing_s/gen; decoding is the score's
        pad = self.tokenizer.pad_token_id
        texts = self.tokenizer.batch_decode(responses * mask + pad * (1 - mask), skip_special_tokens=True)
        decoded = time.perf_counter() - t0 - seconds
        return Rollout(prompt_ids, prompt_mask, responses, mask, texts, seconds, decoded, own)

    def _rollout(self, batch: Batch, step: int) -> Rollout:
        seed = (self.cfg.run.seed * 1_000_003 + step) % 2**62
        return self._generate(batch.ids, seed, self.cfg.rollout.temperature)

    def _score_rows(
        self, rows: list[PromptRow], texts: list[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        """Rewards of this rank's share of ``rows``, gathered: (scores (B,), per-function scores,
        this rank's own scoring seconds)."""
        mine = rank_slice(len(rows), self.dist)
        local = rows[mine]
        t_own = time.perf_counter()
        scores = self.reward.score(
            [r.prompt for r in local], texts[mine], [r.ground_truth for r in local], [r.data_source for r in local]
        )
        own = time.perf_counter() - t_own
        names = list(self.reward.last_parts) if len(self.reward.parts) > 1 else []
        table = torch.tensor([scores] + [self.reward.last_parts[n] for n in names], dtype=torch.float32).T
        gathered = all_gather_rows(table.to(self.device).contiguous(), self.dist)
        return gathered[:, 0], {name: gathered[:, i + 1] for i, name in enumerate(names)}, own

    def _score(self, batch: Batch, rollout: Rollout) -> Scored:
        t0 = time.perf_counter() - rollout.decode_seconds
        scores, parts, own = self._score_rows(batch.rows, rollout.texts)
        return Scored(scores, parts, time.perf_counter() - t0, own)

    def _experience(self, batch: Batch, rollout: Rollout, scored: Scored) -> Experience:
        cfg = self.cfg
        return make_experience(
            self.actor,
            self.ref,
            self.critic,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.responses,
            rollout.mask,
            scored.scores,
            batch.groups.to(self.device),
            cfg.algorithm,
            self.kl_ctl.value,
            cfg.rollout.temperature,
            cfg.ppo.micro_batch_size,
            self.precision,
            self.dist,
        )

    def _update(self, exp: Experience, step: int) -> dict[str, float]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.run.seed * 7919 + step)
        with self.lora.dropout_active() if self.lora is not None else contextlib.nullcontext():
            stats = ppo_update(self.trainables, exp, cfg.ppo, cfg.rollout.temperature, self.dist, gen, self.precision)
        self.rollout.sync_weights(fsdp.rollout_source(self.actor))  # engines with their own copy follow the actor
        self.kl_ctl.update(exp.mean_kl, exp.responses.shape[0])
        self.actor_sched.step()
        if self.critic_sched is not None:
            self.critic_sched.step()
        skipped = int(stats["skipped_updates"])
        if skipped:
            self.skipped_updates += skipped
            self.metrics.skipped_updates.inc(skipped)
            log.warning("step %d: %d optimizer step(s) skipped, gradients not finite", step, skipped)
            self.emit(ev.UPDATE_SKIPPED, {"skipped": skipped, "total": self.skipped_updates}, step=step)
        return stats

    def _bookkeeping(
        self,
        step: int,
        batch: Batch,
        rollout: Rollout,
        scored: Scored,
        exp: Experience,
        stats: dict[str, float],
        timings: dict[str, float],
        t_start: float,
    ) -> StepResult:
        timings["step_s"] = time.perf_counter() - t_start
        if not self.instrumented:
            return StepResult(step, {"timings": timings})
        tokens = int(rollout.mask.sum())
        scores = scored.scores
        metrics: dict[str, Any] = {
            "reward_mean": float(scores.mean()),
            "reward_max": float(scores.max()),
            "reward_min": float(scores.min()),
            "kl": exp.mean_kl,
            "kl_coef": float(self.kl_ctl.value),
            **stats,
            "response_tokens": tokens,
            "tokens_per_second": tokens / max(rollout.seconds, 1e-9),
            "lr": self.actor_opt.param_groups[0]["lr"],
            **{f"reward/{name}/mean": float(v.mean()) for name, v in scored.parts.items()},
            **response_length_stats(rollout.mask, self.stop_ids, rollout.responses),
            "timings": timings,
            # Audit: the ranks that trained the step, and which prompts it drew (the global batch,
            # whatever the world size): a resumed run's digests match an uninterrupted run's.
            "world_size": self.dist.world_size,
            "batch_digest": batch_digest(batch.index),
        }
        scheduler = getattr(self.rollout, "scheduler", None)
        if scheduler is not None:  # the vLLM engine: its scheduler in this step's rollout (warden diagnose)
            metrics["scheduler"] = {**dataclasses.asdict(scheduler), "preemptions_last": scheduler.preemptions_last}
        metrics.update(verl_names(metrics))
        self._report(step, metrics, batch.prompts, rollout.texts, scores)
        return StepResult(step, metrics)

    # -- validation ------------------------------------------------------------------------
    def _maybe_validate(self) -> None:
        every = self.cfg.validation.every_steps
        if every and self.step % every == 0:
            self.validate()

    def validate(self) -> dict[str, float]:
        """Generates and scores the held-out set (greedy at temperature 0); journalled and exported."""
        v, world = self.cfg.validation, self.dist.world_size
        t0 = time.perf_counter()
        scores, lengths = [], []
        size = max(world, v.batch_size - v.batch_size % world)
        for start in range(0, len(self.val_ids), size):
            ids = self.val_ids[start : start + size]
            rows = self.val_prompts[start : start + size]
            fill = (-len(ids)) % world  # a short last batch is topped up with its own first row
            ids, rows = ids + [ids[0]] * fill, rows + [rows[0]] * fill
            rollout = self._generate(ids, self.cfg.run.seed * 1_000_003 + 2**40 + self.step, v.temperature)
            got, _, _ = self._score_rows(rows, rollout.texts)
            keep = len(ids) - fill
            scores.append(got[:keep].cpu())
            lengths.append(rollout.mask[:keep].sum(dim=1).float().cpu())
        result = {
            "val/reward_mean": float(torch.cat(scores).mean()),
            "val/response_length/mean": float(torch.cat(lengths).mean()),
            "val/samples": float(len(self.val_ids)),
            "val/seconds": time.perf_counter() - t0,
        }
        self.metrics.val_reward_mean.set(result["val/reward_mean"])
        self.metrics.val_last_step.set(self.step)
        self.emit(ev.VALIDATION_COMPLETED, result, step=self.step)
        return result

    # -- reporting -----------------------------------------------------------------------
    def _report(self, step: int, m: dict[str, Any], prompts: list[str], texts: list[str], scores: torch.Tensor) -> None:
        mt = self.metrics
        mt.steps.inc()
        mt.step_duration.observe(m["timings"]["step_s"])
        mt.rollout_duration.observe(m["timings"]["rollout_s"])
        t = m["timings"]
        mt.last_step_seconds.set(t["step_s"])
        for phase, key in (("data", "data_s"), ("generation", "rollout_s"), ("reward", "reward_s")):
            mt.last_step_phase_seconds.labels(phase).set(t[key])
        for phase in ("experience", "update"):
            mt.last_step_phase_seconds.labels(phase).set(t[f"{phase}_s"])
        mt.rank_rollout_seconds.clear()  # a rank gone since (an elastic restart) leaves no series behind
        for rank, seconds in enumerate(t["rank_rollout_s"]):
            mt.rank_rollout_seconds.labels(str(rank)).set(seconds)
        mt.tokens_per_second.set(m["tokens_per_second"])
        mt.generated_tokens.inc(m["response_tokens"])
        for key in ("reward_mean", "reward_max", "kl", "kl_coef", "policy_loss", "entropy", "clip_fraction"):
            getattr(mt, key).set(m[key])
        mt.grad_norm.set(m["grad_norm"])
        mt.value_loss.set(m.get("value_loss", 0.0))
        mt.kl_loss.set(m.get("kl_loss", 0.0))
        mt.response_length_mean.set(m["response_length/mean"])
        mt.response_length_max.set(m["response_length/max"])
        mt.response_clip_ratio.set(m["response_length/clip_ratio"])
        mt.last_step.set(step)
        mt.last_step_time.set(time.time())
        self.emit(ev.STEP_COMPLETED, m, step=step)
        self._snapshot(step, prompts, texts, scores)
        if self.cfg.run.console and self.dist.is_main and step % self.cfg.log_every == 0:
            print(format_step_line(step, m), flush=True)

    def _snapshot(self, step: int, prompts: list[str], texts: list[str], scores: torch.Tensor) -> None:
        snap = self.cfg.snapshot
        if snap.top_k <= 0:
            return
        rewards = [float(x) for x in scores]
        samples = top_samples(prompts, texts, rewards, snap.top_k, snap.min_reward, snap.max_text_chars)
        payload = RewardSnapshot(samples=tuple(samples), k=snap.top_k, min_reward=snap.min_reward)
        self.emit(payload.TYPE, payload.to_data(), step=step)

    # -- checkpoints ---------------------------------------------------------------------
    def _maybe_checkpoint(self, final: bool) -> None:
        every = self.cfg.checkpoint.every_steps
        if every and (self.step % every == 0 or final):
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Rank 0 saves ``step-N/`` (:mod:`trainer.saver`: asynchronously when configured, so it may
        still be in flight on return); all ranks wait until rank 0's state is captured. An fsdp2 run
        saves tiles instead (:meth:`_save_tiles`)."""
        if self.cfg.parallel.strategy == "fsdp2":
            self._save_tiles()
            return
        if self.dist.is_main:
            self.saver.settle()  # the previous save is complete: its size and retention are known
            if self._room_for_save():
                self.saver.save(self.step, self._fill_checkpoint)
        barrier(self.dist)

    def _save_tiles(self) -> None:
        """The fsdp2 save, synchronous: rank 0 plans the space and says whether to save; every other
        rank writes its tile files into a private directory of its own and fsyncs them; their
        digests reach rank 0 in one gather, so rank 0 links them in and writes the manifest only once
        every rank's files are durable; the others then remove their staging directories."""
        root = self.paths.checkpoint_root
        if self.dist.is_main:
            self.saver.settle()
        go = bool(broadcast_object(self._room_for_save() if self.dist.is_main else None, self.dist))
        if not go:
            barrier(self.dist)
            return
        layout = self.shard_layout
        tiles = fsdp.rank_tiles(self, layout)
        own = fsdp.StagedTiles()
        if not self.dist.is_main and not layout.replica:  # another replica's rows are the first's
            own = fsdp.stage_rank_files(root, self.step, layout.shard, layout.shards, tiles, self._shard_size())
        staged: list[fsdp.StagedTiles] = all_gather_objects([own], self.dist)[1:]
        if self.dist.is_main:

            def link_tiles(writer: Any) -> None:
                fsdp.write_tiles(writer, 0, layout.shards, tiles, prefix=f"{fsdp.SHARDS_DIR}/")
                fsdp.adopt_staged(writer, root, staged)

            self.saver.save(self.step, lambda writer: fill_checkpoint(self, writer, link_tiles))
        barrier(self.dist)
        fsdp.discard_staged(root, own)

    def _shard_size(self) -> int | None:
        cfg = self.cfg.checkpoint
        return cfg.shard_size if cfg.serialization == "shards" else None

    def _space_inputs(self) -> tuple[int, list[tuple[int, int]], int] | None:
        """(free bytes, live checkpoints as (step, bytes), bytes the next one needs); None when the
        root's free space cannot be read (the write then tries, and fails per write_retries)."""
        root = self.paths.checkpoint_root
        try:
            free = space.free_bytes(root)
        except space.SpaceError as exc:
            log.warning("checkpoint space not measured: %s", exc)
            return None
        sizes = []
        for step in sorted(self._live_steps):
            try:
                sizes.append((step, space.tree_bytes(os.path.join(root, ckpt.step_dir_name(step)))))
            except space.SpaceError:
                continue  # gone: the resume's and the signer's reconciliation report it
        needed = space.estimate_needed(sizes[-1][1] if sizes else None, self._state_bytes) + SPACE_MARGIN_BYTES
        return free, sizes, needed

    def _publish_space(self, free: int, sizes: list[tuple[int, int]], needed: int) -> None:
        """The gauges the WardenCheckpointSpaceInsufficient alert compares, for the next save."""
        self.metrics.checkpoint_space_free.set(free)
        self.metrics.checkpoint_space_needed.set(needed)
        reclaimable = sum(b for _s, b in sizes[:-1]) if self.cfg.checkpoint.on_no_space == "prune_first" else 0
        self.metrics.checkpoint_space_reclaimable.set(reclaimable)

    def _room_for_save(self) -> bool:
        """Plans the save against the root's free space (:func:`trainer.space.plan_save`) and acts:
        True to write (after pruning the oldest when planned), False when skipped; a ``fail``
        plan stops the run (exit 1)."""
        inputs = self._space_inputs()
        if inputs is None:
            return True
        free, sizes, needed = inputs
        self._publish_space(free, sizes, needed)
        plan = space.plan_save(
            root=self.paths.checkpoint_root,
            free=free,
            needed=needed - SPACE_MARGIN_BYTES,
            checkpoints=sizes,
            keep_last=self.cfg.checkpoint.keep_last,
            mode=self.cfg.checkpoint.on_no_space,
            margin=SPACE_MARGIN_BYTES,
        )
        if plan.action == "write":
            return True
        path = os.path.join(self.paths.checkpoint_root, ckpt.step_dir_name(self.step))
        if plan.action == "fail":
            raise NoSpaceForCheckpoint(f"{path}: not saved: {plan.reason}")
        if plan.action == "prune_then_write":
            log.warning("%s: %s", path, plan.reason)
            self._prune_steps(plan.prune_steps, f"on_no_space: prune_first before step {self.step}")
            return True
        log.error("%s: checkpoint skipped: %s", path, plan.reason)
        skipped = CheckpointSkipped(path=path, reason=plan.reason, needed_bytes=needed, free_bytes=free)
        self.emit(skipped.TYPE, skipped.to_data(), step=self.step)
        self.metrics.checkpoint_skipped.labels("no_space").inc()
        return False

    def _prune_steps(self, steps: tuple[int, ...], reason: str) -> None:
        """Removes exactly the announced checkpoints ``steps`` (oldest first), each announced first."""
        doomed = set(steps)

        def announce(ref: ckpt.CheckpointRef) -> None:
            self._announce_pruned(ref, reason)

        keep = len(self._live_steps - doomed)
        ckpt.prune(self.paths.checkpoint_root, keep, announce, eligible=set(self._live_steps))

    def _build_saver(self) -> CheckpointSaver:
        cfg = self.cfg.checkpoint
        shards = self._shard_size()
        root = self.paths.checkpoint_root

        def write(step: int, fill: Any) -> ckpt.WrittenCheckpoint:
            return ckpt.write_checkpoint(root, step, fill, shards)

        # fsdp2 saves synchronously: its tiles are written by every rank at the save (config.py refuses on)
        tiled = self.cfg.parallel.strategy == "fsdp2"
        arena = self._reserve_arena() if self.dist.is_main and not tiled else None
        return CheckpointSaver(
            write,
            arena=arena,
            device=self.device,
            retries=cfg.write_retries,
            metrics=self.metrics,
            on_saved=self._announce_saved,
            on_failed=self._announce_failed,
        )

    def _reserve_arena(self) -> HostArena | None:
        """The host copy for asynchronous saves (None: synchronous), sized and checked now, at start."""
        mode, cuda = self.cfg.checkpoint.async_save, self.device.type == "cuda"
        if mode == "off" or (mode == "auto" and not cuda):
            return None
        capacity = self._state_bytes + STAGING_SLACK_BYTES
        try:
            arena = reserve_arena(capacity, pinned=cuda, available=available_host_bytes())
        except HostMemoryError as exc:
            if self.cfg.checkpoint.async_fallback != "sync":
                raise TrainingFailed(str(exc)) from None
            log.warning("%s; saving checkpoints synchronously (checkpoint.async_fallback: sync)", exc)
            return None
        self.metrics.checkpoint_host_buffer_bytes.set(arena.nbytes)
        log.info(
            "checkpoints are saved asynchronously: %.2f GiB of %s host memory hold the copy of the state",
            arena.nbytes / (1 << 30),
            "pinned" if cuda else "pageable",
        )
        return arena

    def _announce_saved(self, written: ckpt.WrittenCheckpoint, timing: SaveTiming) -> None:
        """``checkpoint.saved`` once the bytes are durable, then retention (the writer thread's, when async)."""
        step = ckpt.step_of_name(os.path.basename(written.path))
        self.metrics.last_checkpoint_step.set(step or 0)
        self.metrics.last_checkpoint_time.set(time.time())
        saved = CheckpointSaved(
            path=written.path, root=self.paths.checkpoint_root, extra=timing.event_fields()
        ).with_announced(written.announced)
        self.emit(saved.TYPE, saved.to_data(), step=step)
        self._announced_digests[written.path] = written.announced.root_digest
        if step is not None:
            self._live_steps.add(step)
        keep = self.cfg.checkpoint.keep_last
        retention = f"retention: keep_last {keep}"
        root = self.paths.checkpoint_root
        ckpt.prune(root, keep, lambda ref: self._announce_pruned(ref, retention), eligible=self._live_steps)
        inputs = self._space_inputs()
        if inputs is not None:
            self._publish_space(*inputs)  # for the next save: the alert pages before it, not during it

    def _announce_failed(self, step: int, exc: ckpt.CheckpointError, attempts: int) -> None:
        """``checkpoint.rejected`` for a save that failed every attempt: the path, the errno, the
        bytes needed and free; the previous checkpoints stay as they were, announced."""
        path = os.path.join(self.paths.checkpoint_root, ckpt.step_dir_name(step))
        inputs = self._space_inputs()
        free, needed = (inputs[0], inputs[2]) if inputs else (None, 0)
        why, errno_name = space.describe_write_failure(exc, path=path, needed=needed, free=free)
        log.error("%s: checkpoint not saved after %d attempt(s): %s", path, attempts, why)
        rejection = CheckpointRejection(
            path=path,
            why=f"write failed after {attempts} attempt(s): {why}",
            needed_bytes=needed or None,
            free_bytes=free,
            errno=errno_name,
        )
        self.emit(rejection.TYPE, rejection.to_data(), step=step)
        self.metrics.checkpoint_skipped.labels("write_failed").inc()

    def _announce_pruned(self, ref: ckpt.CheckpointRef, reason: str) -> None:
        """``checkpoint.pruned`` before retention removes ``ref``: the journal accounts for it."""
        pruned = CheckpointPruned(
            path=ref.path,
            step=ref.step,
            reason=reason,
            root_digest=self._announced_digests.pop(ref.path, None),
        )
        self.emit(pruned.TYPE, pruned.to_data(), step=ref.step)
        self._live_steps.discard(ref.step)

    def _fill_checkpoint(self, writer: ckpt.CheckpointSink) -> None:
        fill_checkpoint(self, writer)

    def close(self) -> None:
        saver = getattr(self, "saver", None)
        if saver is not None:
            self._finish_saves(failing=True)  # before the journal closes: the writer announces there
        closer = getattr(self.rollout, "close", None)
        if closer is not None:
            closer()  # the vLLM engine holds memory and worker threads
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        shutdown(self.dist)


def _warmup(optimizer: Any, steps: int) -> Any:
    start = 1.0 / max(1, steps) if steps else 1.0
    return torch.optim.lr_scheduler.LinearLR(optimizer, start, 1.0, total_iters=steps)


def stop_token_ids(eos_id: int | None, extra: tuple[int, ...]) -> tuple[int, ...]:
    """The tokenizer's EOS followed by ``rollout.stop_token_ids``, without repeats. Pure."""
    ids = ([eos_id] if eos_id is not None else []) + list(extra)
    if not ids:
        raise ConfigError("rollout.stop_token_ids: the tokenizer has no EOS token; name at least one stop id")
    return tuple(dict.fromkeys(ids))


def format_step_line(step: int, m: dict[str, Any]) -> str:
    """``step 12 | reward 0.81 | kl 0.004 | loss 0.42 | 1.9k tok/s``"""
    tps = m["tokens_per_second"]
    rate = f"{tps / 1000:.1f}k" if tps >= 1000 else f"{tps:.0f}"
    loss = m["policy_loss"] + m.get("value_loss", 0.0)  # GRPO: no critic, no value loss
    return f"step {step} | reward {m['reward_mean']:.2f} | kl {m['kl']:.3f} | loss {loss:.2f} | {rate} tok/s"


def _new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `warden train --config FILE`")
