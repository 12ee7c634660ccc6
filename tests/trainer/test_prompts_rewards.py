"""Issue 20: chat templates, truncation policy, stop ids, split-independent sampling, rewards, validation."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from trainer.data import PromptRow, encode_prompts, load_prompts, truncate
from trainer.rewards import RewardError, RewardSources, build_reward
from trainer.rollout import HFRollout, SamplingPlan, response_mask_from
from warden import journal as ev
from warden.errors import ConfigError

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def tokenizer(tiny_cache):
    from transformers import AutoTokenizer

    _, built = tiny_cache
    return AutoTokenizer.from_pretrained(built.tokenizer_dir, local_files_only=True)


def test_chat_prompts_go_through_the_chat_template(tokenizer, tmp_path):
    data = tmp_path / "chat.jsonl"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12 plus 3"}]
    data.write_text(json.dumps({"prompt": messages, "data_source": "math"}) + "\n")
    rows = load_prompts((str(data),), "prompt", "ground_truth")
    assert rows[0].messages == (("system", "be brief"), ("user", "12 plus 3")) and rows[0].data_source == "math"
    tokenizer.chat_template = TEMPLATE
    [ids] = encode_prompts(rows, tokenizer, 512, "error", chat_template=True)
    rendered = "<|system|>be brief\n<|user|>12 plus 3\n<|assistant|>"
    assert ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == rendered
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        encode_prompts(rows, tokenizer, 512, "error", chat_template=True)


def test_truncation_policies():
    ids = list(range(10))
    assert truncate(ids, 4, "left", "f: line 1") == [6, 7, 8, 9]  # the end (the question) is kept
    assert truncate(ids, 4, "right", "f: line 1") == [0, 1, 2, 3]
    assert truncate(ids, 10, "error", "f: line 1") == ids
    with pytest.raises(ConfigError, match=r"f: line 3: the prompt has 10 tokens, over data\.max_prompt_tokens \(4\)"):
        truncate(ids, 4, "error", "f: line 3")


def test_a_long_prompt_is_an_error_at_start_by_default(tokenizer):
    row = PromptRow("word " * 200, where="p.jsonl: line 7")
    with pytest.raises(ConfigError, match=r"p\.jsonl: line 7") as info:
        encode_prompts([row], tokenizer, 16, "error", chat_template=True)
    assert info.value.exit_code == 2
    [kept] = encode_prompts([row], tokenizer, 16, "left", chat_template=True)
    assert kept == tokenizer(row.prompt)["input_ids"][-16:]


def test_several_stop_ids_end_the_response():
    responses = torch.tensor([[5, 9, 4, 4], [5, 7, 9, 4], [1, 2, 3, 4]])
    assert response_mask_from(responses, (7, 9)).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert response_mask_from(responses, 9).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def _engine(tiny_cache, **cfg):
    from transformers import AutoModelForCausalLM

    from trainer.config import RolloutConfig

    _, built = tiny_cache
    model = AutoModelForCausalLM.from_pretrained(built.model_dir, local_files_only=True)
    return HFRollout(model, RolloutConfig(max_new_tokens=6, progress=False, **cfg), (model.config.eos_token_id,), 0)


def test_sampling_does_not_depend_on_how_the_batch_is_split(tiny_cache, tokenizer):
    from trainer.data import left_pad

    engine = _engine(tiny_cache, temperature=1.0)
    ids, mask = left_pad([tokenizer(f"prompt {i} " * (1 + i % 3))["input_ids"] for i in range(6)], 0)
    whole, whole_mask = engine.generate(ids, mask, SamplingPlan(seed=5, offset=0, total=6))
    halves = [
        engine.generate(ids[s], mask[s], SamplingPlan(seed=5, offset=s.start, total=6))
        for s in (slice(0, 3), slice(3, 6))
    ]
    assert torch.equal(whole, torch.cat([h[0] for h in halves])) and torch.equal(
        whole_mask, torch.cat([h[1] for h in halves])
    )
    other, _ = engine.generate(ids, mask, SamplingPlan(seed=6, offset=0, total=6))
    assert not torch.equal(whole, other), "another seed must sample other responses"


def _code_dir(
    tmp_path,
    body=(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(solution_str) + (10.0 if data_source == 'math' else 0.0)\n"
    ),
):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "my_rewards.py").write_text(body)
    os.chmod(code / "my_rewards.py", 0o644)
    return code


def test_custom_and_builtin_reward_functions_with_weights(tmp_path):
    from trainer.config import RewardConfig

    code = _code_dir(tmp_path)
    rew = RewardConfig(functions={"my_rewards:score": 0.5, "digits": 2.0})
    reward = build_reward(
        rew, RewardSources(code_dir=str(code), forbidden=(("model.actor_path", str(tmp_path / "m")),))
    )
    got = reward.score(["p", "q"], ["12ab", "xyz"], [None, None], ["math", ""])
    assert got == [0.5 * (4 + 10) + 2.0 * 0.5, 0.5 * 3 + 0.0]
    assert reward.last_parts == {"my_rewards:score": [14.0, 3.0], "digits": [0.5, 0.0]}


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("inside_model", "overlaps model.actor_path"),
        ("group_writable", "writable by group or others"),
        ("no_function", "defines no function 'score'"),
        ("bad_value", "not a finite number"),
    ],
)
def test_custom_reward_is_loaded_only_from_the_runs_own_code(tmp_path, setup, message):
    from trainer.config import RewardConfig

    code = _code_dir(tmp_path)
    model_dir = tmp_path / "m"
    if setup == "inside_model":
        model_dir = code  # a reward module planted in the model directory
    if setup == "group_writable":
        os.chmod(code / "my_rewards.py", 0o664)
    if setup == "no_function":
        (code / "my_rewards.py").write_text("x = 1\n")
    if setup == "bad_value":
        (code / "my_rewards.py").write_text("def score(**kw):\n    return float('nan')\n")
    src = RewardSources(code_dir=str(code), forbidden=(("model.actor_path", str(model_dir)),))
    with pytest.raises(RewardError, match=message) as info:
        build_reward(RewardConfig(functions={"my_rewards:score": 1.0}), src).score(["p"], ["r"], [None], [""])
    assert info.value.exit_code == 2
    assert os.stat(code / "my_rewards.py").st_mode & stat.S_IFREG


def test_relative_code_dir_resolves_against_the_config_file(make_config, monkeypatch, tmp_path):
    monkeypatch.chdir("/")
    cfg, path = make_config({"reward": {"code_dir": "code", "functions": {"my_rewards:score": 1.0}}})
    assert cfg.reward.code_dir == os.path.join(os.path.dirname(path), "code")


def test_reward_model_uses_its_own_tokenizer(tmp_path, tokenizer):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    from trainer.assets import build_tokenizer
    from trainer.config import RewardConfig

    rm_dir = tmp_path / "rm"
    build_tokenizer(str(rm_dir), 400, seed=7)  # another vocabulary than the policy's
    own = AutoTokenizer.from_pretrained(str(rm_dir), local_files_only=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(own),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_labels=1,
        pad_token_id=own.pad_token_id or own.eos_token_id,
    )
    LlamaForSequenceClassification(config).save_pretrained(str(rm_dir))
    asked = []

    def load(path):
        asked.append(path)
        return AutoTokenizer.from_pretrained(path, local_files_only=True)

    reward = build_reward(
        RewardConfig(functions={"model": 1.0}), RewardSources(reward_model=str(rm_dir), load_tokenizer=load)
    )
    got = reward.score(["12 + 3 = "], ["15"], [None])
    assert asked == [str(rm_dir)]
    model = LlamaForSequenceClassification.from_pretrained(str(rm_dir)).eval()
    own.pad_token = own.pad_token or own.eos_token
    batch = own(["12 + 3 = 15"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = float(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0, 0])
    assert got == [pytest.approx(expected, abs=1e-6)]


def test_validation_loop_events_and_metric(make_config, tmp_path, tiny_cache):
    from trainer.core import PPOTrainer

    _, built = tiny_cache
    extra = {
        "validation": {"every_steps": 2, "files": [built.prompts_file], "max_prompts": 5, "batch_size": 4},
        "checkpoint": {"every_steps": 0},
    }
    cfg, _ = make_config(extra)
    trainer = PPOTrainer(cfg, str(tmp_path / "run"), resume="never")
    try:
        trainer.train(4)
        gauge = trainer.metrics.registry.get_sample_value("warden_trainer_val_reward_mean")
    finally:
        trainer.close()
    events = [e for e, _ in ev.JournalReader(str(tmp_path / "run" / "events.jsonl")).read_available()]
    vals = [e for e in events if e.type == ev.VALIDATION_COMPLETED]
    assert [e.step for e in vals] == [2, 4]
    assert all(e.data["val/samples"] == 5 for e in vals)
    assert gauge == vals[-1].data["val/reward_mean"]
    steps = [e for e in events if e.type == ev.STEP_COMPLETED]
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "critic/vf_loss",
        "critic/score/mean",
        "response_length/mean",
        "response_length/clip_ratio",
        "timing_s/gen",
        "reward_mean",
        "policy_loss",
    ):
        assert key in steps[0].data, key
    assert steps[0].data["critic/score/mean"] == steps[0].data["reward_mean"]


def test_response_length_metrics_and_stop_ids():
    from trainer.core import response_length_stats, stop_token_ids

    responses = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [5, 6, 7, 9], [3, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    stats = response_length_stats(mask, (2, 9), responses)
    # row 1 ran to the limit without a stop token (clipped); row 2 stopped on its last token (9)
    assert stats == {
        "response_length/mean": 2.75,
        "response_length/max": 4.0,
        "response_length/min": 1.0,
        "response_length/clip_ratio": 0.25,
    }
    assert stop_token_ids(2, (9, 2, 11)) == (2, 9, 11)
    with pytest.raises(ConfigError, match=r"rollout\.stop_token_ids"):
        stop_token_ids(None, ())
