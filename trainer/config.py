"""Trainer configuration: YAML -> frozen dataclasses, validated before any model loads.

``load_config(path, overrides)`` applies ``--set a.b=value`` overrides (values parsed
as YAML scalars) and raises :class:`ConfigError` (exit 2) naming the file and the key.
Unknown keys are errors. Batch rules follow verl's checks: ``train_batch_size *
rollout.n`` divisible by the world size, ``mini_batch_size <= train_batch_size``,
``mini_batch_size`` divisible by ``micro_batch_size``, clip ratios in range, a known
loss aggregation mode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from sidecars.errors import ConfigError
from sidecars.policy import policy_from_mapping
from trainer.ppo import KL_PENALTY_KINDS, LOSS_AGG_MODES


@dataclass(frozen=True)
class TinyAssets:
    """Build a tiny tokenizer, model and prompt file offline (no model hub)."""

    cache_dir: str = ""  # empty: ~/.cache/warden/tiny
    vocab_size: int = 320
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    num_prompts: int = 256


@dataclass(frozen=True)
class RunConfig:
    run_id: str = ""  # empty: <config name>-<UTC time>
    seed: int = 1
    device: str = "cpu"  # cpu | cuda | auto
    gpu_uuids: tuple[str, ...] = ()
    torch_threads: int = 0  # 0: torch's default
    metrics_port: int = 9460  # 0: no /metrics
    metrics_listen: str = "127.0.0.1"
    console: bool = True


@dataclass(frozen=True)
class ModelConfig:
    actor_path: str = ""
    critic_path: str = ""  # empty: same weights as the actor, plus a fresh value head
    tokenizer_path: str = ""  # empty: actor_path
    reward_model_path: str = ""
    dtype: str = "float32"
    allowed_tokenizer_classes: tuple[str, ...] = (
        "LlamaTokenizer",
        "LlamaTokenizerFast",
        "Qwen2Tokenizer",
        "Qwen2TokenizerFast",
        "GemmaTokenizer",
        "GemmaTokenizerFast",
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
    )
    tiny: TinyAssets | None = None


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    ground_truth_key: str = "ground_truth"
    max_prompt_tokens: int = 32
    shuffle: bool = True


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"  # hf (model.generate on the actor) | vllm (in-process vllm.LLM, extra `vllm`)
    n: int = 1  # responses per prompt
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    progress: bool = True
    # vllm engine only. gpu_memory_utilization: share of the device's memory vLLM may take for its
    # weights and KV cache (the trainer's models share the device, so well under 1).
    gpu_memory_utilization: float = 0.4
    max_num_seqs: int = 0  # 0: the rollout batch (train_batch_size x n); else at least that
    max_num_batched_tokens: int = 0  # 0: vLLM's default; else at least max_num_seqs
    kv_cache_gib: float = 0.0  # 0: from gpu_memory_utilization on a GPU, from the batch's needs on CPU
    enforce_eager: bool = False  # true: no CUDA graphs or torch.compile (quicker start, slower decoding)


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = "gae"  # gae | grpo
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    kl_coef: float = 0.01
    kl_kind: str = "k3"
    kl_controller: str = "fixed"  # fixed | adaptive
    kl_target: float = 0.05
    kl_horizon: float = 10000.0


@dataclass(frozen=True)
class PPOConfig:
    train_batch_size: int = 8  # prompts per step
    mini_batch_size: int = 8  # responses per optimizer step
    micro_batch_size: int = 4  # responses per forward/backward
    epochs: int = 1
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    value_clip: float = 0.5
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    actor_lr: float = 1e-4
    critic_lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0


@dataclass(frozen=True)
class RewardConfig:
    kind: str = "rule"  # rule | model
    rule: str = "digits"  # digits | arithmetic


@dataclass(frozen=True)
class SnapshotConfig:
    top_k: int = 4
    min_reward: float | None = None
    max_text_chars: int = 4000


@dataclass(frozen=True)
class CheckpointConfig:
    """Where checkpoints go, and what a resume trusts (trainer/resume.py has the details).

    ``trusted_keys`` (a ``.pub`` file or a directory of them) set: a resume accepts only a
    checkpoint with a valid signature by one of these keys whose signed run id and step
    match, unconditionally; an unsigned one (also one the signer has not reached yet) is
    rejected. Unset: only ``manifest.sha256.json`` is checked, which guards against
    accidents, not against anyone who can write the checkpoint storage.
    There is no switch to accept unsigned checkpoints once keys are set (the old
    ``allow_unsigned`` and ``require_signature`` keys are refused as unknown keys).
    """

    root: str = ""  # empty: <run_dir>/checkpoints
    every_steps: int = 10
    keep_last: int = 3
    write_retries: int = 2
    trusted_keys: str = ""  # file or directory of *.pub (relative: to the config file); set: signed only


@dataclass(frozen=True)
class OOMConfig:
    action: str = "fail"  # fail | skip
    raise_at_step: int = 0  # test hook: raise OutOfMemoryError at this step (0: never)


@dataclass(frozen=True)
class PreflightConfig:
    required_env: dict[str, str] = field(default_factory=dict)  # NAME -> regex ('' = any non-empty)
    check_paths: bool = True  # probe model, tokenizer, data and checkpoint root in child processes
    deadline_seconds: float = 10.0


@dataclass(frozen=True)
class TrainerConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    oom: OOMConfig = field(default_factory=OOMConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    max_steps: int = 20
    log_every: int = 1

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the whole config, hex."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def apply_overrides(raw: dict[str, Any], overrides: list[str], where: str) -> dict[str, Any]:
    """Applies ``a.b.c=value`` strings to a parsed config; values are YAML scalars."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set ppo.actor_lr=1e-5")
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{where}: --set {key}: {part} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(text) if text else ""
    return raw


def load_config(path: str, overrides: list[str] | None = None) -> TrainerConfig:
    """Reads, overrides and validates a trainer config. Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with 'version: 1'")
    raw = apply_overrides(raw, list(overrides or []), path)
    config = policy_from_mapping(raw, TrainerConfig, path)
    validate(config, path)
    return anchor_trust_paths(config, path)


def anchor_trust_paths(config: TrainerConfig, config_path: str) -> TrainerConfig:
    """``checkpoint.trusted_keys`` made absolute against the config file's directory.

    What a resume trusts must not depend on the directory the trainer was started from
    (a relative path there could pick up keys an attacker planted in the job's cwd).
    """
    keys = config.checkpoint.trusted_keys
    if not keys or os.path.isabs(keys):
        return config
    anchored = os.path.join(os.path.dirname(os.path.abspath(config_path)), keys)
    return dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, trusted_keys=anchored))


def _require(ok: bool, where: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {key}: {message}")


def validate(cfg: TrainerConfig, where: str = "<config>", world_size: int = 1) -> None:
    """The rules that need no file system. Raises ConfigError naming the key."""
    ppo, roll, alg = cfg.ppo, cfg.rollout, cfg.algorithm
    responses = ppo.train_batch_size * roll.n
    _require(ppo.train_batch_size > 0, where, "ppo.train_batch_size", "must be > 0")
    _require(roll.n > 0, where, "rollout.n", "must be > 0")
    _require(
        responses % world_size == 0,
        where,
        "ppo.train_batch_size",
        f"train_batch_size x rollout.n = {responses} is not divisible by the world size {world_size}",
    )
    _require(
        0 < ppo.mini_batch_size <= responses,
        where,
        "ppo.mini_batch_size",
        f"must be in 1..train_batch_size x rollout.n ({responses}), got {ppo.mini_batch_size}",
    )
    _require(
        responses % ppo.mini_batch_size == 0,
        where,
        "ppo.mini_batch_size",
        f"must divide train_batch_size x rollout.n ({responses})",
    )
    _require(
        ppo.micro_batch_size > 0 and ppo.mini_batch_size % ppo.micro_batch_size == 0,
        where,
        "ppo.micro_batch_size",
        f"must divide mini_batch_size ({ppo.mini_batch_size})",
    )
    _require(
        (ppo.mini_batch_size // world_size) % ppo.micro_batch_size == 0 or world_size == 1,
        where,
        "ppo.micro_batch_size",
        f"must divide mini_batch_size / world size ({ppo.mini_batch_size // world_size})",
    )
    _require(0 <= ppo.clip_ratio_low < 1, where, "ppo.clip_ratio_low", "must be in [0, 1)")
    _require(ppo.clip_ratio_high >= 0, where, "ppo.clip_ratio_high", "must be >= 0")
    _require(ppo.clip_ratio_c > 1, where, "ppo.clip_ratio_c", "must be > 1 (dual clip)")
    _require(
        ppo.loss_agg_mode in LOSS_AGG_MODES,
        where,
        "ppo.loss_agg_mode",
        f"unknown mode {ppo.loss_agg_mode!r}; use one of {', '.join(sorted(LOSS_AGG_MODES))}",
    )
    _require(ppo.epochs > 0, where, "ppo.epochs", "must be > 0")
    _require(alg.adv_estimator in ("gae", "grpo"), where, "algorithm.adv_estimator", "must be gae or grpo")
    _require(alg.adv_estimator != "grpo" or roll.n > 1, where, "rollout.n", "grpo needs rollout.n > 1")
    _require(alg.kl_kind in KL_PENALTY_KINDS, where, "algorithm.kl_kind", f"must be one of {sorted(KL_PENALTY_KINDS)}")
    _require(alg.kl_controller in ("fixed", "adaptive"), where, "algorithm.kl_controller", "must be fixed or adaptive")
    _require(0 <= alg.gamma <= 1 and 0 <= alg.lam <= 1, where, "algorithm.gamma", "gamma and lam must be in [0, 1]")
    _require(roll.engine in ("hf", "vllm"), where, "rollout.engine", "must be hf or vllm")
    _require(roll.max_new_tokens > 0, where, "rollout.max_new_tokens", "must be > 0")
    _require(roll.temperature > 0, where, "rollout.temperature", "must be > 0 (log-probs are divided by it)")
    if roll.engine == "vllm":
        validate_vllm(cfg, where, world_size)
    _require(cfg.reward.kind in ("rule", "model"), where, "reward.kind", "must be rule or model")
    _require(cfg.reward.rule in ("digits", "arithmetic"), where, "reward.rule", "must be digits or arithmetic")
    _require(cfg.oom.action in ("fail", "skip"), where, "oom.action", "must be fail or skip")
    _require(cfg.run.device in ("cpu", "cuda", "auto"), where, "run.device", "must be cpu, cuda or auto")
    _require(
        cfg.model.dtype in ("float32", "bfloat16", "float16"),
        where,
        "model.dtype",
        "must be float32, bfloat16 or float16",
    )
    _require(cfg.checkpoint.every_steps >= 0, where, "checkpoint.every_steps", "must be >= 0 (0: never)")
    _require(cfg.checkpoint.keep_last >= 1, where, "checkpoint.keep_last", "must be >= 1")
    _require(cfg.max_steps >= 0, where, "max_steps", "must be >= 0")


def validate_vllm(cfg: TrainerConfig, where: str, world_size: int) -> None:
    """The vllm engine's memory settings: the engine must hold the whole rollout batch at once."""
    roll = cfg.rollout
    responses = cfg.ppo.train_batch_size * roll.n
    _require(
        world_size == 1,
        where,
        "rollout.engine",
        f"vllm runs in-process on one device; use hf for a {world_size}-process run",
    )
    _require(
        0 < roll.gpu_memory_utilization <= 1,
        where,
        "rollout.gpu_memory_utilization",
        f"must be in (0, 1], got {roll.gpu_memory_utilization}",
    )
    _require(
        roll.max_num_seqs == 0 or roll.max_num_seqs >= responses,
        where,
        "rollout.max_num_seqs",
        f"must cover the rollout batch (train_batch_size x rollout.n = {responses}) or be 0 (that batch), "
        f"got {roll.max_num_seqs}",
    )
    seqs = roll.max_num_seqs or responses
    _require(
        roll.max_num_batched_tokens == 0 or roll.max_num_batched_tokens >= seqs,
        where,
        "rollout.max_num_batched_tokens",
        f"must be at least max_num_seqs ({seqs}) so every sequence decodes in each step, or 0 (vLLM's default), "
        f"got {roll.max_num_batched_tokens}",
    )
    _require(roll.kv_cache_gib >= 0, where, "rollout.kv_cache_gib", "must be >= 0 (0: sized automatically)")
