"""``warden demo`` and ``warden stack up``."""

from __future__ import annotations

import os
import time

import click

from sidecars.cliutil import option


@click.command("demo")
@option("--run-dir", type=click.Path(file_okay=False), help="Where the demo run goes. Default: ./runs/demo-<UTC time>.")
@option("--steps", type=int, default=30, show_default=True, help="PPO steps to train.")
def demo(run_dir: str | None, steps: int) -> None:
    """Train a tiny model with PPO while every sidecar watches, then explain what happened.

    Needs no network and no GPU: the tokenizer and model are built offline on first use.
    S3 (SeaweedFS), Prometheus and Alertmanager join when they are installed.
    """
    from sidecars.stack.demo import run_demo

    run_dir = run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S", time.gmtime()))
    result = run_demo(run_dir, steps, click.echo)
    if result.trainer_exit != 0:
        raise click.exceptions.Exit(result.trainer_exit)
