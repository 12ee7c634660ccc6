"""verl 0.9.1's own writers, driven in this process on CPU (Ray installed so verl imports, never started).

What runs is verl's code, not a copy (compare :mod:`tests.integrations.verl_writer`, written from
its source):

- the file logger: ``verl.utils.tracking.Tracking(..., default_backend=["file"])`` (its ``FileLogger``);
- the rollout dump: ``RayPPOTrainer._dump_generations`` (a one-thread executor, ``_write_generations``);
- the resume: ``RayPPOTrainer._load_checkpoint`` (``resume_mode: auto``) after a new ``Tracking``;
- the checkpoint: ``RayPPOTrainer._save_checkpoint`` (actor, ``data.pt`` from a torchdata
  ``StatefulDataLoader``, then the tracker), the actor's ``FSDPCheckpointManager.save_checkpoint``
  over a real FSDP-wrapped tiny Llama on a one-process gloo group, retention by its
  ``max_ckpt_to_keep`` (``BaseCheckpointManager``).

The only stand-in is verl's Ray worker group: ``actor_rollout_wg.save_checkpoint`` is called in
this process on the manager the worker would hold (``InProcessWorkerGroup``), and the
``RayPPOTrainer`` is made without its ``__init__`` (which builds Ray workers), given the
attributes ``_save_checkpoint``, ``_load_checkpoint`` and ``_dump_generations`` read.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"


def process_group() -> bool:
    """A one-process gloo group (verl's checkpoint manager needs one); True when this call made it."""
    import torch.distributed as dist
    from support import free_port

    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    return True


class InProcessWorkerGroup:
    """What ``RayPPOTrainer`` calls on ``actor_rollout_wg`` to save: the worker's checkpoint manager, here."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def save_checkpoint(self, local_path: str, hdfs_path: str | None, global_step: int, max_ckpt_to_keep: Any) -> None:
        self.manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep=max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.manager.load_checkpoint(local_path, None, del_local_after_load=del_local_after_load)


class RealVerl:
    """One verl experiment: the FSDP actor, verl's trainer methods, its file logger."""

    def __init__(self, tiny: Any, root: Path, project: str, experiment: str, keep: int) -> None:
        import torch
        from omegaconf import OmegaConf
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torchdata.stateful_dataloader import StatefulDataLoader
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.utils.tracking import Tracking

        torch.manual_seed(0)
        self.root = root
        self.default_local_dir = root / "checkpoints" / project / experiment
        self.rollout_data_dir = root / "rollouts" / experiment
        self.log_path = root / "logs" / project / f"{experiment}.jsonl"
        self.tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(tiny.model_dir, local_files_only=True)
        self.model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        contents = ["model", "optimizer", "extra"]
        manager = FSDPCheckpointManager(
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=None,
            processing_class=self.tokenizer,
            checkpoint_config=OmegaConf.create({"save_contents": contents, "load_contents": contents}),
        )
        trainer = object.__new__(RayPPOTrainer)  # no __init__: it builds Ray worker groups
        trainer.config = OmegaConf.create(
            {
                "trainer": {
                    "default_local_dir": str(self.default_local_dir),
                    "default_hdfs_dir": None,
                    "max_actor_ckpt_to_keep": keep,
                    "max_critic_ckpt_to_keep": keep,
                    "resume_mode": "auto",
                    "del_local_ckpt_after_load": False,
                },
                "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
            }
        )
        trainer.use_critic = False  # GRPO: no critic
        trainer.actor_rollout_wg = InProcessWorkerGroup(manager)
        trainer.train_dataloader = StatefulDataLoader(list(range(16)), batch_size=4)
        trainer.global_steps = 0
        trainer._init_dump_executor()
        self.trainer = trainer
        self._env = {"VERL_FILE_LOGGER_ROOT": os.environ.get("VERL_FILE_LOGGER_ROOT")}
        os.environ["VERL_FILE_LOGGER_ROOT"] = str(root / "logs")
        os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        self.project, self.experiment = project, experiment
        self.tracking = Tracking(project, experiment, default_backend=["file"])
        self.dumps: dict[int, list[dict[str, Any]]] = {}

    # -- one step as RayPPOTrainer.fit orders it: the dump, the update, the save, the log line -------
    def step(self, step: int, rows: list[dict[str, Any]], metrics: dict[str, Any], save: bool) -> None:
        import torch

        self.trainer.global_steps = step
        self.dumps[step] = rows
        self.trainer._dump_generations(
            [r["input"] for r in rows],
            [r["output"] for r in rows],
            [r["gts"] for r in rows],
            [r["score"] for r in rows],
            {"acc": [r["acc"] for r in rows]},
            str(self.rollout_data_dir),
        )
        ids = torch.tensor([self.tokenizer(rows[0]["output"])["input_ids"][:12]])
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        if save:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.trainer._save_checkpoint()
        self.tracking.log(data=metrics, step=step)
        self.drain()

    def restart(self) -> int:
        """verl started again on the same experiment: a new ``Tracking`` (its file logger truncates the
        log), then ``RayPPOTrainer._load_checkpoint`` (``resume_mode: auto``: the tracker's step, the
        actor through the manager's ``load_checkpoint``, ``data.pt``). Returns the step resumed at."""
        from verl.utils.tracking import Tracking

        self.tracking.finish()
        self.tracking = Tracking(self.project, self.experiment, default_backend=["file"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer._load_checkpoint()
        return int(self.trainer.global_steps)

    def drain(self) -> None:
        """Waits for the dumps in flight (``RayPPOTrainer._dump_futures``), re-raising their errors."""
        for future in list(self.trainer._dump_futures):
            future.result(timeout=60)

    def step_dir(self, step: int) -> Path:
        return self.default_local_dir / f"global_step_{step}"

    @property
    def tracker(self) -> Path:
        return self.default_local_dir / TRACKER

    def close(self) -> None:
        self.trainer._shutdown_dump_executor()
        self.tracking.finish()
        for name, value in self._env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
