"""Offline assets for demos and tests: a tiny byte-level BPE tokenizer, a random-init
Llama of about 1M parameters and a prompt file, built once into a cache directory.

No model hub is contacted. The directory is complete only when ``assets.json`` exists
(written last, atomically), so a build killed half-way is redone.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass

from trainer.config import TinyAssets
from warden.safeio import atomic_write_bytes

SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")
WORDS = [
    "the",
    "model",
    "learns",
    "to",
    "count",
    "and",
    "add",
    "numbers",
    "while",
    "the",
    "critic",
    "estimates",
    "value",
    "of",
    "each",
    "token",
    "reward",
    "rises",
    "when",
    "answers",
    "are",
    "digits",
    "policy",
    "gradient",
    "with",
    "clipping",
    "keeps",
    "updates",
    "small",
]


@dataclass(frozen=True)
class AssetPaths:
    """Absolute paths of a built asset set."""

    model_dir: str
    tokenizer_dir: str
    prompts_file: str
    arithmetic_file: str


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "warden", "tiny")


def _corpus(rng: random.Random, lines: int = 2000) -> list[str]:
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
        numbers = [str(rng.randint(0, 999)) for _ in range(rng.randint(0, 3))]
        out.append(" ".join(words + numbers) + f" {rng.randint(0, 99)}+{rng.randint(0, 99)}={rng.randint(0, 198)}")
    return out


def build_tokenizer(out_dir: str, vocab_size: int, seed: int = 0) -> None:
    """Trains a byte-level BPE with ``tokenizers`` and saves it with ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(random.Random(seed)), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1], pad_token=SPECIALS[2]
    )
    fast.save_pretrained(out_dir)


def build_model(out_dir: str, tokenizer_dir: str, spec: TinyAssets, seed: int = 0) -> None:
    """Saves a random-init LlamaForCausalLM sized by ``spec`` (safetensors)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from trainer.models import quiet_transformers

    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def build_prompts(path: str, count: int, seed: int = 0) -> None:
    """Free-form prompts for the ``digits`` reward, one JSON object per line."""
    rng = random.Random(seed)
    lines = [
        json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))}) for _ in range(count)
    ]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())


def build_arithmetic(path: str, count: int, seed: int = 0) -> None:
    """``a+b=`` prompts with the sum as ground truth, for the exact-match reward."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(json.dumps({"prompt": f"{a}+{b}=", "ground_truth": str(a + b)}))
    atomic_write_bytes(path, ("\n".join(rows) + "\n").encode())


def ensure_tiny_assets(spec: TinyAssets, seed: int = 0) -> AssetPaths:
    """Builds the assets under ``spec.cache_dir`` unless a complete build is there."""
    root = os.path.abspath(spec.cache_dir or default_cache_dir())
    key = json.dumps({**asdict(spec), "cache_dir": "", "seed": seed, "format": 1}, sort_keys=True)
    build_dir = os.path.join(root, f"tiny-{abs(hash_text(key)) % 10**10:010d}")
    paths = AssetPaths(
        model_dir=os.path.join(build_dir, "model"),
        tokenizer_dir=os.path.join(build_dir, "tokenizer"),
        prompts_file=os.path.join(build_dir, "prompts.jsonl"),
        arithmetic_file=os.path.join(build_dir, "arithmetic.jsonl"),
    )
    marker = os.path.join(build_dir, "assets.json")
    if os.path.exists(marker):
        return paths
    os.makedirs(root, exist_ok=True)
    # Ranks of one torchrun (and tests side by side) share the cache: one builds, the others wait
    # on the lock and then find the marker. A lock held by a dead process is released by the kernel.
    with open(build_dir + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(marker):
            _build(build_dir, paths, spec, seed)
    return paths


def _build(build_dir: str, paths: AssetPaths, spec: TinyAssets, seed: int) -> None:
    """Builds every asset afresh into ``build_dir``; the marker is written last."""
    shutil.rmtree(build_dir, ignore_errors=True)
    os.makedirs(build_dir)
    build_tokenizer(paths.tokenizer_dir, spec.vocab_size, seed)
    build_model(paths.model_dir, paths.tokenizer_dir, spec, seed)
    build_prompts(paths.prompts_file, spec.num_prompts, seed)
    build_arithmetic(paths.arithmetic_file, spec.num_prompts, seed)
    atomic_write_bytes(os.path.join(build_dir, "assets.json"), json.dumps(asdict(paths), indent=2).encode())


def hash_text(text: str) -> int:
    """A stable (not per-process salted) integer hash."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
