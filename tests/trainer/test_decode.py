"""Warden's decode loop (trainer/decode.py) samples what ``model.generate`` samples: on CPU in
float32 the tokens are equal for generated batches, paddings and sampling settings, with SDPA
and with eager attention. (The CUDA graph replay of the same step is measured on the GPU by
bench/decode_figures.py, which reports the rows equal between paths.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.config import RolloutConfig
from trainer.decode import StaticDecoder, UnsupportedModel
from trainer.rollout import HFRollout, SamplingPlan, SeededSampling

STOP, PAD = 1, 2


@pytest.fixture(scope="module")
def models(tiny_cache):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    _cache, paths = tiny_cache
    return {
        attention: AutoModelForCausalLM.from_pretrained(paths.model_dir, attn_implementation=attention).eval()
        for attention in ("sdpa", "eager")
    }


batches = st.fixed_dictionaries(
    {
        "rows": st.integers(1, 5),
        "prompt": st.integers(1, 10),
        "new": st.integers(1, 24),
        "seed": st.integers(0, 2**31),
        "temperature": st.sampled_from([0.0, 0.7, 1.0, 1.5]),
        "top_k": st.sampled_from([0, 5, 50]),
        "top_p": st.sampled_from([1.0, 0.9, 0.5]),
        "attention": st.sampled_from(["sdpa", "eager"]),
        "pads": st.lists(st.integers(0, 9), min_size=5, max_size=5),
    }
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batches)
def test_the_loop_samples_what_generate_samples(models, case) -> None:  # type: ignore[no-untyped-def]
    model = models[case["attention"]]
    rows, prompt, new = case["rows"], case["prompt"], case["new"]
    gen = torch.Generator().manual_seed(case["seed"])
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt), generator=gen)
    mask = torch.ones(rows, prompt, dtype=torch.long)
    for r in range(rows):
        pad = min(case["pads"][r], prompt - 1)  # left padding; every row keeps one real token
        mask[r, :pad], ids[r, :pad] = 0, PAD
    cfg = RolloutConfig(
        max_new_tokens=new, top_k=case["top_k"], top_p=case["top_p"], temperature=1.0, static_cache="off"
    )
    plan = SamplingPlan(seed=case["seed"], temperature=case["temperature"])
    expected, _mask = HFRollout(model, cfg, stop_ids=[STOP], pad_id=PAD).generate(ids, mask, plan)
    sampling = SeededSampling(plan, cfg.top_k, cfg.top_p, rows, "cpu")
    decoder = StaticDecoder(model, new, [STOP], PAD, graphs=False)
    got = decoder.generate(ids, mask, lambda logits: sampling(None, logits))
    assert torch.equal(got, expected)
    # the same decoder again (buffers reused, cache reset): the same tokens
    again = SeededSampling(plan, cfg.top_k, cfg.top_p, rows, "cpu")
    assert torch.equal(decoder.generate(ids, mask, lambda logits: again(None, logits)), expected)


def test_rows_stop_at_their_first_stop_token_and_are_padded_after(models) -> None:  # type: ignore[no-untyped-def]
    model = models["sdpa"]
    ids = torch.randint(3, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)

    def always_stop_on_row_one(logits: torch.Tensor) -> torch.Tensor:
        scores = logits.clone()
        scores[1, :] = -1e9
        scores[1, STOP] = 0.0
        return scores

    out = StaticDecoder(model, 20, [STOP], PAD, graphs=False).generate(ids, mask, always_stop_on_row_one)
    assert out[1, 0] == STOP and (out[1, 1:] == PAD).all()
    assert (out[[0, 2, 3]] != PAD).any()


def test_an_attention_without_4d_masks_is_refused_by_name(models) -> None:  # type: ignore[no-untyped-def]
    model = models["sdpa"]
    saved = model.config._attn_implementation
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(UnsupportedModel, match="flash_attention_2"):
            StaticDecoder(model, 4, [STOP], PAD, graphs=False)
    finally:
        model.config._attn_implementation = saved


@pytest.mark.slow
def test_the_compiled_step_samples_what_the_eager_step_samples(models) -> None:  # type: ignore[no-untyped-def]
    """torch.compile of the one-token forward over the static cache: the same tokens as eager, and a
    second call of the same shape compiles nothing new (the cache's counters are tensors, not guards)."""
    from torch._dynamo.utils import counters

    model = models["sdpa"]
    ids = torch.randint(3, model.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[0, :2], ids[0, :2] = 0, PAD
    plan = SamplingPlan(seed=5, temperature=1.0)
    sampling = SeededSampling(plan, 50, 0.9, 3, "cpu")
    expected = StaticDecoder(model, 12, [STOP], PAD, graphs=False).generate(
        ids, mask, lambda logits: sampling(None, logits)
    )
    compiled = StaticDecoder(model, 12, [STOP], PAD, graphs=False, compiled=True)
    first = SeededSampling(plan, 50, 0.9, 3, "cpu")
    assert torch.equal(compiled.generate(ids, mask, lambda logits: first(None, logits)), expected)
    frames = counters["stats"]["unique_graphs"]
    assert frames > 0  # the step went through dynamo
    again = SeededSampling(plan, 50, 0.9, 3, "cpu")
    assert torch.equal(compiled.generate(ids, mask, lambda logits: again(None, logits)), expected)
    assert counters["stats"]["unique_graphs"] == frames
