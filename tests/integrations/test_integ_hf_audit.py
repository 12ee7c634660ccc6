"""WardenCallback's audit trail and /metrics: ``record_samples`` -> one ``reward.snapshot`` per
optimizer step (archived, ``audit verify-run`` passes) and Warden's trainer's Prometheus families,
in a real transformers.Trainer run on the tiny offline model (CPU)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from integrations.hf_data import tiny_trainer
from support import free_port, run_warden, scrape

from trainer.integrations.hf_audit import MAX_TEXT_CHARS
from warden.journal import REWARD_SNAPSHOT, STEP_COMPLETED
from warden.payloads import RewardSnapshot, top_samples

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", 25))
needs_hf = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("accelerate") is None,
        reason="transformers.Trainer needs accelerate (pip install accelerate)",
    ),
]


def expected_top(rewards, k, min_reward):
    """The indices a snapshot keeps, by the definition: best first, ties in the order recorded."""
    order = sorted(range(len(rewards)), key=lambda i: -rewards[i])  # sorted() is stable
    return [i for i in order if min_reward is None or rewards[i] >= min_reward][:k]


rewards_lists = st.lists(
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, -1.0]), st.floats(-10, 10, allow_nan=False)), max_size=40
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    rewards=rewards_lists,
    k=st.integers(0, 12),
    min_reward=st.one_of(st.none(), st.sampled_from([0.0, 0.5]), st.floats(-5, 5)),
)
def test_the_kept_samples_are_exactly_the_top_k_and_shaped_as_warden_s_trainer_shapes_them(rewards, k, min_reward):
    import torch

    from trainer.core import PPOTrainer

    prompts = [f"p{i}" * (i % 7) for i in range(len(rewards))]
    responses = [f"r{i}" * (i % 5) for i in range(len(rewards))]
    kept = top_samples(prompts, responses, rewards, k, min_reward, max_text_chars=9)
    assert [s["index"] for s in kept] == expected_top(rewards, k, min_reward)
    assert [s["reward"] for s in kept] == sorted((s["reward"] for s in kept), reverse=True)
    for s in kept:
        i = s["index"]
        assert s["prompt"] == prompts[i][:9] and s["response"] == responses[i][:9]
        assert s["truncated"] == (len(prompts[i]) > 9 or len(responses[i]) > 9)
    # Warden's own trainer, given the same step: the same samples, the same fields
    emitted = []
    fake = SimpleNamespace(
        cfg=SimpleNamespace(snapshot=SimpleNamespace(top_k=k, min_reward=min_reward, max_text_chars=9)),
        emit=lambda etype, data, step=None: emitted.append(data),
    )
    PPOTrainer._snapshot(fake, 1, prompts, responses, torch.tensor(rewards, dtype=torch.float64))
    ours = RewardSnapshot(samples=tuple(kept), k=k, min_reward=min_reward).to_data()
    assert emitted == ([ours] if k > 0 else [])


def test_the_defaults_are_warden_s_trainer_s_and_non_finite_rewards_are_left_out():
    from trainer.config import SnapshotConfig
    from trainer.integrations.hf_audit import DEFAULT_TOP_K

    assert (SnapshotConfig().max_text_chars, SnapshotConfig().top_k) == (MAX_TEXT_CHARS, DEFAULT_TOP_K)
    kept = top_samples(["a", "b", "c"], ["x", "y", "z"], [math.nan, 1.0, math.inf], 3)
    assert [s["index"] for s in kept] == [1]


class Scored:
    """What a training loop scores: deterministic rewards (many ties) per micro-batch, kept per step."""

    def __init__(self, callback, tokenizer):
        self.callback, self.tokenizer = callback, tokenizer
        self.rng = random.Random(7)
        self.by_step: dict[int, list[tuple[str, str, float]]] = {}

    def score(self, step, input_ids):
        prompts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        responses = [f"answer {step}.{len(self.by_step.get(step, []))}.{i}" + "!" * (40 * (i == 0)) for i in range(4)]
        rewards = [self.rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in prompts]
        self.by_step.setdefault(step, []).extend(zip(prompts, responses, rewards, strict=True))
        taken = self.callback.record_samples(prompts, responses, rewards)
        assert taken == len(prompts)


def make_trainer(tiny, output_dir, callbacks, scored_box, max_steps):
    from transformers import Trainer

    class ScoringTrainer(Trainer):  # a plain-Trainer user who scores each batch
        def compute_loss(self, model, inputs, *args, **kwargs):
            scored_box[0].score(self.state.global_step + 1, inputs["input_ids"])
            return super().compute_loss(model, inputs, *args, **kwargs)

        def log(self, logs, *args, **kwargs):
            if "loss" in logs:
                logs["objective/kl"] = 0.01 * self.state.global_step  # as TRL's PPOTrainer names it
            super().log(logs, *args, **kwargs)

    return tiny_trainer(
        tiny, output_dir, callbacks, max_steps, ScoringTrainer, gradient_accumulation_steps=2, save_steps=2
    )


def read_events(run_dir):
    from warden.journal import JournalReader

    return [e for e, _ in JournalReader(os.path.join(run_dir, "events.jsonl")).read_available()]


@needs_hf[0]
@needs_hf[1]
def test_a_scored_trainer_run_is_snapshotted_archived_verified_and_served(
    tiny, tmp_path, archiver_setup, signing_keys, monkeypatch
):
    from transformers import TrainerCallback

    from trainer.integrations.hf import WardenCallback

    monkeypatch.delenv("WARDEN_RUN_DIR", raising=False)
    port = free_port()
    output_dir, run_dir = tmp_path / "out", tmp_path / "run"
    callback = WardenCallback(run_dir=str(run_dir), run_id="hf-audit", top_k=3, max_text_chars=32, metrics_port=port)
    scrapes: dict[tuple[str, int], dict] = {}

    class Probe(TrainerCallback):  # after WardenCallback: sees what it set at the same hook
        def on_step_end(self, args, state, control, **kwargs):
            scrapes[("step_end", state.global_step)] = scrape(port)

        def on_save(self, args, state, control, **kwargs):
            scrapes[("save", state.global_step)] = scrape(port)

    box: list[Scored] = []
    trainer, tokenizer = make_trainer(tiny, output_dir, [callback, Probe()], box, max_steps=4)
    box.append(Scored(callback, tokenizer))
    started = time.time()
    trainer.train()

    # one reward.snapshot per optimizer step (two micro-batches each), the top 3 by reward, typed
    events = read_events(run_dir)
    snaps = [e for e in events if e.type == REWARD_SNAPSHOT]
    assert [e.step for e in snaps] == [1, 2, 3, 4]
    scored = box[0].by_step
    assert sorted(scored) == [1, 2, 3, 4] and all(len(v) == 8 for v in scored.values())
    for event in snaps:
        payload = RewardSnapshot.from_data(event.data)
        assert payload.k == 3 and payload.min_reward is None and payload.source == "hf"
        rows = scored[event.step]
        top = expected_top([r for _, _, r in rows], 3, None)
        assert [s["index"] for s in payload.samples] == top
        for s, i in zip(payload.samples, top, strict=True):
            prompt, response, reward = rows[i]
            assert (s["prompt"], s["response"], s["reward"]) == (prompt[:32], response[:32], reward)
            assert s["truncated"] == (len(prompt) > 32 or len(response) > 32)
    assert any(s["truncated"] for e in snaps for s in e.data["samples"])
    assert [e.step for e in events if e.type == STEP_COMPLETED] == [1, 2, 3, 4]

    # /metrics, scraped during training: Warden's trainer's families with this run's values
    def value(samples, name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    last = scrapes[("save", 4)]
    assert value(last, "warden_trainer_steps_total") == 4
    assert value(last, "warden_trainer_last_step") == 4
    assert started <= value(last, "warden_trainer_last_step_timestamp_seconds") <= time.time()
    assert value(last, "warden_trainer_last_checkpoint_step") == 4
    assert started <= value(last, "warden_trainer_last_checkpoint_timestamp_seconds") <= time.time()
    assert value(scrapes[("step_end", 3)], "warden_trainer_last_checkpoint_step") == 2
    assert value(scrapes[("step_end", 1)], "warden_trainer_steps_total") == 1
    assert value(last, "warden_trainer_oom_events_total", phase="step") == 0
    assert value(last, "warden_trainer_step_duration_seconds_count") == 4
    rewards = [r for _, _, r in scored[4]]
    assert value(last, "warden_trainer_reward_mean") == pytest.approx(sum(rewards) / len(rewards))
    assert value(last, "warden_trainer_reward_max") == max(rewards)
    assert value(last, "warden_trainer_kl") == pytest.approx(0.04)
    info = [labels for (name, labels), _ in last.items() if name == "warden_trainer_run_info"]
    assert len(info) == 1 and dict(info[0])["run_id"] == "hf-audit" and "transformers" in dict(info[0])
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # stopped at on_train_end
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)

    # the archiver archives them; the run's chain verifies
    policy, store = archiver_setup
    done = run_warden(
        "sidecar", "run", "archiver", "--once", "--run-dir", str(run_dir), "--policy", policy, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    trust = str(signing_keys.pub)
    audit = run_warden(
        "audit", "snapshot", "--run", "hf-audit", "--step", "3", "--store", store.as_uri(), "--trust", trust,
        "--format", "json",
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    record = json.loads(audit.stdout)["record"]
    assert [s["index"] for s in record["samples"]] == [s["index"] for s in snaps[2].data["samples"]]
    walk = run_warden("audit", "verify-run", "--run", "hf-audit", "--store", store.as_uri(), "--trust", trust)
    assert walk.returncode == 0, walk.stdout + walk.stderr


@needs_hf[0]
def test_only_rank_zero_snapshots_and_the_reward_function_wrapper_records(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.integrations.hf import WardenCallback

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    other = WardenCallback(run_dir=str(tmp_path / "other"))
    other.on_step_end(args, TrainerState(is_world_process_zero=False, global_step=1), TrainerControl())
    assert other.record_samples(["p"], ["r"], [1.0]) == 0
    other.on_step_end(args, TrainerState(is_world_process_zero=False, global_step=2), TrainerControl())
    assert not (tmp_path / "other").exists()

    callback = WardenCallback(run_dir=str(tmp_path / "run"), run_id="hf-wrap", top_k=2, min_reward=0.5)

    def accuracy(prompts, completions, **kwargs):  # a TRL reward function (conversational data)
        texts = [c[0]["content"] for c in completions]
        return [1.0 if t.endswith("4") else (None if t == "?" else 0.0) for t in texts]

    wrapped = callback.reward_function(accuracy)
    assert wrapped.__name__ == "accuracy"
    chats = [[{"role": "user", "content": "2+2?"}]] * 4
    answers = [[{"role": "assistant", "content": t}] for t in ("4", "5", "?", "so 4")]
    assert wrapped(prompts=chats, completions=answers) == [1.0, 0.0, None, 1.0]
    with pytest.raises(ValueError):
        callback.record_samples(["a"], ["b", "c"], [1.0])
    zero = TrainerState(is_world_process_zero=True, global_step=1)
    callback.on_step_end(args, zero, TrainerControl())
    callback.on_step_end(args, TrainerState(is_world_process_zero=True, global_step=2), TrainerControl())  # none
    callback.close()
    (event,) = read_events(tmp_path / "run")
    assert event.type == REWARD_SNAPSHOT and event.step == 1
    assert [(s["index"], s["response"]) for s in event.data["samples"]] == [(0, "4"), (3, "so 4")]
    assert event.data["min_reward"] == 0.5 and event.data["k"] == 2


@needs_hf[0]
def test_metrics_from_logs_and_a_port_that_cannot_be_bound(tmp_path):
    import socket

    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.integrations.hf import WardenCallback
    from warden.errors import ConfigError

    callback = WardenCallback(run_dir=str(tmp_path / "run"), run_id="hf-logs")
    metrics = callback.metrics.metrics
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    zero = TrainerState(is_world_process_zero=True, global_step=1)
    callback.on_log(args, zero, TrainerControl(), logs={"reward": 0.3, "kl": 2.5, "grad_norm": 1.5})
    assert (metrics.reward_mean._value.get(), metrics.kl._value.get(), metrics.grad_norm._value.get()) == (
        0.3,
        2.5,
        1.5,
    )
    callback.record_samples(["p", "q"], ["r", "s"], [1.0, 0.0])
    callback.on_step_end(args, zero, TrainerControl())
    callback.on_log(args, zero, TrainerControl(), logs={"reward": 0.9})  # recorded samples win
    assert (metrics.reward_mean._value.get(), metrics.reward_max._value.get()) == (0.5, 1.0)
    assert metrics.oom.labels("step")._value.get() == 0
    callback.record_oom()  # a script that caught torch.OutOfMemoryError: WardenTrainerOOM's counter
    callback.record_oom("rollout")
    assert (metrics.oom.labels("step")._value.get(), metrics.oom.labels("rollout")._value.get()) == (1, 1)
    callback.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = WardenCallback(run_dir=str(tmp_path / "busy"), run_id="hf-busy", metrics_port=port)
        with pytest.raises(ConfigError, match="metrics_port"):
            busy.on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl())
        busy.close()


@needs_hf[0]
def test_reward_functions_record_each_batch_once_with_trl_s_weighted_sum(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.integrations.hf import WardenCallback

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    callback = WardenCallback(run_dir=str(tmp_path / "run"), run_id="hf-funcs", top_k=4)
    rng = random.Random(11)
    table = {}

    def first(prompts, completions, **kwargs):
        return [table[c][0] for c in completions]

    def second(prompts, completions, **kwargs):
        return [table[c][1] for c in completions]

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("the grader is down")

    wrapped = callback.reward_functions([first, second], weights=[1.0, 0.5])
    assert [f.__name__ for f in wrapped] == ["first", "second"]
    expected = []
    for step in (1, 2):
        completions = [f"c{step}.{i}" for i in range(4)]
        for i, c in enumerate(completions):  # None: not scored by that function; both None: left out
            table[c] = (None if i == 3 else rng.choice([0.0, 1.0]), None if i in (1, 3) else rng.choice([0.0, 2.0]))
        prompts = ["p"] * 4
        for f in wrapped:
            f(prompts=prompts, completions=completions)
        sums = [a + 0.5 * (b or 0.0) for a, b in (table[c] for c in completions[:3])]
        expected.append(expected_top(sums, 4, None))
        state = TrainerState(is_world_process_zero=True, global_step=step)
        callback.on_step_end(args, state, TrainerControl())
        # a batch whose second function fails is never recorded, and does not leak into the next one
        other = callback.reward_functions([first, broken])
        other[0](prompts=prompts, completions=completions)
        with pytest.raises(RuntimeError):
            other[1](prompts=prompts, completions=completions)
        callback.on_step_end(args, TrainerState(is_world_process_zero=True, global_step=step + 10), TrainerControl())
    callback.close()
    events = read_events(tmp_path / "run")
    assert [e.step for e in events] == [1, 2]
    for event, top in zip(events, expected, strict=True):
        assert [s["index"] for s in event.data["samples"]] == top
        for s in event.data["samples"]:
            a, b = table[s["response"]]
            assert s["reward"] == a + 0.5 * (b or 0.0)
    with pytest.raises(ValueError, match="2 functions and 1 weights"):
        callback.reward_functions([first, second], weights=[1.0])
