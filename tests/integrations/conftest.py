"""Fixtures of the integration tests: a verl run written the way verl writes it, a clock
that can be moved forward, the journal as a list, and keys/policies for the real sidecars.

Tests reach the helpers through fixtures (the tests tree has no __init__ files).
"""

from __future__ import annotations

import importlib.util
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integrations.verl_writer import orjson_line
from warden.journal import Event, JournalReader

PROJECT, EXPERIMENT = "gsm8k_ppo", "qwen-ppo-exp1"


def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def verl_metrics(step: int, validate: bool = False) -> dict[str, Any]:
    """A realistic subset of what verl's RayPPOTrainer logs per step (metric_utils + timing)."""
    rng = random.Random(step)
    metrics: dict[str, Any] = {
        "actor/pg_loss": -0.01 * step + rng.random() * 1e-3,
        "actor/pg_clipfrac": 0.02,
        "actor/ppo_kl": 1e-4,
        "actor/pg_clipfrac_lower": 0.0,
        "actor/entropy": 1.2 - 0.01 * step,
        "actor/grad_norm": 0.8,
        "actor/lr": 1e-6,
        "actor/kl_loss": 0.001 * step,
        "actor/kl_coef": 0.001,
        "critic/vf_loss": 0.5 / step,
        "critic/vf_clipfrac": 0.0,
        "critic/vpred_mean": 0.1,
        "critic/score/mean": 0.1 * step,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/rewards/mean": 0.1 * step - 0.001,
        "critic/advantages/mean": 0.0,
        "critic/returns/mean": 0.3,
        "critic/values/mean": 0.2,
        "critic/vf_explained_var": float("nan") if step == 1 else 0.3,  # orjson writes NaN as null
        "response_length/mean": 180.5,
        "response_length/clip_ratio": 0.01,
        "prompt_length/mean": 95.0,
        "timing_s/gen": 12.5,
        "timing_s/update_actor": 4.25,
        "timing_s/step": 20.0,
        "timing_per_token_ms/gen": 0.02,
        "perf/total_num_tokens": 65536,
        "perf/time_per_step": 20.0,
        "perf/throughput": 1638.4,
        "perf/mfu/actor": 0.31,
        "perf/max_memory_allocated_gb": 41.2,
        "training/global_step": step,
        "training/epoch": 0,
    }
    if validate:
        metrics["val-core/openai/gsm8k/reward/mean@1"] = 0.05 * step
        metrics["val-aux/openai/gsm8k/reward/best@4/mean"] = 0.07 * step
    return metrics


def orjson_like(obj: Any) -> bytes:
    """Compact JSON like orjson (what verl's FileLogger uses): NaN and infinities become null; no newline."""
    return orjson_line(obj)[:-1]


def rollout_rows(step: int, n: int = 8) -> list[dict[str, Any]]:
    """Rows of one ``{step}.jsonl`` dump: input, output, gts, score, step, reward extra info."""
    rng = random.Random(1000 + step)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        correct = rng.random() < 0.4
        rows.append(
            {
                "input": f"<|im_start|>user\nWhat is {a} + {b}? Think step by step.<|im_end|>\n<|im_start|>assistant\n",
                "output": f"{a} plus {b} is {a + b if correct else a + b + 1}. #### {a + b if correct else a + b + 1}",
                "gts": str(a + b),
                "score": 1.0 if correct else round(rng.random() * 0.1, 4),
                "step": step,
                "acc": correct,
            }
        )
    return rows


def top_indices(rows: list[dict[str, Any]], k: int) -> list[int]:
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]["score"], i))
    return order[:k]


@dataclass
class VerlRun:
    """Writes a verl run directory the way verl does (FSDP checkpoints, file logger, dumps)."""

    root: Path
    world_size: int = 2
    rows_per_step: int = 8
    dumps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _fp: Any = None
    _partial: Any = None

    def __post_init__(self) -> None:
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def ckpt_root(self) -> Path:
        return self.root / "checkpoints" / PROJECT / EXPERIMENT  # trainer.default_local_dir

    @property
    def rollout_dir(self) -> Path:
        return self.root / "rollouts"

    @property
    def log_path(self) -> Path:
        return self.root / "logs" / PROJECT / f"{EXPERIMENT}.jsonl"  # $VERL_FILE_LOGGER_ROOT/project/exp.jsonl

    @property
    def tracker(self) -> Path:
        return self.ckpt_root / "latest_checkpointed_iteration.txt"

    # -- the file logger -------------------------------------------------------------------------
    def start(self) -> None:
        """verl's Tracking(..., default_backend=[..., "file"]): FileLogger opens the file with "wb"."""
        if self._fp is not None:
            self._fp.close()
        self._fp = open(self.log_path, "wb", buffering=0)  # noqa: SIM115 (kept open like verl)

    def log(self, step: int, metrics: dict[str, Any] | None = None, validate: bool = False) -> None:
        self._fp.write(orjson_like({"step": step, "data": metrics or verl_metrics(step, validate)}) + b"\n")

    def torn_log_line(self, step: int) -> None:
        """Half of a line (a write in flight)."""
        self._fp.write(orjson_like({"step": step, "data": verl_metrics(step)})[:40])

    # -- rollout dumps ---------------------------------------------------------------------------
    def dump(self, step: int, rows: list[dict[str, Any]] | None = None) -> Path:
        """_dump_generations: one buffered text write of all lines."""
        rows = rows if rows is not None else rollout_rows(step, self.rows_per_step)
        self.dumps[step] = rows
        self.rollout_dir.mkdir(parents=True, exist_ok=True)
        path = self.rollout_dir / f"{step}.jsonl"
        with open(path, "w") as fh:
            fh.write("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
        return path

    def partial_dump(self, step: int, cut: float = 0.6) -> Path:
        """A dump caught mid-write: the buffer flushed up to ``cut`` of it, inside a line."""
        rows = rollout_rows(step, self.rows_per_step)
        self.dumps[step] = rows
        self.rollout_dir.mkdir(parents=True, exist_ok=True)
        text = ("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n").encode()
        path = self.rollout_dir / f"{step}.jsonl"
        cut_at = int(len(text) * cut)
        while text[cut_at - 1 : cut_at] == b"\n":
            cut_at += 1
        self._partial = (path, text)
        path.write_bytes(text[:cut_at])
        return path

    def finish_partial_dump(self) -> None:
        path, text = self._partial
        path.write_bytes(text)
        self._partial = None

    # -- checkpoints -------------------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.ckpt_root / f"global_step_{step}"

    def save_checkpoint(self, step: int, tracker: bool = True, critic: bool = True, only_actor: bool = False) -> Path:
        """_save_checkpoint: actor (and critic) shards per rank, huggingface/, data.pt, then the tracker."""
        directory = self.step_dir(step)
        for role in ("actor", "critic") if critic else ("actor",):
            self._write_role(directory / role, step)
            if only_actor:
                return directory  # a crash before the critic and data.pt
        (directory / "data.pt").write_bytes(random.Random(step).randbytes(3000))  # torch.save(dataloader state)
        if tracker:
            with open(self.tracker, "w") as fh:  # not atomic, no fsync: like verl
                fh.write(str(step))
        return directory

    def _write_role(self, role_dir: Path, step: int) -> None:
        hf = role_dir / "huggingface"
        hf.mkdir(parents=True, exist_ok=True)
        rng = random.Random(f"{role_dir.name}-{step}")
        for rank in range(self.world_size):
            suffix = f"world_size_{self.world_size}_rank_{rank}.pt"
            (role_dir / f"model_{suffix}").write_bytes(rng.randbytes(20_000))
            (role_dir / f"optim_{suffix}").write_bytes(rng.randbytes(40_000))
            (role_dir / f"extra_state_{suffix}").write_bytes(rng.randbytes(500))
        (role_dir / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": self.world_size}))
        (hf / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
        (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645}))
        (hf / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
        (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
        (hf / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))

    def write_tracker_partially(self, text: str) -> None:
        self.tracker.write_text(text)

    def close(self) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None

    # -- one training step as RayPPOTrainer.fit does it ---------------------------------------------
    def train_step(self, step: int, save: bool = False, validate: bool = False) -> None:
        """Rollout dump, then checkpoint (if due), then the step's log line."""
        self.dump(step)
        if save:
            self.save_checkpoint(step)
        self.log(step, validate=validate)


class Clock:
    """``time.time()`` plus an offset the test moves forward (files age without sleeping)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def read_journal(run_dir: Path) -> list[Event]:
    return [event for event, _ in JournalReader(str(run_dir / "events.jsonl")).read_available()]


def of_type(events: list[Event], etype: str) -> list[Event]:
    return [e for e in events if e.type == etype]


@dataclass
class Keys:
    """A signing key pair in a tmp dir (never in the repo)."""

    dir: Path

    @property
    def key(self) -> Path:
        return self.dir / "signing.key"

    @property
    def pub(self) -> Path:
        return self.dir / "signing.pub"


@pytest.fixture
def verl_run(tmp_path):
    run = VerlRun(tmp_path / "verl")
    yield run
    run.close()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def signing_keys(tmp_path):
    if not have_module("warden.signing.keys"):
        pytest.skip("warden.signing.keys is not there yet (signer sidecar not landed)")
    from warden.signing.keys import generate_keypair

    keys = Keys(tmp_path / "keys")
    generate_keypair(keys.dir)
    return keys


@pytest.fixture
def signer_policy(tmp_path, signing_keys):
    """A signer policy that signs on checkpoint.saved only (no watched roots) with the test key."""
    if not have_module("sidecars.signer.sidecar"):
        pytest.skip("sidecars.signer.sidecar is not there yet (signer sidecar not landed)")
    path = tmp_path / "signer.yaml"
    doc = {
        "version": 1,
        "signing_key": str(signing_keys.key),
        "check_interval_seconds": 0.05,
        "rescan_seconds": 60,
        "stable_seconds": 0,
        "reverify_interval_seconds": 0,
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def archiver_policy_doc(store_dir: Path, key: Path, top_k: int) -> dict[str, Any]:
    return {
        "version": 1,
        "store": store_dir.as_uri(),
        "signing_key": str(key),
        "top_k": top_k,
        "retention": {"mode": "none", "days": 0, "require_object_lock": False},
        "upload_concurrency": 2,
        "check_interval_seconds": 0.1,
    }


@pytest.fixture
def archiver_setup(tmp_path, signing_keys):
    """(policy path, store dir) for the archiver with a file:// store and the test key."""
    if not have_module("sidecars.archiver.sidecar"):
        pytest.skip("sidecars.archiver.sidecar is not there yet (archiver sidecar not landed)")
    store = tmp_path / "store"
    store.mkdir()
    path = tmp_path / "archiver.yaml"
    path.write_text(yaml.safe_dump(archiver_policy_doc(store, signing_keys.key, top_k=3)))
    return str(path), store


@pytest.fixture
def verl_kit():
    """The module's helpers, for tests (they do not import each other)."""

    class Kit:
        verl_metrics = staticmethod(verl_metrics)
        rollout_rows = staticmethod(rollout_rows)
        top_indices = staticmethod(top_indices)
        read_journal = staticmethod(read_journal)
        of_type = staticmethod(of_type)
        orjson_like = staticmethod(orjson_like)
        have_module = staticmethod(have_module)
        experiment = EXPERIMENT

    return Kit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A ~100k-parameter Llama and its byte-level BPE tokenizer, built offline once (HF tests)."""
    from trainer.assets import ensure_tiny_assets
    from trainer.config import TinyAssets

    spec = TinyAssets(
        cache_dir=str(tmp_path_factory.mktemp("tiny")),
        vocab_size=300,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        num_prompts=16,
    )
    return ensure_tiny_assets(spec)
