"""Trainer benchmark on CPU: step time and tokens/s, and the overhead of events + metrics.

Sizes: ~1M and ~10M parameter random-init Llamas; shapes 8x32 and 16x64 (prompts x new
tokens). The overhead is measured side by side: two trainers with the same seed and
config, one with events/metrics/snapshots on and one off, stepped alternately so both
see the same machine state; the ratio of median step times is printed (goal <= 1.01).

    python bench/bench_trainer.py [--steps 4] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import yaml

from trainer.config import load_config
from trainer.core import PPOTrainer

MODELS = {
    "~1M": {"vocab_size": 320, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 256},
    "~10M": {"vocab_size": 320, "hidden_size": 320, "num_layers": 8, "num_heads": 5, "intermediate_size": 864},
}
SHAPES = ((8, 32), (16, 64))


def make_config(tmp: str, model: dict, prompts: int, tokens: int, cache: str) -> str:
    raw = {
        "version": 1,
        "run": {"seed": 1, "metrics_port": 0, "console": False},
        "model": {"tiny": {**model, "cache_dir": cache}},
        "data": {"truncation": "right"},  # as before issue 20: a few tiny prompts run past 32 tokens
        "rollout": {"n": 1, "max_new_tokens": tokens, "progress": False},
        "ppo": {
            "train_batch_size": prompts,
            "mini_batch_size": prompts,
            "micro_batch_size": min(prompts, 8),
            "epochs": 1,
        },
        "checkpoint": {"every_steps": 0},
        "max_steps": 1000,
    }
    path = os.path.join(tmp, f"bench-{prompts}x{tokens}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(raw, fh)
    return path


def measure(config: str, tmp: str, steps: int) -> tuple[float, float, float, int]:
    """(median step s instrumented, median step s bare, tokens/s, params)."""
    cfg = load_config(config)
    on = PPOTrainer(cfg, os.path.join(tmp, "on"), resume="never", serve_metrics=True)
    off = PPOTrainer(
        cfg, os.path.join(tmp, "off"), resume="never", emit_events=False, serve_metrics=False, instrumented=False
    )
    params = sum(p.numel() for p in on.actor.parameters())
    on.train_step()  # warm-up of both (first generate is slow)
    off.train_step()
    t_on, t_off, tps = [], [], []
    for _ in range(steps):
        r = on.train_step()
        t_on.append(r.metrics["timings"]["step_s"])
        tps.append(r.metrics["tokens_per_second"])
        t_off.append(off.train_step().metrics["timings"]["step_s"])
    on.close()
    off.close()
    return statistics.median(t_on), statistics.median(t_off), statistics.median(tps), params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="only the ~1M model at 8x32")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"{'model':<6}{'params':>10}{'shape':>8}{'step s':>9}{'tok/s':>9}{'bare s':>9}{'on/off':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "assets")
        for name, model in MODELS.items():
            for prompts, tokens in SHAPES:
                if args.quick and (name != "~1M" or prompts != 8):
                    continue
                case = os.path.join(tmp, f"{name}-{prompts}x{tokens}")
                os.makedirs(case)
                cfg = make_config(case, model, prompts, tokens, cache)
                on, off, tps, params = measure(cfg, case, args.steps)
                print(
                    f"{name:<6}{params:>10,}{f'{prompts}x{tokens}':>8}{on:>9.3f}{tps:>9.0f}{off:>9.3f}{on / off:>8.3f}",
                    flush=True,
                )
    print("goal: on/off <= 1.01 (events + metrics + snapshots vs none, same seed, steps interleaved)")


if __name__ == "__main__":
    main()
