"""The PPO trainer: builds everything from a config, trains, checkpoints, resumes, reports.

Python API::

    from trainer.config import load_config
    from trainer.core import PPOTrainer
    trainer = PPOTrainer(load_config("trainer/configs/demo.yaml"), run_dir="/tmp/run")
    trainer.train(max_steps=2)
    trainer.close()

Only rank 0 writes events, checkpoints and serves /metrics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sidecars.errors import ConfigError, IncompleteError
from sidecars.signer.manifest import announced_root
from trainer import checkpoint as ckpt
from trainer import events as ev
from trainer.algorithm import make_experience, ppo_update
from trainer.config import TrainerConfig
from trainer.data import PromptSampler, load_prompts
from trainer.distributed import DistInfo, barrier, init_distributed, pick_device, pin_gpus, shutdown
from trainer.metrics import TrainerMetrics
from trainer.models import load_causal_lm, load_critic, save_critic, unwrap
from trainer.resume import ResumeResult, find_resume_point
from trainer.rewards import build_reward
from trainer.rollout import build_rollout
from trainer.setup import ResolvedPaths, check_environment, resolve_paths
from trainer.tokenizer import load_tokenizer

log = logging.getLogger("warden.trainer")


def checkpoint_announcement(path: str) -> dict[str, Any]:
    """``root_digest`` and ``file_count`` for ``checkpoint.saved``: what the signer must find on disk.

    Computed from the per-file SHA-256 the trainer already wrote to its manifest (no second
    hash of the tensors) plus the manifest file's own SHA-256, since it is signed too (see
    :func:`sidecars.signer.manifest.announced_root`). Empty when the manifest cannot be
    read; the signer then refuses the checkpoint (``no_digest``).
    """
    manifest = os.path.join(path, ckpt.MANIFEST)
    try:
        with open(manifest, "rb") as fh:
            raw = fh.read()
        files = json.loads(raw)["files"]
        announced = announced_root({**files, ckpt.MANIFEST: hashlib.sha256(raw).hexdigest()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("%s: cannot announce the checkpoint's digest (%s); the signer will refuse it", manifest, exc)
        return {}
    return {"root_digest": announced.root_digest, "file_count": announced.file_count}


class TrainingFailed(IncompleteError):
    """Training stopped on an error that the config says is fatal (an OOM with oom.action=fail)."""


@dataclass
class StepResult:
    step: int
    metrics: dict[str, Any]


def _versions() -> dict[str, str]:
    import transformers

    from sidecars import __version__

    return {
        "warden": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


class PPOTrainer:
    """One run. ``resume`` is ``auto``, ``never`` or a checkpoint path."""

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
    ) -> None:
        self.cfg = cfg
        self.instrumented = instrumented  # False: no events, metrics or snapshots per step (benchmarks)
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
        self.journal: ev.EventWriter | None = None
        journal_path = os.path.join(self.run_dir, ev.JOURNAL_NAME)
        self.run_id = cfg.run.run_id or _existing_run_id(journal_path) or _new_run_id(config_name)
        if self.dist.is_main and emit_events:
            self.journal = ev.EventWriter(journal_path, self.run_id)
        self._seed(cfg.run.seed)
        self._build_models()
        self.step = 0
        self._oom_hook_fired = False
        self.resumed: ResumeResult | None = None
        self._announce(resume)
        self._server = self._serve_metrics() if serve_metrics and self.dist.is_main else None

    # -- construction ------------------------------------------------------------------
    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def emit(self, etype: str, data: dict[str, Any], step: int | None = None) -> None:
        if self.journal is not None:
            self.journal.emit(etype, data, step=step)

    def _build_models(self) -> None:
        cfg, paths = self.cfg, self.paths
        self.emit(ev.MODEL_LOADING, {"path": paths.tokenizer, "kind": "tokenizer"})
        self.tokenizer = load_tokenizer(paths.tokenizer, cfg.model.allowed_tokenizer_classes)
        self.tokenizer.padding_side = "left"
        for kind, path in (("actor", paths.actor), ("reference", paths.actor), ("critic", paths.critic)):
            self.emit(ev.MODEL_LOADING, {"path": path, "kind": kind})
        self.actor = load_causal_lm(paths.actor, cfg.model.dtype, self.device)
        self.ref = load_causal_lm(paths.actor, cfg.model.dtype, self.device).eval().requires_grad_(False)
        self.critic: Any = load_critic(paths.critic, cfg.model.dtype, self.device)
        self.actor.config.use_cache = True
        if self.dist.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.actor = DDP(self.actor, device_ids=ids)
            self.critic = DDP(self.critic, device_ids=ids)
        p = cfg.ppo
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=p.actor_lr, weight_decay=p.weight_decay)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=p.critic_lr, weight_decay=p.weight_decay)
        warm = max(1, p.warmup_steps)
        self.actor_sched = torch.optim.lr_scheduler.LinearLR(
            self.actor_opt, 1.0 / warm if p.warmup_steps else 1.0, 1.0, total_iters=p.warmup_steps
        )
        self.critic_sched = torch.optim.lr_scheduler.LinearLR(
            self.critic_opt, 1.0 / warm if p.warmup_steps else 1.0, 1.0, total_iters=p.warmup_steps
        )
        self.rollout = build_rollout(
            cfg, unwrap(self.actor), paths.actor, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        )
        self.reward = build_reward(
            cfg.reward.kind, cfg.reward.rule, paths.reward_model, self.tokenizer, str(self.device)
        )
        self.prompts = load_prompts(paths.train_files, cfg.data.prompt_key, cfg.data.ground_truth_key)
        self.sampler = PromptSampler(len(self.prompts), cfg.ppo.train_batch_size, cfg.run.seed, cfg.data.shuffle)
        from trainer.ppo import AdaptiveKLController, FixedKLController

        alg = cfg.algorithm
        self.kl_ctl: Any = (
            AdaptiveKLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)
            if alg.kl_controller == "adaptive"
            else FixedKLController(alg.kl_coef)
        )

    def _announce(self, resume: str) -> None:
        self.resumed = find_resume_point(self, resume)
        if self.resumed is not None:
            self.emit(
                ev.RUN_RESUMED,
                {
                    "from_step": self.step,
                    "checkpoint": self.resumed.path,
                    "verification": self.resumed.verification,
                    **self.resumed.event_fields(),
                },
                step=self.step,
            )
            return
        self.emit(
            ev.RUN_STARTED,
            {
                "config_digest": self.cfg.digest(),
                "config": self.cfg.to_dict(),
                "model_path": self.paths.actor,
                "tokenizer_path": self.paths.tokenizer,
                "world_size": self.dist.world_size,
                "versions": _versions(),
                "nccl_env": self.nccl_env,
                "device": str(self.device),
            },
        )

    def _serve_metrics(self) -> Any:
        self.metrics.info.info({"run_id": self.run_id, **_versions()})
        if not self.cfg.run.metrics_port:
            return None
        from sidecars.httpserve import MetricsServer

        try:
            return MetricsServer(self.metrics.registry, self.cfg.run.metrics_listen, self.cfg.run.metrics_port).start()
        except OSError as exc:
            raise ConfigError(
                f"run.metrics_port: cannot listen on {self.cfg.run.metrics_port} ({exc.strerror}); "
                "set another port or 0 to disable"
            ) from None

    # -- training ------------------------------------------------------------------------
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
                    self._maybe_checkpoint(final=self.step >= target)
        except KeyboardInterrupt:
            status, error = "interrupted", "SIGINT/SIGTERM"
            raise
        except BaseException as exc:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.emit(ev.RUN_FINISHED, {"status": status, "error": error, "last_step": self.step}, step=self.step)
        return results

    def _guarded_step(self) -> StepResult | None:
        self.phase = "rollout"
        try:
            return self.train_step()
        except torch.OutOfMemoryError as exc:
            self.metrics.oom.labels(self.phase).inc()
            self.emit(
                ev.OOM,
                {"phase": self.phase, "error": str(exc)[:500], "action": self.cfg.oom.action},
                step=self.step + 1,
            )
            log.error("out of memory in %s at step %d (oom.action=%s)", self.phase, self.step + 1, self.cfg.oom.action)
            self.actor_opt.zero_grad(set_to_none=True)
            self.critic_opt.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.cfg.oom.action == "fail":
                raise TrainingFailed(
                    f"out of memory in {self.phase} at step {self.step + 1}; lower the batch or set oom.action: skip"
                ) from None
            return None

    def _batch(self) -> tuple[list[str], list[str | None], torch.Tensor]:
        rows = [self.prompts[i] for i in self.sampler.next_batch()]
        n = self.cfg.rollout.n
        prompts = [r.prompt for r in rows for _ in range(n)]
        truths = [r.ground_truth for r in rows for _ in range(n)]
        groups = torch.arange(len(rows)).repeat_interleave(n)
        return prompts, truths, groups

    def train_step(self) -> StepResult:
        cfg, step = self.cfg, self.step + 1
        t_start = time.perf_counter()
        prompts, truths, groups = self._batch()
        if cfg.oom.raise_at_step == step and not self._oom_hook_fired:
            self._oom_hook_fired = True
            raise torch.OutOfMemoryError("raised by the oom.raise_at_step test hook")
        enc = self.tokenizer(
            prompts, return_tensors="pt", padding=True, truncation=True, max_length=cfg.data.max_prompt_tokens
        ).to(self.device)
        t0 = time.perf_counter()
        responses, mask = self.rollout.generate(enc.input_ids, enc.attention_mask)
        t_rollout = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(
            responses * mask + self.tokenizer.pad_token_id * (1 - mask), skip_special_tokens=True
        )
        scores = torch.tensor(self.reward.score(prompts, texts, truths), dtype=torch.float32, device=self.device)
        self.phase = "experience"
        t0 = time.perf_counter()
        exp = make_experience(
            self.actor,
            self.ref,
            self.critic,
            enc.input_ids,
            enc.attention_mask,
            responses,
            mask,
            scores,
            groups.to(self.device),
            cfg.algorithm,
            self.kl_ctl.value,
            cfg.rollout.temperature,
            cfg.ppo.micro_batch_size,
        )
        t_exp = time.perf_counter() - t0
        self.phase = "update"
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(cfg.run.seed * 7919 + step)
        stats = ppo_update(
            self.actor,
            self.critic,
            self.actor_opt,
            self.critic_opt,
            exp,
            cfg.ppo,
            cfg.rollout.temperature,
            self.dist,
            gen,
        )
        self.rollout.sync_weights(unwrap(self.actor))  # engines with their own copy (vllm) follow the actor
        t_update = time.perf_counter() - t0
        self.kl_ctl.update(exp.mean_kl, len(prompts))
        self.actor_sched.step()
        self.critic_sched.step()
        self.step = step
        if not self.instrumented:
            return StepResult(step, {"timings": {"rollout_s": t_rollout, "step_s": time.perf_counter() - t_start}})
        tokens = int(mask.sum())
        step_s = time.perf_counter() - t_start
        metrics = {
            "reward_mean": float(scores.mean()),
            "reward_max": float(scores.max()),
            "kl": exp.mean_kl,
            "kl_coef": float(self.kl_ctl.value),
            **stats,
            "response_tokens": tokens,
            "tokens_per_second": tokens / max(t_rollout, 1e-9),
            "lr": self.actor_opt.param_groups[0]["lr"],
            "timings": {"rollout_s": t_rollout, "experience_s": t_exp, "update_s": t_update, "step_s": step_s},
        }
        self._report(step, metrics, prompts, texts, scores)
        return StepResult(step, metrics)

    # -- reporting -----------------------------------------------------------------------
    def _report(self, step: int, m: dict[str, Any], prompts: list[str], texts: list[str], scores: torch.Tensor) -> None:
        mt = self.metrics
        mt.steps.inc()
        mt.step_duration.observe(m["timings"]["step_s"])
        mt.rollout_duration.observe(m["timings"]["rollout_s"])
        mt.tokens_per_second.set(m["tokens_per_second"])
        mt.generated_tokens.inc(m["response_tokens"])
        for key in (
            "reward_mean",
            "reward_max",
            "kl",
            "kl_coef",
            "policy_loss",
            "value_loss",
            "entropy",
            "clip_fraction",
            "grad_norm",
        ):
            getattr(mt, key).set(m[key])
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
        order = sorted(range(len(texts)), key=lambda i: (-float(scores[i]), i))
        cap = snap.max_text_chars
        samples = [
            {
                "index": i,
                "prompt": prompts[i][:cap],
                "response": texts[i][:cap],
                "reward": float(scores[i]),
                "truncated": len(prompts[i]) > cap or len(texts[i]) > cap,
            }
            for i in order
            if snap.min_reward is None or float(scores[i]) >= snap.min_reward
        ][: snap.top_k]
        self.emit(ev.REWARD_SNAPSHOT, {"k": snap.top_k, "min_reward": snap.min_reward, "samples": samples}, step=step)

    # -- checkpoints ---------------------------------------------------------------------
    def _maybe_checkpoint(self, final: bool) -> None:
        every = self.cfg.checkpoint.every_steps
        if every and (self.step % every == 0 or final):
            self.save_checkpoint()

    def save_checkpoint(self) -> str | None:
        """Rank 0 writes ``step-N/`` atomically (retrying per config); all ranks wait for it."""
        path = None
        if self.dist.is_main:
            path = self._write_with_retries()
        barrier(self.dist)
        return path

    def _write_with_retries(self) -> str | None:
        retries = self.cfg.checkpoint.write_retries
        for attempt in range(retries + 1):
            try:
                path = ckpt.write_checkpoint(self.paths.checkpoint_root, self.step, self._fill_checkpoint)
            except ckpt.CheckpointError as exc:
                self.metrics.checkpoint_failures.inc()
                log.error("%s (attempt %d of %d)", exc, attempt + 1, retries + 1)
                if attempt == retries:
                    self.emit(
                        ev.CHECKPOINT_REJECTED,
                        {"path": ckpt.step_dir_name(self.step), "why": f"write failed: {exc}"},
                        step=self.step,
                    )
                    return None
                time.sleep(min(5.0, 0.5 * 2**attempt))
                continue
            self.metrics.last_checkpoint_step.set(self.step)
            self.metrics.last_checkpoint_time.set(time.time())
            data = {"path": path, "root": self.paths.checkpoint_root, **checkpoint_announcement(path)}
            self.emit(ev.CHECKPOINT_SAVED, data, step=self.step)
            ckpt.prune(self.paths.checkpoint_root, self.cfg.checkpoint.keep_last)
            return path
        return None

    def _fill_checkpoint(self, tmp: str) -> None:
        unwrap(self.actor).save_pretrained(os.path.join(tmp, "actor"), safe_serialization=True)
        save_critic(unwrap(self.critic), os.path.join(tmp, "critic"), self.paths.critic)
        ckpt.save_state(tmp, "optim_actor", self.actor_opt.state_dict())
        ckpt.save_state(tmp, "optim_critic", self.critic_opt.state_dict())
        ckpt.save_state(tmp, "rng", capture_rng())
        ckpt.write_json(
            os.path.join(tmp, ckpt.STATE),
            {
                "step": self.step,
                "run_id": self.run_id,
                "config_digest": self.cfg.digest(),
                "data_position": self.sampler.state(),
                "kl_coef": float(self.kl_ctl.value),
                "scheduler_actor": self.actor_sched.state_dict(),
                "scheduler_critic": self.critic_sched.state_dict(),
                "world_size": self.dist.world_size,
            },
        )

    def close(self) -> None:
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


def capture_rng() -> dict[str, Any]:
    py = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {
            "key": str(np_state[0]),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
            "state": torch.from_numpy(np_state[1].astype(np.int64)),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        (n["key"], n["state"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def format_step_line(step: int, m: dict[str, Any]) -> str:
    """``step 12 | reward 0.81 | kl 0.004 | loss 0.42 | 1.9k tok/s``"""
    tps = m["tokens_per_second"]
    rate = f"{tps / 1000:.1f}k" if tps >= 1000 else f"{tps:.0f}"
    loss = m["policy_loss"] + m["value_loss"]
    return f"step {step} | reward {m['reward_mean']:.2f} | kl {m['kl']:.3f} | loss {loss:.2f} | {rate} tok/s"


def _existing_run_id(journal_path: str) -> str | None:
    try:
        with open(journal_path, "rb") as fh:
            first = fh.readline()
        return ev.Event.from_dict(__import__("json").loads(first)).run_id
    except (OSError, ValueError):
        return None


def _new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `warden train --config FILE`")
