"""A tiny causal-LM dataset for the HF Trainer tests (in-process and the torchrun worker)."""

from __future__ import annotations

import os
import random
import struct
from typing import Any


class TinyText:
    """A few short lines: input_ids = labels."""

    def __init__(self, tokenizer: Any, n: int = 16) -> None:
        lines = [f"the model learns to add {i} and {i + 1}" for i in range(n)]
        self.items = [tokenizer(line, truncation=True, max_length=16, padding="max_length") for line in lines]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.items[i]
        return {"input_ids": item["input_ids"], "attention_mask": item["attention_mask"], "labels": item["input_ids"]}


def tiny_trainer(
    tiny: Any, output_dir: Any, callbacks: list[Any], max_steps: int, trainer_class: Any = None, **arguments: Any
) -> tuple[Any, Any]:
    """(a real HF ``Trainer`` over :class:`TinyText` on the tiny offline model, its tokenizer): CPU, one
    thread, seed 0, a log and a save every step unless ``arguments`` say otherwise (TrainingArguments)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny.model_dir, local_files_only=True)
    settings: dict[str, Any] = {
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "seed": 0,
        **arguments,
    }
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, **settings)
    trainer = (trainer_class or Trainer)(
        model=model, args=args, train_dataset=TinyText(tokenizer), processing_class=tokenizer, callbacks=callbacks
    )
    return trainer, tokenizer


def flip_weight_byte(checkpoint: Any) -> None:
    """One bit of model.safetensors' tensor data flipped at a seeded place (``$WARDEN_TAMPER_SEED``,
    as tests/integrations/test_integ_hf_resume.py; its hypothesis test covers every file): HF still
    loads it."""
    weights = checkpoint / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", bytes(raw[:8]))[0]
    rng = random.Random(int(os.environ.get("WARDEN_TAMPER_SEED", 7)))
    raw[rng.randrange(start, len(raw))] ^= 1 << rng.randrange(8)
    weights.write_bytes(bytes(raw))
