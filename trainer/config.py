"""Trainer configuration: YAML -> frozen dataclasses, validated before any model loads.

``load_config(path, overrides)`` applies ``--set a.b=value`` overrides (values parsed
as YAML 1.2 scalars, so ``1e-5`` is a number) and raises :class:`ConfigError` (exit 2)
naming the file and the key. Unknown keys are errors. Every numeric key has a range
(:data:`RANGES`; a test checks none is missing). Batch rules follow verl's checks and are
checked against the torchrun world size (``WORLD_SIZE``) before any rank loads a model:
``train_batch_size * rollout.n`` and ``mini_batch_size`` divisible by the world size,
each rank's share of a minibatch divisible by ``micro_batch_size``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from trainer.ppo import KL_PENALTY_KINDS, LOSS_AGG_MODES
from warden.errors import ConfigError
from warden.policy import policy_from_mapping
from warden.tokenscan.policy import DEFAULT_TOKENIZER_CLASSES


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
class LoraConfig:
    """``model.lora``: train low-rank adapters (peft) on a frozen base instead of every weight.

    The reference policy is the base with the adapters disabled; ``critic`` shared: a value head on
    the same base with its own adapter (one copy of the base weights); separate: today's critic (a
    whole model from ``model.critic_path``, trained in full). See :mod:`trainer.lora`.
    """

    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    critic: str = "shared"  # shared | separate


LORA_CRITICS = ("shared", "separate")


@dataclass(frozen=True)
class ModelConfig:
    actor_path: str = ""
    critic_path: str = ""  # empty: same weights as the actor, plus a fresh value head
    tokenizer_path: str = ""  # empty: actor_path
    reward_model_path: str = ""
    dtype: str = "float32"
    # One whitelist: the tokenizer scanner's (a config can narrow it; the guard takes both lists' intersection).
    allowed_tokenizer_classes: tuple[str, ...] = DEFAULT_TOKENIZER_CLASSES
    tiny: TinyAssets | None = None
    lora: LoraConfig | None = None  # absent: full fine-tuning


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    ground_truth_key: str = "ground_truth"
    max_prompt_tokens: int = 32
    shuffle: bool = True
    # A prompt longer than max_prompt_tokens: error (exit 2 at start, as verl), left (keep the end:
    # the question usually comes last), right (keep the start).
    truncation: str = "error"
    apply_chat_template: bool = True  # chat-format prompts (lists of messages) through the tokenizer's template
    data_source_key: str = "data_source"  # passed to custom reward functions (verl's compute_score)


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"  # hf (model.generate on the actor) | vllm (in-process vllm.LLM, extra `vllm`)
    n: int = 1  # responses per prompt
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    progress: bool = True
    stop_token_ids: tuple[int, ...] = ()  # stop on any of these as well as the tokenizer's EOS
    # hf engine: static KV cache + compiled forward, prompts padded to max_prompt_tokens (no recompiles).
    # auto: on CUDA only; on: required (config error off CUDA); off: dynamic cache.
    static_cache: str = "auto"
    # vllm engine only. gpu_memory_utilization: share of the device's memory vLLM may take for its
    # weights and KV cache (the trainer's models share the device, so well under 1).
    gpu_memory_utilization: float = 0.4
    max_num_seqs: int = 0  # 0: the rollout batch (train_batch_size x n); else at least that
    max_num_batched_tokens: int = 0  # 0: vLLM's default; else at least max_num_seqs
    kv_cache_gib: float = 0.0  # 0: from gpu_memory_utilization on a GPU, from the batch's needs on CPU
    enforce_eager: bool = False  # true: no CUDA graphs or torch.compile (quicker start, slower decoding)
    # Rollout on its own devices (trainer/rollout_split.py): empty: colocated with the trainer ranks;
    # GPU indices or UUIDs (GPU-...) of this node, disjoint from the trainer's; ["cpu"]: a separate
    # rollout process on the host CPU (tests). tensor_parallel_size: vllm only, = len(devices).
    devices: tuple[Any, ...] = ()
    tensor_parallel_size: int = 1
    join_timeout_s: float = 600.0  # split: the rollout process loads its engine and joins within it, else an error


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = "gae"  # gae | grpo
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    use_kl_in_reward: bool = True  # subtract kl_coef x KL from the token rewards (GAE and GRPO alike)
    kl_coef: float = 0.01
    kl_kind: str = "k1"  # in-reward estimator; k1 as verl's algorithm.kl_penalty default
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
    # KL to the reference as a loss term (verl's actor.use_kl_loss), the usual choice for GRPO.
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"


@dataclass(frozen=True)
class RewardConfig:
    """Rewards: one built-in (kind/rule), or a weighted sum of several (``functions``).

    ``functions`` maps a name to its weight: ``digits`` and ``arithmetic`` (built in), ``model``
    (the sequence classifier at ``model.reward_model_path``, with its own tokenizer), or
    ``module:function`` loaded from ``code_dir`` only (verl's ``compute_score(data_source,
    solution_str, ground_truth, extra_info)`` signature).
    """

    kind: str = "rule"  # rule | model (used when functions is empty)
    rule: str = "digits"  # digits | arithmetic
    functions: dict[str, float] = field(default_factory=dict)
    code_dir: str = ""  # the run's own code: relative to the config file; empty: the config file's directory
    model_tokenizer_path: str = ""  # the reward model's tokenizer; empty: model.reward_model_path


@dataclass(frozen=True)
class SnapshotConfig:
    top_k: int = 4
    min_reward: float | None = None
    max_text_chars: int = 4000


ASYNC_SAVE_CHOICES = ("auto", "on", "off")
ASYNC_FALLBACK_CHOICES = ("fail", "sync")
ON_NO_SPACE_CHOICES = ("prune_first", "skip", "fail")


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
    # How the announced digest is serialised (model_signing's): files (per-file sha256) or shards
    # (shard_size-byte pieces); the signer's policy must sign the same, or it refuses the checkpoint.
    serialization: str = "files"
    shard_size: int = 256 << 20
    # Asynchronous saves (trainer/saver.py): the step copies the state into reused host buffers
    # (pinned on CUDA) and a writer thread serialises, hashes, writes and announces it. auto: on
    # for CUDA, off on CPU. When the host memory cannot be had: fail, or sync (log and go on).
    async_save: str = "auto"
    async_fallback: str = "fail"
    # A save that would not fit the checkpoint root's free space (trainer/space.py): prune_first
    # (remove the oldest announced checkpoints first; skip when even that is not enough), skip
    # (no checkpoint this time; event, metric, page) or fail (stop cleanly, exit 1).
    on_no_space: str = "prune_first"


@dataclass(frozen=True)
class ValidationConfig:
    """A held-out set generated and scored every ``every_steps`` (0: never); greedy when temperature is 0."""

    every_steps: int = 0
    files: tuple[str, ...] = ()
    max_prompts: int = 0  # 0: all
    temperature: float = 0.0
    batch_size: int = 64


@dataclass(frozen=True)
class OOMConfig:
    action: str = "fail"  # fail | skip
    raise_at_step: int = 0  # test hook: raise OutOfMemoryError at this step (0: never)


PARALLEL_STRATEGIES = ("ddp", "fsdp2")


@dataclass(frozen=True)
class ParallelConfig:
    """How the trained models are spread over torchrun's ranks (trainer/fsdp.py).

    ``ddp``: every rank holds whole models, gradients all-reduced (a one-process run: no wrapper).
    ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` shards the actor, the critic and the frozen
    reference within each shard group of ``shard_group_size`` ranks (0: a node's ranks), replicated
    across the groups (dim 0 of each parameter, one FSDP unit per decoder layer); each rank of the
    first group writes its own tile files to a checkpoint, which resumes at any world size. Does not shape
    training (a resume may change it: the checkpoint formats load into either strategy).
    """

    strategy: str = "ddp"
    # fsdp2: ranks per shard group, replicated across groups (HSDP); 0: one group per node
    shard_group_size: int = 0


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
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    max_steps: int = 20
    log_every: int = 1

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies the read-only mappings the policy loader makes
        # (reward.functions) and fails on them ("cannot pickle 'mappingproxy'").
        plain: dict[str, Any] = _plain(self)
        return plain

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the whole config, hex."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e-5`` and ``3E4`` are numbers, not strings."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z"),
    list("-+0123456789."),
)


def yaml_load(text: Any) -> Any:
    """YAML 1.2-style scalars (see :class:`_Yaml12Loader`); ``text`` a string or an open file."""
    return yaml.load(text, Loader=_Yaml12Loader)


def apply_overrides(raw: dict[str, Any], overrides: list[str], where: str) -> dict[str, Any]:
    """Applies ``a.b.c=value`` strings to a parsed config; values are YAML 1.2 scalars."""
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
        try:
            node[parts[-1]] = yaml_load(text) if text else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: --set {key}: not a YAML value ({exc})") from None
    return raw


def load_config(path: str, overrides: list[str] | None = None) -> TrainerConfig:
    """Reads, overrides and validates a trainer config. Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with 'version: 1'")
    raw = apply_overrides(raw, list(overrides or []), path)
    config = policy_from_mapping(raw, TrainerConfig, path)
    validate(config, path, launcher_world_size())
    return anchor_trust_paths(config, path)


def launcher_world_size(environ: dict[str, str] | None = None) -> int:
    """The world size torchrun announces (``WORLD_SIZE``), 1 without it; ConfigError when malformed."""
    text = (os.environ if environ is None else environ).get("WORLD_SIZE", "1")
    try:
        world = int(text)
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={text!r} is not an integer") from None
    if world < 1:
        raise ConfigError(f"WORLD_SIZE={world} must be >= 1")
    return world


def anchor_trust_paths(config: TrainerConfig, config_path: str) -> TrainerConfig:
    """``checkpoint.trusted_keys`` made absolute against the config file's directory.

    What a resume trusts must not depend on the directory the trainer was started from
    (a relative path there could pick up keys an attacker planted in the job's cwd).
    """
    base = os.path.dirname(os.path.abspath(config_path))
    keys = config.checkpoint.trusted_keys
    if keys and not os.path.isabs(keys):
        anchored = os.path.join(base, keys)
        config = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, trusted_keys=anchored))
    code = config.reward.code_dir
    if not os.path.isabs(code):  # the run's own code directory: next to its config, never the cwd
        config = dataclasses.replace(
            config, reward=dataclasses.replace(config.reward, code_dir=os.path.normpath(os.path.join(base, code)))
        )
    return config


def _require(ok: bool, where: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {key}: {message}")


@dataclass(frozen=True)
class Range:
    """Allowed values of one numeric key: ``lo <(=) value <(=) hi``; None = unbounded; always finite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (None when it is in). Pure."""
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        low_ok = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        high_ok = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return None if low_ok and high_ok else f"must be in {self.text()}, got {value!r}"

    def text(self) -> str:
        left = "-inf" if self.lo is None else f"{self.lo:g}"
        right = "inf" if self.hi is None else f"{self.hi:g}"
        opening = "(" if self.lo_open or self.lo is None else "["
        closing = ")" if self.hi_open or self.hi is None else "]"
        return f"{opening}{left}, {right}{closing}"


POSITIVE = Range(0, None, lo_open=True)
NON_NEGATIVE = Range(0, None)
AT_LEAST_1 = Range(1, None)
UNIT = Range(0, 1)
ANY = Range()

RANGES: dict[str, Range] = {
    "run.seed": NON_NEGATIVE,
    "run.torch_threads": NON_NEGATIVE,
    "run.metrics_port": Range(0, 65535),
    "model.tiny.vocab_size": Range(16, None),
    "model.tiny.hidden_size": AT_LEAST_1,
    "model.tiny.num_layers": AT_LEAST_1,
    "model.tiny.num_heads": AT_LEAST_1,
    "model.tiny.intermediate_size": AT_LEAST_1,
    "model.tiny.num_prompts": AT_LEAST_1,
    "model.lora.rank": AT_LEAST_1,
    "model.lora.alpha": POSITIVE,
    "model.lora.dropout": Range(0, 1, hi_open=True),
    "data.max_prompt_tokens": AT_LEAST_1,
    "rollout.n": AT_LEAST_1,
    "rollout.max_new_tokens": AT_LEAST_1,
    "rollout.temperature": POSITIVE,
    "rollout.top_p": Range(0, 1, lo_open=True),
    "rollout.top_k": NON_NEGATIVE,
    "rollout.stop_token_ids": NON_NEGATIVE,
    "rollout.gpu_memory_utilization": Range(0, 1, lo_open=True),
    "rollout.max_num_seqs": NON_NEGATIVE,
    "rollout.max_num_batched_tokens": NON_NEGATIVE,
    "rollout.kv_cache_gib": NON_NEGATIVE,
    "rollout.devices": NON_NEGATIVE,
    "rollout.tensor_parallel_size": AT_LEAST_1,
    "rollout.join_timeout_s": POSITIVE,
    "algorithm.gamma": UNIT,
    "algorithm.lam": UNIT,
    "algorithm.kl_coef": NON_NEGATIVE,
    "algorithm.kl_target": POSITIVE,
    "algorithm.kl_horizon": POSITIVE,
    "ppo.train_batch_size": AT_LEAST_1,
    "ppo.mini_batch_size": AT_LEAST_1,
    "ppo.micro_batch_size": AT_LEAST_1,
    "ppo.epochs": AT_LEAST_1,
    "ppo.clip_ratio_low": Range(0, 1, hi_open=True),
    "ppo.clip_ratio_high": NON_NEGATIVE,
    "ppo.clip_ratio_c": Range(1, None, lo_open=True),
    "ppo.value_clip": POSITIVE,
    "ppo.entropy_coef": NON_NEGATIVE,
    "ppo.actor_lr": POSITIVE,
    "ppo.critic_lr": POSITIVE,
    "ppo.weight_decay": NON_NEGATIVE,
    "ppo.grad_clip": POSITIVE,
    "ppo.warmup_steps": NON_NEGATIVE,
    "ppo.kl_loss_coef": NON_NEGATIVE,
    "reward.functions": ANY,
    "snapshot.top_k": NON_NEGATIVE,
    "snapshot.min_reward": ANY,
    "snapshot.max_text_chars": AT_LEAST_1,
    "checkpoint.every_steps": NON_NEGATIVE,
    "checkpoint.keep_last": AT_LEAST_1,
    "checkpoint.write_retries": NON_NEGATIVE,
    "checkpoint.shard_size": AT_LEAST_1,
    "oom.raise_at_step": NON_NEGATIVE,
    "preflight.deadline_seconds": POSITIVE,
    "validation.every_steps": NON_NEGATIVE,
    "validation.max_prompts": NON_NEGATIVE,
    "validation.temperature": NON_NEGATIVE,
    "validation.batch_size": AT_LEAST_1,
    "parallel.shard_group_size": NON_NEGATIVE,
    "max_steps": NON_NEGATIVE,
    "log_every": AT_LEAST_1,
}
"""Every numeric key (scalars, and each element of numeric lists and mappings) and its range."""


def numeric_values(obj: Any, prefix: str = "") -> list[tuple[str, str, float]]:
    """``(range key, display key, value)`` of every number in a config tree (a dataclass). Pure."""
    out: list[tuple[str, str, float]] = []
    for fld in dataclasses.fields(obj):
        key, value = prefix + fld.name, getattr(obj, fld.name)
        if dataclasses.is_dataclass(value):
            out += numeric_values(value, key + ".")
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int | float):
            out.append((key, key, float(value)))
        elif isinstance(value, tuple):
            out += [(key, f"{key}[{i}]", float(v)) for i, v in enumerate(value) if isinstance(v, int | float)]
        elif hasattr(value, "items"):
            out += [(key, f"{key}.{k}", float(v)) for k, v in value.items() if isinstance(v, int | float)]
    return out


def check_ranges(cfg: TrainerConfig, where: str) -> None:
    """Every number against :data:`RANGES`; ConfigError naming the first key out of range."""
    for range_key, shown, value in numeric_values(cfg):
        allowed = RANGES.get(range_key)
        if allowed is None:
            raise ConfigError(f"{where}: {shown}: no range declared for this key (trainer/config.py RANGES)")
        _require(allowed.problem(value) is None, where, shown, allowed.problem(value) or "")


def _choices(where: str, key: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, where, key, f"must be one of {', '.join(allowed)}, got {value!r}")


def validate(cfg: TrainerConfig, where: str = "<config>", world_size: int = 1) -> None:
    """The rules that need no file system. Raises ConfigError naming the key."""
    check_ranges(cfg, where)
    check_batches(cfg, where, world_size)
    ppo, roll, alg = cfg.ppo, cfg.rollout, cfg.algorithm
    _require(
        ppo.loss_agg_mode in LOSS_AGG_MODES,
        where,
        "ppo.loss_agg_mode",
        f"unknown mode {ppo.loss_agg_mode!r}; use one of {', '.join(sorted(LOSS_AGG_MODES))}",
    )
    _choices(where, "algorithm.adv_estimator", alg.adv_estimator, ("gae", "grpo"))
    _require(alg.adv_estimator != "grpo" or roll.n > 1, where, "rollout.n", "grpo needs rollout.n > 1")
    _require(alg.kl_kind in KL_PENALTY_KINDS, where, "algorithm.kl_kind", f"must be one of {sorted(KL_PENALTY_KINDS)}")
    _require(
        ppo.kl_loss_type in KL_PENALTY_KINDS, where, "ppo.kl_loss_type", f"must be one of {sorted(KL_PENALTY_KINDS)}"
    )
    _choices(where, "algorithm.kl_controller", alg.kl_controller, ("fixed", "adaptive"))
    _choices(where, "rollout.engine", roll.engine, ("hf", "vllm"))
    _choices(where, "checkpoint.serialization", cfg.checkpoint.serialization, ("files", "shards"))
    _choices(where, "checkpoint.async_save", cfg.checkpoint.async_save, ASYNC_SAVE_CHOICES)
    _choices(where, "checkpoint.async_fallback", cfg.checkpoint.async_fallback, ASYNC_FALLBACK_CHOICES)
    _choices(where, "checkpoint.on_no_space", cfg.checkpoint.on_no_space, ON_NO_SPACE_CHOICES)
    _choices(where, "rollout.static_cache", roll.static_cache, ("auto", "on", "off"))
    _require(
        roll.static_cache != "on" or cfg.run.device != "cpu",
        where,
        "rollout.static_cache",
        "on needs a CUDA device (run.device cuda or auto); use auto or off on CPU",
    )
    if roll.engine == "vllm":
        validate_vllm(cfg, where, world_size)
    validate_split(cfg, where, world_size)
    validate_parallel(cfg, where)
    _choices(where, "data.truncation", cfg.data.truncation, ("error", "left", "right"))
    validate_reward(cfg, where)
    _choices(where, "oom.action", cfg.oom.action, ("fail", "skip"))
    _choices(where, "run.device", cfg.run.device, ("cpu", "cuda", "auto"))
    _choices(where, "model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    if cfg.model.lora is not None:
        validate_lora(cfg, where, world_size)
    _require(
        cfg.validation.every_steps == 0 or bool(cfg.validation.files),
        where,
        "validation.files",
        "validation.every_steps is set but no held-out file is named",
    )


def validate_lora(cfg: TrainerConfig, where: str, world_size: int) -> None:
    """``model.lora``: its keys, and the layouts it does not run in (each refusal names the key)."""
    lora = cfg.model.lora
    assert lora is not None
    _choices(where, "model.lora.critic", lora.critic, LORA_CRITICS)
    _require(
        bool(lora.target_modules),
        where,
        "model.lora.target_modules",
        "name at least one module of the base to adapt (e.g. [q_proj, v_proj])",
    )
    for i, name in enumerate(lora.target_modules):
        _require(
            isinstance(name, str) and _DOTTED.fullmatch(name) is not None,
            where,
            f"model.lora.target_modules[{i}]",
            f"expected a module name such as q_proj, got {name!r}",
        )
    _require(
        cfg.rollout.engine == "hf",
        where,
        "rollout.engine",
        "model.lora samples with the hf engine (vllm would need the adapters merged after every update)",
    )
    shared = lora.critic == "shared" and cfg.algorithm.adv_estimator != "grpo"
    _require(
        not shared or not cfg.model.critic_path,
        where,
        "model.critic_path",
        "model.lora.critic shared puts the value head on the actor's base; set model.lora.critic separate "
        "to train a critic from model.critic_path",
    )
    _require(
        not shared or world_size == 1,
        where,
        "model.lora.critic",
        f"shared runs in one process (its two adapters share one module); use separate for a {world_size}-process run",
    )


def validate_reward(cfg: TrainerConfig, where: str) -> None:
    rew = cfg.reward
    _choices(where, "reward.kind", rew.kind, ("rule", "model"))
    _choices(where, "reward.rule", rew.rule, ("digits", "arithmetic"))
    for name in rew.functions:
        if name in ("digits", "arithmetic", "model"):
            continue
        module, sep, func = name.partition(":")
        _require(
            bool(sep) and _DOTTED.fullmatch(module) is not None and func.isidentifier(),
            where,
            f"reward.functions.{name}",
            "expected digits, arithmetic, model or module:function (a module of reward.code_dir)",
        )


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_batches(cfg: TrainerConfig, where: str, world_size: int) -> None:
    """verl's batch rules for ``world_size`` data-parallel ranks (each generates and trains its share)."""
    ppo, roll = cfg.ppo, cfg.rollout
    responses = ppo.train_batch_size * roll.n
    _require(
        responses % world_size == 0,
        where,
        "ppo.train_batch_size",
        f"train_batch_size x rollout.n = {responses} is not divisible by the world size {world_size}",
    )
    _require(
        ppo.mini_batch_size <= responses,
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
        ppo.mini_batch_size % world_size == 0,
        where,
        "ppo.mini_batch_size",
        f"must be divisible by the world size {world_size} (every rank takes an equal share), "
        f"got {ppo.mini_batch_size}",
    )
    share = ppo.mini_batch_size // world_size
    _require(
        share % ppo.micro_batch_size == 0,
        where,
        "ppo.micro_batch_size",
        f"must divide mini_batch_size ({ppo.mini_batch_size})"
        + (f" / world size {world_size} = {share}" if world_size > 1 else ""),
    )


def validate_vllm(cfg: TrainerConfig, where: str, world_size: int) -> None:
    """The vllm engine's memory settings: the engine must hold the whole rollout batch at once."""
    roll = cfg.rollout
    responses = cfg.ppo.train_batch_size * roll.n
    _require(
        world_size == 1 or bool(roll.devices),
        where,
        "rollout.engine",
        f"vllm runs in-process on one device; use hf or rollout.devices for a {world_size}-process run",
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


_GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_GPU_INDEX = re.compile(r"[0-9]{1,6}")  # ASCII digits only (str.isdigit accepts other scripts' digits)
MAX_GPU_INDEX = 255


def _is_index(device: Any) -> bool:
    if isinstance(device, bool):
        return False
    return (isinstance(device, int) and device >= 0) or (
        isinstance(device, str) and _GPU_INDEX.fullmatch(device) is not None
    )


def split_device_problem(devices: tuple[Any, ...], trainer_uuids: tuple[str, ...], world_size: int) -> str | None:
    """Why ``rollout.devices`` is not a usable set of this node's devices (None when it is). Pure.

    Indices (int or digits) or UUIDs, not both; no duplicates; disjoint from the trainer ranks'
    devices (``run.gpu_uuids``, else local indices ``0 .. world_size-1``); ``["cpu"]`` alone."""
    if list(devices) == ["cpu"]:
        return None
    names = [str(d) for d in devices]
    if "cpu" in names:
        return 'cpu stands alone (["cpu"]: a rollout process on the host CPU)'
    if len(set(names)) != len(names):
        return f"lists a device twice: {names}"
    indices = [d for d in devices if _is_index(d)]
    uuids = [d for d in devices if isinstance(d, str) and _GPU_UUID.fullmatch(d)]
    for i, d in enumerate(devices):
        if d not in indices and d not in uuids:
            return f"[{i}]: expected a GPU index (0..{MAX_GPU_INDEX}) or UUID (GPU-xxxxxxxx-...), got {str(d)[:60]!r}"
    if indices and uuids:
        return "mixes GPU indices and UUIDs; name the devices one way"
    if any(int(d) > MAX_GPU_INDEX for d in indices):
        return f"GPU index above {MAX_GPU_INDEX}"
    taken = set(trainer_uuids) if uuids else ({str(i) for i in range(world_size)} if not trainer_uuids else set())
    if uuids and not trainer_uuids:
        return "GPU UUIDs need the trainer's devices as UUIDs too (run.gpu_uuids)"
    if indices and trainer_uuids:
        return "GPU indices with run.gpu_uuids set; name the rollout devices by UUID"
    shared = sorted({str(d) for d in devices} & taken)
    return f"shares {shared} with the trainer ranks; the devices must be disjoint" if shared else None


def validate_parallel(cfg: TrainerConfig, where: str) -> None:
    """``parallel.strategy`` and the layouts fsdp2 does not run in yet (each refusal names the key)."""
    _choices(where, "parallel.strategy", cfg.parallel.strategy, PARALLEL_STRATEGIES)
    if cfg.parallel.strategy != "fsdp2":
        return
    refusals = (
        (
            "model.lora",
            cfg.model.lora is not None,
            "fsdp2 shards whole models; a LoRA run trains its adapters with ddp",
        ),
        ("rollout.engine", cfg.rollout.engine != "hf", "fsdp2 samples with the hf engine from a gathered copy"),
        ("rollout.devices", bool(cfg.rollout.devices), "fsdp2 runs the rollout colocated in this version"),
        ("model.dtype", cfg.model.dtype == "float16", "fsdp2 runs float32 or bfloat16 (no sharded gradient scaler)"),
        ("checkpoint.async_save", cfg.checkpoint.async_save == "on", "fsdp2 saves synchronously; use auto or off"),
    )
    for key, refused, why in refusals:
        _require(not refused, where, key, why)


def validate_split(cfg: TrainerConfig, where: str, world_size: int) -> None:
    """``rollout.devices`` and ``rollout.tensor_parallel_size`` (trainer/rollout_split.py)."""
    roll = cfg.rollout
    _require(
        roll.tensor_parallel_size == 1 or (roll.engine == "vllm" and bool(roll.devices)),
        where,
        "rollout.tensor_parallel_size",
        "above 1 needs rollout.engine vllm on rollout.devices",
    )
    if not roll.devices:
        return
    problem = split_device_problem(roll.devices, cfg.run.gpu_uuids, world_size)
    _require(problem is None, where, "rollout.devices", problem or "")
    on_cpu = list(roll.devices) == ["cpu"]
    _require(
        on_cpu == (cfg.run.device == "cpu"),
        where,
        "rollout.devices",
        '["cpu"] goes with run.device cpu, GPU devices with cuda or auto',
    )
    count = 1 if on_cpu else len(roll.devices)
    wanted = roll.tensor_parallel_size if roll.engine == "vllm" else 1
    _require(
        count == wanted,
        where,
        "rollout.devices",
        f"{roll.engine} engine runs on {wanted} device(s) (rollout.tensor_parallel_size), got {count}",
    )
    responses = cfg.ppo.train_batch_size * roll.n
    _require(
        roll.max_num_seqs == 0 or roll.max_num_seqs >= responses,
        where,
        "rollout.max_num_seqs",
        f"the rollout process generates the whole batch (train_batch_size x rollout.n = {responses}); "
        f"must be at least that or 0, got {roll.max_num_seqs}",
    )
    _require(
        cfg.model.lora is None,
        where,
        "model.lora",
        "rollout.devices pushes whole weights; LoRA samples from the adapted base in the trainer (colocated)",
    )
