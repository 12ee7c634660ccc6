"""A small stand-in for verl's writers: the files a verl PPO run leaves on disk, byte-for-byte
in layout and in order, without verl, torch or Ray.

Written from reading verl 0.9.1 (the PyPI wheel ``verl-0.9.1-py3-none-any.whl``); no verl code
is copied, only the file-level facts below. What each piece reproduces:

- :class:`FileLogger` -- ``verl/utils/tracking.py`` ``FileLogger`` (``trainer.logger=file``):
  the path is ``$VERL_FILE_LOGGER_PATH``, else ``$VERL_FILE_LOGGER_ROOT`` (default ``.``,
  ``~`` expanded) ``/<project>/<experiment>.jsonl`` with the project directory created; the file
  is opened ``"wb"`` unbuffered (a restart truncates it) and each ``log(data, step)`` writes one
  ``orjson.dumps({"step": step, "data": data}) + b"\\n"`` (compact, NaN/inf as ``null``).
- :meth:`VerlTrainer.dump_generations` -- ``RayPPOTrainer._write_generations``
  (``verl/trainer/ppo/ray_trainer.py``): ``<rollout_data_dir>/<global_steps>.jsonl`` opened
  ``"w"``, one ``json.dumps(entry, ensure_ascii=False)`` line per sample with keys ``input``,
  ``output``, ``gts``, ``score``, ``step`` and then the reward extra infos. (verl runs it on a
  one-thread executor; here it is synchronous, before the checkpoint and the log line, the
  order ``fit`` issues them in.)
- :meth:`VerlTrainer.save_checkpoint` -- ``RayPPOTrainer._save_checkpoint``: the actor's then
  the critic's checkpoint manager write ``global_step_N/actor`` and ``global_step_N/critic``,
  then ``global_step_N/data.pt`` (``torch.save`` of the dataloader state), then, unless
  ``actor.checkpoint.async_save``, ``latest_checkpointed_iteration.txt`` opened ``"w"`` and
  written ``str(N)`` (in place, no rename, no fsync).
- :class:`_RoleManager` -- ``verl/utils/checkpoint/checkpoint_manager.py``
  ``BaseCheckpointManager`` retention, one manager per role (actor and critic each keep
  ``max_{actor,critic}_ckpt_to_keep``): ``ensure_checkpoint_capacity`` before a save (only
  when keep > 1: removes the oldest so that keep - 1 remain) and ``register_checkpoint``
  after it (appends, removes beyond keep); removal is ``shutil.rmtree`` of the role
  directory ``global_step_M/<role>`` only (``data.pt`` and ``global_step_M/`` stay).
- FSDP role layout -- ``verl/utils/checkpoint/fsdp_checkpoint_manager.py``: per rank
  ``model_/optim_/extra_state_world_size_W_rank_R.pt``, rank 0's ``huggingface/`` (config,
  tokenizer) and ``fsdp_config.json``; capacity is ensured before, registration after.
- Megatron role layout and ``async_save`` -- ``verl/utils/checkpoint/megatron_checkpoint_manager.py``
  (layout schema v2): ``model/dist_ckpt``, ``optimizer/dist_ckpt``, ``extra/dist_ckpt``,
  ``transformer_config.json``; ``_finalize_save`` writes ``ckpt_contents.json`` last
  (``.tmp`` + fsync + ``os.replace``), then, with ``async_save``, rank 0 writes
  ``latest_checkpointed_iteration.txt`` two levels up, then ``register_checkpoint``. With
  ``async_save`` ``ensure_checkpoint_capacity`` is skipped and the finalize runs only when the
  background writes are done, i.e. after the trainer already wrote ``data.pt`` and went on;
  :meth:`VerlTrainer.save_checkpoint` returns a :class:`PendingSave` whose ``finalize()`` the
  caller runs later ("tracker later").
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
CONTENTS_MANIFEST = "ckpt_contents.json"


def orjson_line(obj: Any) -> bytes:
    """What ``orjson.dumps`` writes for the logger's dicts: compact, non-finite floats as null."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(obj), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class FileLogger:
    """verl.utils.tracking.FileLogger's path rule, open mode and line format."""

    def __init__(self, project_name: str, experiment_name: str, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        path = env.get("VERL_FILE_LOGGER_PATH")
        if path is None:
            root = os.path.expanduser(env.get("VERL_FILE_LOGGER_ROOT", "."))
            directory = os.path.join(root, project_name)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"{experiment_name}.jsonl")
        self.filepath = path
        self.fp = open(path, "wb", buffering=0)  # noqa: SIM115 (kept open for the run, like verl)

    def log(self, data: dict[str, Any], step: int) -> None:
        self.fp.write(orjson_line({"step": step, "data": data}))

    def finish(self) -> None:
        self.fp.close()


@dataclass
class _RoleManager:
    """One role's checkpoint manager: the retention bookkeeping of BaseCheckpointManager."""

    keep: int | None
    previous_saved_paths: list[Path] = field(default_factory=list)

    def _remove(self, paths: list[Path]) -> None:
        for path in paths:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)

    def ensure_capacity(self) -> None:
        if not (isinstance(self.keep, int) and self.keep > 1):
            return
        if len(self.previous_saved_paths) >= self.keep:
            start = len(self.previous_saved_paths) - self.keep + 1
            self._remove(self.previous_saved_paths[:start])
            self.previous_saved_paths = self.previous_saved_paths[start:]

    def register(self, path: Path) -> None:
        self.previous_saved_paths.append(path)
        if not (isinstance(self.keep, int) and self.keep > 0):
            return
        if len(self.previous_saved_paths) > self.keep:
            start = len(self.previous_saved_paths) - self.keep
            self._remove(self.previous_saved_paths[:start])
            self.previous_saved_paths = self.previous_saved_paths[start:]


@dataclass
class PendingSave:
    """An ``async_save`` checkpoint whose background writes are done but not yet finalized.

    Each role's Megatron finalize writes its ``ckpt_contents.json``, then the tracker, then
    applies retention. :meth:`finalize` runs them role by role, as verl does;
    :meth:`write_manifests` and :meth:`complete` split the same writes in two (every role's
    manifest, later every role's tracker write and retention) for a test that holds the
    tracker back, as when the finalizer lags behind the trainer.
    """

    step: int
    directory: Path
    _manifests: list[Callable[[], None]]
    _completions: list[Callable[[], None]]

    def finalize(self) -> None:
        for manifest, completion in zip(self._manifests, self._completions, strict=True):
            manifest()
            completion()
        self._manifests, self._completions = [], []

    def write_manifests(self) -> None:
        for manifest in self._manifests:
            manifest()
        self._manifests = []

    def complete(self) -> None:
        assert not self._manifests, "write_manifests() first"
        for completion in self._completions:
            completion()
        self._completions = []


def _blob(seed: str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@dataclass
class VerlTrainer:
    """The files of one verl PPO experiment (``trainer.project_name``/``experiment_name``).

    ``backend``: ``"fsdp"`` or ``"megatron"``; ``async_save``: Megatron's
    ``actor_rollout_ref.actor.checkpoint.async_save`` (one setting for the run, as in verl).
    """

    project: str
    experiment: str
    default_local_dir: Path
    rollout_data_dir: Path
    logger_env: dict[str, str]
    backend: str = "fsdp"
    async_save: bool = False
    world_size: int = 2
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    use_critic: bool = True
    dumps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.async_save and self.backend != "megatron":
            raise ValueError("async_save is a Megatron checkpoint option in verl")
        self.logger = FileLogger(self.project, self.experiment, self.logger_env)
        self._managers = {
            "actor": _RoleManager(self.max_actor_ckpt_to_keep),
            "critic": _RoleManager(self.max_critic_ckpt_to_keep),
        }

    @property
    def tracker(self) -> Path:
        return self.default_local_dir / TRACKER

    def step_dir(self, step: int) -> Path:
        return self.default_local_dir / f"global_step_{step}"

    def roles(self) -> tuple[str, ...]:
        return ("actor", "critic") if self.use_critic else ("actor",)

    # -- rollout dumps -----------------------------------------------------------------------
    def dump_generations(self, step: int, n: int = 6) -> list[dict[str, Any]]:
        rng = random.Random(f"{self.experiment}-{step}")
        rows = []
        for _ in range(n):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            ok = rng.random() < 0.5
            answer = a + b if ok else a + b + 1
            rows.append(
                {
                    "input": f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n",
                    "output": f"{a} plus {b} is {answer}. #### {answer}",
                    "gts": str(a + b),
                    "score": 1.0 if ok else round(rng.random() * 0.1, 4),
                    "step": step,
                    "acc": ok,
                }
            )
        self.rollout_data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.rollout_data_dir / f"{step}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self.dumps[step] = rows
        return rows

    # -- metrics ---------------------------------------------------------------------------------
    def log_step(self, step: int) -> None:
        rng = random.Random(f"log-{self.experiment}-{step}")
        self.logger.log(
            {
                "actor/pg_loss": -0.01 * step + rng.random() * 1e-3,
                "actor/entropy": 1.2 - 0.01 * step,
                "actor/kl_loss": 0.001 * step,
                "actor/grad_norm": 0.8,
                "critic/vf_loss": 0.5 / step,
                "critic/score/mean": 0.1 * step,
                "critic/vf_explained_var": float("nan") if step == 1 else 0.3,
                "timing_s/step": 20.0,
                "training/global_step": step,
            },
            step,
        )

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> PendingSave | None:
        """_save_checkpoint; with ``async_save`` the returned save still has to be finalized."""
        directory = self.step_dir(step)
        manifests: list[Callable[[], None]] = []
        completions: list[Callable[[], None]] = []
        for role in self.roles():
            finalize = self._save_role(role, directory / role, step)
            if finalize is not None:
                manifests.append(finalize[0])
                completions.append(finalize[1])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "data.pt").write_bytes(_blob(f"data-{self.experiment}-{step}", 3000))
        if self.async_save:
            return PendingSave(step, directory, manifests, completions)
        with open(self.tracker, "w") as fh:
            fh.write(str(step))
        return None

    def _save_role(self, role: str, role_dir: Path, step: int) -> tuple[Callable[[], None], Callable[[], None]] | None:
        manager = self._managers[role]
        if self.backend == "fsdp":
            manager.ensure_capacity()
            self._write_fsdp(role_dir, step)
            manager.register(role_dir)
            return None
        if not self.async_save:
            manager.ensure_capacity()
        self._write_megatron(role_dir, step)

        def write_manifest() -> None:
            manifest = role_dir / CONTENTS_MANIFEST
            tmp = role_dir / (CONTENTS_MANIFEST + ".tmp")
            doc = {"global_step": step, "schema_version": 2, "contents": {"model": {"path": "model/dist_ckpt"}}}
            with open(tmp, "w") as fh:
                json.dump(doc, fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, manifest)

        def complete() -> None:
            if self.async_save:
                with open(role_dir.parent.parent / TRACKER, "w") as fh:
                    fh.write(str(step))
            manager.register(role_dir)

        if self.async_save:
            return write_manifest, complete
        write_manifest()
        complete()
        return None

    def _write_fsdp(self, role_dir: Path, step: int) -> None:
        hf = role_dir / "huggingface"
        hf.mkdir(parents=True, exist_ok=True)
        for rank in range(self.world_size):
            suffix = f"world_size_{self.world_size}_rank_{rank}.pt"
            for kind, size in (("model", 20_000), ("optim", 40_000), ("extra_state", 500)):
                (role_dir / f"{kind}_{suffix}").write_bytes(_blob(f"{role_dir}-{kind}-{rank}-{step}", size))
        (hf / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
        (role_dir / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": self.world_size}))

    def _write_megatron(self, role_dir: Path, step: int) -> None:
        for part, size in (("model", 30_000), ("optimizer", 50_000), ("extra", 500)):
            dist = role_dir / part / "dist_ckpt"
            dist.mkdir(parents=True, exist_ok=True)
            for rank in range(self.world_size):
                (dist / f"__{rank}_0.distcp").write_bytes(_blob(f"{role_dir}-{part}-{rank}-{step}", size))
            (dist / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
        (role_dir / "transformer_config.json").write_text(json.dumps({"num_layers": 2, "hidden_size": 64}))

    # -- one step as RayPPOTrainer.fit orders it ---------------------------------------------------
    def train_step(self, step: int, save: bool = False) -> PendingSave | None:
        """Rollout dump, the checkpoint when due, then the step's log line."""
        self.dump_generations(step)
        pending = self.save_checkpoint(step) if save else None
        self.log_step(step)
        return pending

    def finish(self) -> None:
        self.logger.finish()
