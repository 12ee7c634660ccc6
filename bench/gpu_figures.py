"""GPU figures for the trainer, side by side with TRL's PPO, in one process and one call.

Builds offline a ~0.5B random-init Llama (hidden 1024, 24 layers, MLP 4096, 32k byte-level
BPE vocabulary), then runs PPO steps at 64 prompts x 256 new tokens in bf16 with our
``PPOTrainer`` (HF ``generate`` rollout; on CUDA a static KV cache with the compiled forward,
``--static-cache off`` for the dynamic cache; float32 master weights with bf16 autocast) and with
TRL's ``PPOTrainer`` (``trl==1.12.0``,
``trl.experimental.ppo``) on the same model, batch, micro-batch and response length.
Per framework: median step time over the timed steps, split into generation / scoring
(reference, critic and actor log-probs, rewards, advantages) / update, response tokens per
second, and peak GPU memory. Ratio = TRL step / our step (> 1: ours is faster).

TRL's phases are read by wrapping its module-level ``batch_generation`` (generation) and
``forward`` (its first call on the policy-and-value wrapper starts the update) with CUDA
synchronisation; its step ends at ``on_step_end``. TRL needs a reward model: a 1-layer
64-wide Llama classifier (its cost is in TRL's scoring); ours uses the rule reward.

    python bench/gpu_figures.py                 # the GPU run (writes $OUT or ./gpu-figures-out)
    python bench/gpu_figures.py --tiny --device cpu --dtype float32   # a seconds-long check of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import yaml

SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")
FULL = {"vocab": 32000, "hidden": 1024, "layers": 24, "heads": 16, "mlp": 4096, "batch": 64, "tokens": 256, "micro": 16}
TINY = {"vocab": 1000, "hidden": 64, "layers": 2, "heads": 2, "mlp": 128, "batch": 8, "tokens": 12, "micro": 4}
# --lora-8b: the Llama-3-8B shape (hidden 4096, 32 layers, 32 query / 8 KV heads, MLP 14336) on the
# script's own 32k vocabulary (Llama 3's is 128k; no tokenizer of that size is built offline here).
LORA_8B = {"vocab": 32000, "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "mlp": 14336}
LORA_8B.update({"batch": 64, "tokens": 256, "micro": 8})
LORA_TINY = dict(TINY, kv_heads=1)
LORA = {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# -- assets ---------------------------------------------------------------------------------
def build_tokenizer(out_dir: str, vocab: int, lines: int) -> Any:
    """A byte-level BPE of ``vocab`` tokens trained on random pseudo-words (enough pairs to fill it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    letters, weights = "etaoinshrdlcumwfgypbvkjxqz", [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3] + [2] * 6 + [1] * 7
    corpus = [
        " ".join("".join(rng.choices(letters, weights, k=rng.randint(2, 10))) for _ in range(12))
        + f" {rng.randint(0, 99999)}"
        for _ in range(lines)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1], pad_token=SPECIALS[2]
    )
    fast.save_pretrained(out_dir)
    return fast


def llama_config(size: dict, tokenizer: Any, **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size["hidden"],
        intermediate_size=size["mlp"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size.get("kv_heads", size["heads"]),
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **extra,
    )


def build_assets(root: str, size: dict, device: str, dtype: torch.dtype, reward: bool = True) -> dict[str, Any]:
    """Tokenizer, policy (built and saved in ``dtype``: an 8B model never exists in float32), a tiny
    reward classifier for TRL (``reward``), and prompts."""
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from trainer.assets import WORDS

    t0 = time.perf_counter()
    model_dir, reward_dir = os.path.join(root, "policy"), os.path.join(root, "reward")
    tokenizer = build_tokenizer(model_dir, size["vocab"], 30000 if size["vocab"] > 5000 else 3000)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            policy = LlamaForCausalLM(llama_config(size, tokenizer))
    finally:
        torch.set_default_dtype(default)
    params = sum(p.numel() for p in policy.parameters())
    policy.save_pretrained(model_dir, safe_serialization=True)
    del policy
    if device == "cuda":
        torch.cuda.empty_cache()
    if reward:
        tiny = {"hidden": 64, "mlp": 128, "layers": 1, "heads": 2}
        classifier = LlamaForSequenceClassification(llama_config(tiny, tokenizer, num_labels=1)).to(dtype)
        classifier.save_pretrained(reward_dir, safe_serialization=True)
        tokenizer.save_pretrained(reward_dir)
    rng = random.Random(1)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) for _ in range(8 * size["batch"])]
    prompt_file = os.path.join(root, "prompts.jsonl")
    with open(prompt_file, "w") as fh:
        fh.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    log(f"assets: {params / 1e6:.0f}M parameters, vocab {len(tokenizer)}, built in {time.perf_counter() - t0:.0f}s")
    return {"model": model_dir, "reward": reward_dir, "prompts": prompt_file, "texts": prompts, "params": params}


def summary(steps: list[dict[str, float]], tokens: list[int], peak: int) -> dict[str, Any]:
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
    med["tokens"] = statistics.median(tokens)
    med["gen_tokens_per_s"] = med["tokens"] / med["generation_s"]
    med["step_tokens_per_s"] = med["tokens"] / med["step_s"]
    med["peak_gib"] = peak / 2**30
    med["steps"] = steps
    return med


# -- ours -----------------------------------------------------------------------------------
def run_ours(assets: dict, size: dict, args: argparse.Namespace, root: str, lora: dict | None = None) -> dict[str, Any]:
    """Our PPO steps; with ``lora`` (``model.lora``, shared critic) also one synchronous checkpoint
    after the timed steps: its wall time and size (adapters, value head and their optimizer state)."""
    from trainer.config import load_config
    from trainer.core import PPOTrainer

    raw: dict[str, Any] = {
        "version": 1,
        "run": {"seed": 1, "device": args.device, "metrics_port": 0, "console": False},
        "model": {"actor_path": assets["model"], "dtype": args.dtype},
        "data": {"train_files": [assets["prompts"]], "max_prompt_tokens": 32, "truncation": "left"},
        "reward": {"kind": "rule", "rule": "digits"},
        "rollout": {
            "engine": "hf",
            "n": 1,
            "max_new_tokens": size["tokens"],
            "progress": False,
            "static_cache": args.static_cache,
        },
        "ppo": {
            "train_batch_size": size["batch"],
            "mini_batch_size": size["batch"],
            "micro_batch_size": size["micro"],
            "epochs": 1,
            "actor_lr": 1e-6,
            "critic_lr": 1e-6,
        },
        "snapshot": {"top_k": 4},
        "checkpoint": {"every_steps": 0, "async_save": "off"},
        "max_steps": 1000,
    }
    if lora:
        raw["model"]["lora"] = dict(lora, critic="shared")
    path = os.path.join(root, "ours.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(raw, fh)
    trainer = PPOTrainer(load_config(path), os.path.join(root, "ours-run"), resume="never", serve_metrics=False)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, tokens = [], []
    for i in range(args.warmup + args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        result = trainer.train_step()
        sync(args.device)
        wall = time.perf_counter() - t0
        t = result.metrics["timings"]
        row = {
            "step_s": wall,
            "generation_s": t["rollout_s"],
            "scoring_s": t["experience_s"] + t.get("reward_s", 0.0),
            "update_s": t["update_s"],
            "other_s": wall - t["rollout_s"] - t["experience_s"] - t["update_s"],
        }
        log(f"ours step {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        if i >= args.warmup:
            steps.append(row)
            tokens.append(result.metrics["response_tokens"])
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    saved = time_checkpoint(trainer, args.device) if lora else None
    static = bool(getattr(trainer.rollout, "static", False)) and not getattr(trainer.rollout, "static_failed", False)
    log(f"ours rollout: {'static KV cache, compiled forward' if static else 'dynamic KV cache'}")
    trainer.close()
    del trainer
    out = summary(steps, tokens, peak)
    out["rollout_path"] = "static" if static else "dynamic"
    if saved:
        out.update(saved)
    return out


def time_checkpoint(trainer: Any, device: str) -> dict[str, float]:
    """One synchronous save (``checkpoint.async_save: off``): seconds from the call to the durable
    directory, and the directory's bytes."""
    sync(device)
    t0 = time.perf_counter()
    trainer.save_checkpoint()
    trainer.saver.settle()
    seconds = time.perf_counter() - t0
    from trainer.checkpoint import step_dir_name

    folder = os.path.join(trainer.paths.checkpoint_root, step_dir_name(trainer.step))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
    log(f"ours checkpoint {os.path.basename(folder)}: {size / 2**20:.1f} MiB in {seconds:.2f}s")
    return {"checkpoint_s": seconds, "checkpoint_mib": size / 2**20}


# -- TRL ------------------------------------------------------------------------------------
class TRLClock:
    """Phase timestamps for TRL's PPO loop, from wrapped module functions and a callback."""

    def __init__(self, device: str, eos_id: int) -> None:
        self.device, self.eos_id = device, eos_id
        self.marks: list[dict[str, float]] = []
        self.tokens: list[int] = []
        self.current: dict[str, float] = {}

    def install(self, module: Any) -> None:
        from trainer.rollout import response_mask_from

        original_generation, original_forward = module.batch_generation, module.forward
        wrapper_cls = module.PolicyAndValueWrapper

        def batch_generation(model: Any, queries: torch.Tensor, *a: Any, **kw: Any) -> Any:
            sync(self.device)
            self.current["gen_start"] = time.perf_counter()
            out = original_generation(model, queries, *a, **kw)
            sync(self.device)
            self.current["gen_end"] = time.perf_counter()
            responses = out[0][:, queries.shape[1] :]
            self.tokens.append(int(response_mask_from(responses, self.eos_id).sum()))
            return out

        def forward(model: Any, *a: Any, **kw: Any) -> Any:
            if isinstance(model, wrapper_cls) and "update_start" not in self.current:
                sync(self.device)
                self.current["update_start"] = time.perf_counter()
            return original_forward(model, *a, **kw)

        module.batch_generation, module.forward = batch_generation, forward

    def step_end(self) -> None:
        sync(self.device)
        self.current["end"] = time.perf_counter()
        self.marks.append(self.current)
        self.current = {}


def run_trl(assets: dict, size: dict, args: argparse.Namespace, root: str) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl
    import trl.experimental.ppo.ppo_trainer as ppo_module
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(assets["model"], padding_side="left")
    clock = TRLClock(args.device, tokenizer.eos_token_id)
    clock.install(ppo_module)

    class StepEnd(TrainerCallback):
        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            sync(args.device)
            clock.current["start"] = time.perf_counter()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            clock.step_end()
            clock.current["start"] = clock.marks[-1]["end"]

    def load(cls: Any, path: str, **kw: Any) -> Any:
        return cls.from_pretrained(path, dtype=dtype, local_files_only=True, **kw)

    policy = load(AutoModelForCausalLM, assets["model"])
    ref = load(AutoModelForCausalLM, assets["model"])
    value = load(AutoModelForSequenceClassification, assets["model"], num_labels=1)
    reward = load(AutoModelForSequenceClassification, assets["reward"], num_labels=1)
    enc = tokenizer(assets["texts"], truncation=True, max_length=32)
    train = Dataset.from_dict({"input_ids": enc["input_ids"]})
    total = args.warmup + args.steps
    config = PPOConfig(
        output_dir=os.path.join(root, "trl-run"),
        per_device_train_batch_size=size["micro"],
        gradient_accumulation_steps=size["batch"] // size["micro"],
        num_mini_batches=1,
        num_ppo_epochs=1,
        local_rollout_forward_batch_size=size["batch"],
        response_length=size["tokens"],
        total_episodes=size["batch"] * total,
        stop_token="eos",
        temperature=1.0,
        learning_rate=1e-6,
        num_sample_generations=0,
        bf16=args.dtype == "bfloat16",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=1,
        use_cpu=args.device == "cpu",
    )
    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref,
        reward_model=reward,
        train_dataset=train,
        value_model=value,
        eval_dataset=train.select(range(size["batch"])),
        callbacks=[StepEnd()],
    )
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    steps = []
    for i, m in enumerate(clock.marks):
        row = {
            "step_s": m["end"] - m["start"],
            "generation_s": m["gen_end"] - m["gen_start"],
            "scoring_s": m["update_start"] - m["gen_end"],
            "update_s": m["end"] - m["update_start"],
            "other_s": m["gen_start"] - m["start"],
        }
        log(f"trl step {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        steps.append(row)
    out = summary(steps[args.warmup :], clock.tokens[args.warmup :], peak)
    out["trl_version"] = trl.__version__
    del trainer, policy, ref, value, reward
    return out


# -- report ---------------------------------------------------------------------------------
def table(ours: dict, trl: dict | None) -> str:
    rows = [
        ("step s", "step_s", "{:.3f}"),
        ("  generation s", "generation_s", "{:.3f}"),
        ("  scoring s", "scoring_s", "{:.3f}"),
        ("  update s", "update_s", "{:.3f}"),
        ("  other s", "other_s", "{:.3f}"),
        ("response tokens", "tokens", "{:.0f}"),
        ("gen tokens/s", "gen_tokens_per_s", "{:.0f}"),
        ("step tokens/s", "step_tokens_per_s", "{:.0f}"),
        ("peak GiB", "peak_gib", "{:.1f}"),
    ]
    lines = [f"{'':<18}{'ours':>10}{'TRL':>10}{'TRL/ours':>10}"]
    for label, key, fmt in rows:
        a = ours[key]
        b = trl[key] if trl else float("nan")
        ratio = b / a if a else float("nan")
        lines.append(f"{label:<18}{fmt.format(a):>10}{fmt.format(b):>10}{ratio:>10.2f}")
    return "\n".join(lines)


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def run_468m(results: dict[str, Any], size: dict, args: argparse.Namespace, root: str) -> None:
    """Ours, then TRL, on the 468M model (the anchor of every other figure of the call)."""
    assets = build_assets(root, size, args.device, getattr(torch, args.dtype))
    results["params"] = assets["params"]
    results["ours"] = run_ours(assets, size, args, root)
    free_device(args.device)
    results["trl"] = None
    if args.device == "cuda":
        log(f"GPU memory still allocated before TRL: {torch.cuda.memory_allocated() / 2**30:.2f} GiB")
    if not args.skip_trl:
        try:
            results["trl"] = run_trl(assets, size, args, root)
        except Exception as exc:  # report what broke, keep our figures
            import traceback

            traceback.print_exc()
            results["trl_error"] = f"{type(exc).__name__}: {exc}"
    free_device(args.device)


def run_lora_8b(size: dict, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """LoRA PPO (``LORA`` adapters, shared critic) on a random-init model of ``size``, base in ``--dtype``."""
    t0 = time.perf_counter()
    assets = build_assets(root, size, args.device, getattr(torch, args.dtype), reward=False)
    built = time.perf_counter() - t0
    out = run_ours(assets, size, args, root, lora=LORA)
    out.update(params=assets["params"], build_s=built, lora=LORA, size=size)
    free_device(args.device)
    return out


def lora_table(r: dict[str, Any]) -> str:
    rows = [
        ("parameters (base)", f"{r['params'] / 1e9:.2f} B"),
        ("step s", f"{r['step_s']:.2f}"),
        ("  generation s", f"{r['generation_s']:.2f}"),
        ("  scoring s", f"{r['scoring_s']:.2f}"),
        ("  update s", f"{r['update_s']:.2f}"),
        ("response tokens per step", f"{r['tokens']:.0f}"),
        ("generation tokens/s", f"{r['gen_tokens_per_s']:.0f}"),
        ("step tokens/s", f"{r['step_tokens_per_s']:.0f}"),
        ("peak GPU memory GiB", f"{r['peak_gib']:.1f}"),
        ("checkpoint MiB", f"{r['checkpoint_mib']:.1f}"),
        ("checkpoint save s", f"{r['checkpoint_s']:.2f}"),
    ]
    return "\n".join(f"{label:<28}{value:>12}" for label, value in rows)


def free_device(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def save_results(path: str, results: dict[str, Any]) -> None:
    """After every phase: a call cut short at its time limit still returns what it measured."""
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2, default=str)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: checks the script in seconds")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-468m", action="store_true", help="only the --lora-8b phase")
    parser.add_argument(
        "--lora-8b", action="store_true", help="then LoRA PPO on an 8B-shaped Llama (with --tiny: a tiny one)"
    )
    parser.add_argument(
        "--static-cache", default="auto", choices=("auto", "on", "off"), help="ours: rollout.static_cache"
    )
    args = parser.parse_args()
    size = TINY if args.tiny else FULL
    out_dir = os.environ.get("OUT") or "gpu-figures-out"
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, Any] = {"environment": environment(args), "size": size, "args": vars(args)}
    log(f"environment: {results['environment']}")
    path = os.path.join(out_dir, "gpu_figures.json")
    if not args.skip_468m:
        with tempfile.TemporaryDirectory() as root:
            run_468m(results, size, args, root)
        save_results(path, results)
    if args.lora_8b:
        with tempfile.TemporaryDirectory() as root:
            results["lora_8b"] = run_lora_8b(LORA_TINY if args.tiny else LORA_8B, args, root)
        save_results(path, results)
        print("\n" + lora_table(results["lora_8b"]))
    if args.skip_468m:
        return
    text = table(results["ours"], results["trl"])
    results["table"] = text
    save_results(path, results)
    shape = f"{size['batch']}x{size['tokens']}"
    print(f"\n{results['params'] / 1e6:.0f}M-parameter Llama, {shape}, {args.dtype}, median of {args.steps} steps")
    print(text)
    if "trl_error" in results:
        print(f"TRL failed: {results['trl_error']}")
        sys.exit(1)


if __name__ == "__main__":
    main()
