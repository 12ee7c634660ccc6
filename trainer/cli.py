"""``warden train``: the PPO trainer's command line (also runs under torchrun)."""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from warden.cliutil import echo, option, run_dir_option
from warden.logs import SafeTextFormatter


@click.command("train")
@option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trainer config YAML (see trainer/configs/demo.yaml).",
)
@option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key, e.g. --set ppo.actor_lr=1e-5 (repeatable).",
)
@option("--max-steps", type=int, help="Stop after this step (overrides max_steps).")
@run_dir_option("Run directory: events.jsonl, checkpoints/, state/.")
@option(
    "--resume",
    default="auto",
    show_default=True,
    help=(
        "auto: newest checkpoint of this run that verifies (with checkpoint.trusted_keys: signed ones only; "
        "exit 1 when checkpoints exist and every one is rejected); never: start fresh; or a checkpoint "
        "directory, the only way to resume from another run's checkpoint."
    ),
)
@option(
    "--resume-with-changes",
    is_flag=True,
    default=False,
    help=(
        "Resume although the config differs from the checkpoint's in keys that shape training: the new values "
        "apply (learning rates, KL coefficient, seed, batch, estimator) and run.resumed lists the changed keys. "
        "Without it such a resume exits 2 naming them."
    ),
)
@option(
    "--resume-past-missing",
    is_flag=True,
    default=False,
    help=(
        "Let --resume auto go on (from an older checkpoint, or from step 0) although checkpoints the journal "
        "announced are gone without a retention event. Without it such a resume exits 1 naming them."
    ),
)
def train(
    config_path: str,
    overrides: tuple[str, ...],
    max_steps: int | None,
    run_dir: str,
    resume: str,
    resume_with_changes: bool,
    resume_past_missing: bool,
) -> None:
    """Train with PPO on a local model, writing events and checkpoints into RUN_DIR.

    Validates the config and every path before loading a model; fails with exit 2 naming
    the key. A resume that finds only rejected checkpoints exits 1 (each rejection is
    journalled as checkpoint.rejected). Under torchrun, only rank 0 writes events,
    checkpoints and /metrics.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeTextFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    from trainer.config import load_config
    from trainer.core import PPOTrainer

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through train(): run.finished is journalled

    signal.signal(signal.SIGTERM, _interrupt)
    cfg = load_config(config_path, list(overrides))
    name = os.path.splitext(os.path.basename(config_path))[0]
    trainer = PPOTrainer(
        cfg,
        run_dir,
        resume=resume,
        config_name=name,
        resume_with_changes=resume_with_changes,
        resume_past_missing=resume_past_missing,
    )
    try:
        if trainer.resumed:
            echo(
                f"resumed from {trainer.resumed.path} at step {trainer.step} ({trainer.resumed.verification})", err=True
            )
        trainer.train(max_steps if max_steps is not None else cfg.max_steps)
    except KeyboardInterrupt:
        echo(f"interrupted at step {trainer.step}; resume with --resume auto", err=True)
        raise click.exceptions.Exit(130) from None
    finally:
        trainer.close()
