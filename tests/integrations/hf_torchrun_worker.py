"""One rank of an HF Trainer run under torchrun (gloo, CPU) with WardenCallback; rank 1 is slow.

Usage (by test_integ_hf_torchrun.py): ``torchrun --nproc_per_node 2 hf_torchrun_worker.py
TOKENIZER_DIR MODEL_DIR OUTPUT_DIR RUN_DIR DELAY_SECONDS [MAX_STEPS RESUME TRUSTED_KEYS]``. Rank 1
writes its ``rng_state_1.pth`` only DELAY_SECONDS after the Trainer asked it to, so rank 0's
``on_save`` fires before that file exists. RESUME: ``none`` (a fresh start, the default),
``verified`` (every rank resumes from what ``warden_resume_checkpoint`` returns, the documented
way) or a checkpoint path (``train(resume_from_checkpoint=PATH)``, which the callback checks);
TRUSTED_KEYS: the callback's ``trusted_keys``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from hf_data import TinyText  # beside this script, which torchrun runs by path
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from trainer.integrations.hf import WardenCallback
from trainer.integrations.hf_resume import warden_resume_checkpoint


def main() -> None:
    tokenizer_dir, model_dir, output_dir, run_dir, delay = sys.argv[1:6]
    max_steps, resume, trusted = (sys.argv[6:9] + ["2", "none", ""][len(sys.argv[6:9]) :])[:3]
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    original = Trainer._save_rng_state

    def slow_rng_state(self, directory):
        if rank == 1:
            time.sleep(float(delay))  # the delayed rank: the injected fault of this test
        original(self, directory)

    Trainer._save_rng_state = slow_rng_state
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=int(max_steps),
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    callback = WardenCallback(
        run_dir=run_dir, run_id="hf-ddp", settle_seconds=1.0, rank_wait_seconds=120.0, trusted_keys=trusted or None
    )
    checkpoint: str | None = None
    if resume == "verified":
        checkpoint = warden_resume_checkpoint(output_dir, trusted_keys=trusted, run_dir=run_dir)
        print(f"rank {rank}: resuming from {checkpoint}", flush=True)
    elif resume != "none":
        checkpoint = resume
    Trainer(
        model=model, args=args, train_dataset=TinyText(tokenizer), processing_class=tokenizer, callbacks=[callback]
    ).train(resume_from_checkpoint=checkpoint)


if __name__ == "__main__":
    main()
