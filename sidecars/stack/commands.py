"""``warden demo`` and ``warden stack up``."""

from __future__ import annotations

import os
import time

import click

from warden.cliutil import option, run_dir_option


@click.command("demo")
@run_dir_option("Where the demo run goes. Default: ./runs/demo-<UTC time>.", required=False)
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


@click.group("stack")
def stack() -> None:
    """Run the docker-compose services as local processes."""


@stack.command("up")
@run_dir_option("Run directory the sidecars watch.")
@option(
    "--compose-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Compose file whose warden services to run. Default: the checkout's docker-compose.yml.",
)
@option(
    "--signing-key",
    default="",
    type=click.Path(dir_okay=False),
    help="Private key for signer and archiver. Default: <run-dir>/keys/signing.key (created if missing).",
)
@option(
    "--policy-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Directory of the sidecars' policies. Default: the checkout's policies/.",
)
@option("--only", multiple=True, help="Run only these warden services (repeatable).")
@option("--no-s3", is_flag=True, help="Do not start SeaweedFS.")
@option("--s3-access-key", default="", help="Access key the local SeaweedFS accepts. Default: a random one.")
@option("--s3-secret-key", default="", help="Secret key the local SeaweedFS accepts. Default: a random one.")
@option("--no-prometheus", is_flag=True, help="Do not start Prometheus and Alertmanager.")
@option("--scrape-interval", default="1s", show_default=True, help="Prometheus scrape interval.")
@option("--evaluation-interval", default="1s", show_default=True, help="Prometheus rule evaluation interval.")
@option("--pager-url", default="", help="Webhook URL of the pager receiver (critical alerts).")
@option("--ticket-url", default="", help="Webhook URL of the ticket receiver (warnings).")
@option("--deadman-url", default="", help="Webhook URL of the dead-man's switch (Watchdog).")
def stack_up(
    run_dir: str,
    compose_file: str | None,
    signing_key: str,
    policy_dir: str | None,
    only: tuple[str, ...],
    no_s3: bool,
    s3_access_key: str,
    s3_secret_key: str,
    no_prometheus: bool,
    scrape_interval: str,
    evaluation_interval: str,
    pager_url: str,
    ticket_url: str,
    deadman_url: str,
) -> None:
    """Start the stack, wait until every service is ready, print the URLs, supervise.

    Crashed services are restarted (three times at most); Ctrl-C or SIGTERM stops all
    of them by PID.
    """
    from sidecars.stack.local import StackOptions, run_stack

    run_dir = os.path.abspath(run_dir)
    receivers = {k: v for k, v in (("pager", pager_url), ("ticket", ticket_url), ("deadman", deadman_url)) if v}
    opts = StackOptions(
        run_dir=run_dir,
        signing_key=signing_key,
        only=only,
        with_s3=not no_s3,
        with_prometheus=not no_prometheus,
        receivers=receivers,
        scrape_interval=scrape_interval,
        evaluation_interval=evaluation_interval,
    )
    if s3_access_key and s3_secret_key:
        opts.s3_credentials = (s3_access_key, s3_secret_key)
    if compose_file:
        opts.compose_file = os.path.abspath(compose_file)
    if policy_dir:
        opts.policy_dir = os.path.abspath(policy_dir)
    run_stack(opts, click.echo)
