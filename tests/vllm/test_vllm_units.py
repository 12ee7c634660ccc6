"""The vLLM engine's pure parts and config rules: no vLLM needed, so these run in every environment."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from trainer.config import DataConfig, ModelConfig, PPOConfig, RolloutConfig, TrainerConfig, validate
from trainer.rollout_vllm import engine_kwargs, kv_cache_bytes, pack_outputs, prompt_rows
from warden.errors import ConfigError

PPO = PPOConfig(train_batch_size=8, mini_batch_size=8, micro_batch_size=4)


def config(**rollout):
    return TrainerConfig(rollout=RolloutConfig(engine="vllm", n=2, **rollout), ppo=PPO)


@pytest.mark.parametrize(
    ("rollout", "key", "text"),
    [
        ({"max_num_seqs": 15}, "rollout.max_num_seqs", "must cover the rollout batch"),
        ({"gpu_memory_utilization": 0.0}, "rollout.gpu_memory_utilization", "must be in (0, 1]"),
        ({"gpu_memory_utilization": 1.5}, "rollout.gpu_memory_utilization", "must be in (0, 1]"),
        ({"max_num_batched_tokens": 8}, "rollout.max_num_batched_tokens", "at least max_num_seqs (16)"),
        ({"max_num_seqs": 32, "max_num_batched_tokens": 16}, "rollout.max_num_batched_tokens", "(32)"),
        ({"kv_cache_gib": -1.0}, "rollout.kv_cache_gib", "must be in [0, inf)"),
        ({"temperature": 0.0}, "rollout.temperature", "must be in (0, inf)"),
    ],
)
def test_vllm_memory_settings_are_validated(rollout, key, text):
    with pytest.raises(ConfigError) as err:
        validate(config(**rollout), "run.yaml")
    assert f"run.yaml: {key}:" in str(err.value) and text in str(err.value)


def test_vllm_settings_that_cover_the_batch_pass():
    validate(config(max_num_seqs=16, max_num_batched_tokens=16, gpu_memory_utilization=1.0))
    validate(config())  # 0 = sized from the batch
    validate(TrainerConfig(rollout=RolloutConfig(engine="hf", max_num_seqs=1), ppo=PPO))  # hf ignores them


def test_vllm_engine_needs_a_single_process():
    with pytest.raises(ConfigError, match=r"rollout\.engine: vllm runs in-process on one device"):
        validate(config(), "run.yaml", world_size=2)


LLAMA = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=256)


def test_kv_cache_size_follows_the_batch():
    small = kv_cache_bytes(LLAMA, seqs=16, max_len=40, dtype="float32")
    assert small == 64 * 2**20  # the floor
    big = kv_cache_bytes(LLAMA, seqs=1024, max_len=300, dtype="bfloat16")
    per_token = 2 * 2 * 2 * 64 * 2  # K and V, layers, kv heads, head dim, bytes
    tokens = 1024 * 384  # 300 rounded up to whole 128-token blocks
    assert big == per_token * tokens * 5 // 4


def test_engine_kwargs_map_the_config():
    cfg = TrainerConfig(
        rollout=RolloutConfig(engine="vllm", n=2, max_new_tokens=24, gpu_memory_utilization=0.3, enforce_eager=True),
        ppo=PPO,
        data=DataConfig(max_prompt_tokens=40),
        model=ModelConfig(dtype="bfloat16"),
    )
    kw = engine_kwargs(cfg, "/models/actor", LLAMA, on_cpu=True)
    assert kw["model"] == "/models/actor" and kw["dtype"] == "bfloat16" and kw["seed"] == cfg.run.seed
    assert kw["max_num_seqs"] == 16 and kw["max_model_len"] == 64 and kw["gpu_memory_utilization"] == 0.3
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["skip_tokenizer_init"] and kw["enforce_eager"]
    assert kw["kv_cache_memory_bytes"] == 64 * 2**20 and "max_num_batched_tokens" not in kw
    on_gpu = engine_kwargs(cfg, "/m", LLAMA, on_cpu=False)
    assert "kv_cache_memory_bytes" not in on_gpu  # vLLM sizes it from gpu_memory_utilization
    explicit = TrainerConfig(
        rollout=RolloutConfig(engine="vllm", max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_gib=0.5), ppo=PPO
    )
    kw = engine_kwargs(explicit, "/m", LLAMA, on_cpu=True)
    assert kw["max_num_seqs"] == 64 and kw["max_num_batched_tokens"] == 4096
    assert kw["kv_cache_memory_bytes"] == 2**29


def test_prompt_rows_drop_the_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_rows(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_outputs_are_packed_like_the_hf_engine():
    eos, pad = 1, 2
    tokens = [[5, 1, 7], [5, 6, 7, 8], []]  # EOS then a stray token; full width; nothing
    lps = [[-0.5, -0.25, -3.0], [-1.0, -1.0, -1.0, -1.0], []]
    responses, mask, logprobs = pack_outputs(tokens, lps, 4, pad, eos)
    assert responses.tolist() == [[5, 1, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert logprobs.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0] * 4, [0.0] * 4]


def test_a_missing_vllm_is_a_config_error(monkeypatch):
    from trainer.rollout import build_rollout

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ConfigError, match=r"rollout.engine: vllm cannot be imported .*warden\[vllm\]"):
        build_rollout(config(), torch.nn.Linear(1, 1), "/m", [1], 2)


def test_every_stop_id_ends_a_vllm_response_like_the_hf_engine():
    """rollout.stop_token_ids beside EOS: the mask stops at the first of any of them."""
    pad = 2
    tokens = [[5, 9, 7, 8], [5, 6, 1, 8], [5, 6, 7, 8]]  # a second stop id (9); EOS (1); none
    lps = [[-1.0] * 4] * 3
    responses, mask, _ = pack_outputs(tokens, lps, 4, pad, [1, 9])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert responses.tolist() == [[5, 9, 2, 2], [5, 6, 1, 2], [5, 6, 7, 8]]
