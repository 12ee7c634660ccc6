"""Rollout decode throughput on one GPU: ``model.generate`` (dynamic cache, the anchor; and its
static-cache compiled path) beside Warden's decode loop (:mod:`trainer.decode`) eager and with
CUDA graphs, in one process, on the 468M shape of ``bench/gpu_figures.py`` (bf16, 64 prompts
left-padded to 32 tokens, 256 new tokens, the trainer's seeded top-k/top-p sampling).

Per path: median wall time of the timed calls, rows x new tokens per second, the speed-up over
the dynamic ``generate`` anchor, and how many rows' valid tokens equal the graph loop's
(bf16 kernels differ between paths, so equality is reported, not required; on CPU float32
``tests/trainer/test_decode.py`` requires it).

    python bench/decode_figures.py                       # on the GPU machine
    python bench/decode_figures.py --tiny --device cpu   # a seconds-long check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_figures import FULL, TINY, build_assets, log
from trainer.decode import StaticDecoder
from trainer.rollout import SamplingPlan, SeededSampling, response_mask_from


def prompts(assets: dict[str, Any], rows: int, width: int, device: str) -> tuple[torch.Tensor, torch.Tensor, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["model"])
    tok.padding_side, tok.truncation_side = "left", "left"
    batch = tok(assets["texts"][:rows], padding="max_length", truncation=True, max_length=width, return_tensors="pt")
    return batch["input_ids"].to(device), batch["attention_mask"].to(device), tok


def timed(fn: Any, device: str, warmup: int, repeats: int) -> tuple[float, torch.Tensor, float]:
    """(median seconds, last output, first call's seconds) of ``fn()``."""
    first = 0.0
    out = None
    times = []
    for i in range(warmup + repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if i == 0:
            first = took
        if i >= warmup:
            times.append(took)
    assert out is not None
    return statistics.median(times), out, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape (a check of the script)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--paths", default="", help="comma-separated: dynamic,static,eager,graph,compiled (the first is the anchor)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or "decode-figures-out")
    args = ap.parse_args()
    size = TINY if args.tiny else FULL
    dtype = getattr(torch, args.dtype)
    root = tempfile.mkdtemp(prefix="decode-figures-")
    assets = build_assets(root, size, args.device, dtype, reward=False)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=dtype, attn_implementation="sdpa")
    model = model.to(args.device).eval().requires_grad_(False)
    rows, new = size["batch"], size["tokens"]
    ids, mask, tok = prompts(assets, rows, 32, args.device)
    stop = [tok.eos_token_id]
    plan = SamplingPlan(seed=7, temperature=1.0)

    def sampling() -> SeededSampling:
        return SeededSampling(plan, 50, 0.9, rows, args.device)

    def hf(static: bool) -> Any:
        def run() -> torch.Tensor:
            from transformers import LogitsProcessorList

            extra = {"cache_implementation": "static"} if static else {}
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=0,
                logits_processor=LogitsProcessorList([sampling()]), eos_token_id=stop, pad_token_id=tok.pad_token_id,
                temperature=None, top_p=None, top_k=None, **extra,
            )  # fmt: skip
            got = out[:, ids.shape[1] :]
            pad = torch.full((rows, new - got.shape[1]), tok.pad_token_id, dtype=got.dtype, device=got.device)
            return torch.cat([got, pad], dim=1)

        return run

    def ours(graphs: bool, compiled: bool = False) -> Any:
        decoder = StaticDecoder(model, new, stop, tok.pad_token_id, graphs, compiled)

        def run() -> torch.Tensor:
            s = sampling()
            return decoder.generate(ids, mask, lambda logits: s(None, logits))

        return run

    every = {
        "dynamic": ("generate, dynamic cache (anchor)", hf(False)),
        "static": ("generate, static cache", hf(True)),
        "eager": ("warden loop, eager", ours(False)),
        "graph": ("warden loop, CUDA graph", ours(True)),
        "compiled": ("warden loop, compiled + CUDA graph", ours(True, True)),
    }
    # the eager loop is the CPU check's (on the GPU it runs at generate's speed); graphs need CUDA
    chosen = (
        args.paths.split(",")
        if args.paths
        else (["dynamic", "static", "graph", "compiled"] if args.device == "cuda" else ["dynamic", "static", "eager"])
    )
    paths = [every[key] for key in chosen]
    results: dict[str, Any] = {"shape": {"rows": rows, "prompt": 32, "new_tokens": new}, "paths": {}}
    outputs: dict[str, torch.Tensor] = {}
    for name, fn in paths:
        try:
            seconds, out, first = timed(fn, args.device, 1, args.repeats)
        except Exception as exc:  # report what broke, keep the other figures
            log(f"{name}: {type(exc).__name__}: {str(exc)[:400]}")
            results["paths"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            continue
        outputs[name] = out
        results["paths"][name] = {"seconds": seconds, "first_call_s": first, "tokens_per_s": rows * new / seconds}
        log(f"{name}: {seconds:.3f}s, {rows * new / seconds:.0f} tokens/s (first call {first:.1f}s)")
        save(args.out, results)  # what is measured survives a call cut short
    reference = outputs.get(paths[-1][0])
    anchor = results["paths"][paths[0][0]].get("seconds")
    for name, out in outputs.items():
        entry = results["paths"][name]
        if anchor:
            entry["speedup"] = anchor / entry["seconds"]
        if reference is not None:
            keep_a, keep_b = response_mask_from(out, stop).bool(), response_mask_from(reference, stop).bool()
            same = [
                (keep_a[r] == keep_b[r]).all() and (out[r][keep_a[r]] == reference[r][keep_b[r]]).all()
                for r in range(rows)
            ]
            entry["rows_equal_to_last"] = int(sum(bool(x) for x in same))
            entry["first_difference_median"] = statistics.median(first_difference(out, reference))
    if args.device == "cuda":
        results["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        results["gpu"] = torch.cuda.get_device_name()
    results["torch"] = torch.__version__
    import transformers

    results["transformers"] = transformers.__version__
    print("| path | s/call | tokens/s | vs anchor | rows = last | first difference (median) |")
    print("|---|---|---|---|---|---|")
    for name, entry in results["paths"].items():
        if "error" in entry:
            print(f"| {name} | error: {entry['error'][:80]} | | | | |")
            continue
        print(
            f"| {name} | {entry['seconds']:.3f} | {entry['tokens_per_s']:.0f} | {entry.get('speedup', 0):.2f}x "
            f"| {entry.get('rows_equal_to_last', '-')}/{rows} | {entry.get('first_difference_median', '-')} |"
        )
    save(args.out, results)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Per row, the first token index where ``a`` and ``b`` differ (the width when they never do): bf16
    kernels that differ in rounding make sampled rows part after some tokens; a wrong loop at token 0."""
    differs = (a != b).int()
    width = a.shape[1]
    return [int(row.nonzero()[0]) if row.any() else width for row in differs]


def save(out: str, results: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decode-figures.json"), "w") as fh:
        json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
