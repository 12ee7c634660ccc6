"""``warden bridge verl``: Warden events from an unmodified verl run."""

from __future__ import annotations

import sys

import click

from sidecars.bridge.service import DEFAULT_PORT, BridgeService
from sidecars.bridge.verl import BridgeConfig, PassReport, VerlBridge
from sidecars.runner import Runner
from sidecars.runtime import SidecarContext
from warden.cliutil import echo, echo_json, format_option, option, run_dir_option
from warden.errors import ConfigError
from warden.httpserve import MetricsServer
from warden.logs import configure_json_logging, log_fields
from warden.statedir import resolve_state_dir


@click.group()
def bridge() -> None:
    """Turn what other trainers write into Warden events, without changing the trainer."""


def _print_report(report: PassReport, output_format: str) -> None:
    if output_format == "json":
        echo_json(report.to_dict())
        return
    emitted = ", ".join(f"{k} {v}" for k, v in sorted(report.emitted.items())) or "nothing new"
    echo(f"emitted: {emitted}")
    if report.restarts:
        echo(f"verl restarts detected: {report.restarts}")
    for title, items in (("waiting", report.pending), ("skipped", report.problems), ("unreadable", report.incomplete)):
        for item in items:
            echo(f"{title}: {item}")


@bridge.command("verl")
@run_dir_option("Run directory: the journal goes here.")
@option("--verl-log", type=click.Path(dir_okay=False), help="verl's file logger JSONL ($VERL_FILE_LOGGER_PATH).")
@option("--rollout-dir", type=click.Path(file_okay=False), help="verl's trainer.rollout_data_dir ({step}.jsonl dumps).")
@option(
    "--checkpoint-root",
    type=click.Path(file_okay=False),
    help="verl's trainer.default_local_dir (global_step_N/ and latest_checkpointed_iteration.txt).",
)
@option("--run-id", help="Run id of the events. Default: the journal's, else verl's experiment name (log file stem).")
@option("--state-dir", type=click.Path(file_okay=False), help="Bridge state. Default: <run-dir>/state/bridge.")
@option("--once", is_flag=True, help="Process what exists now, print a summary, exit 0 (3: an input was unreadable).")
@option("--poll-interval", type=float, default=2.0, show_default=True, help="Seconds between passes when following.")
@option(
    "--stable-seconds",
    type=float,
    default=30.0,
    show_default=True,
    help="Quiet time after which a checkpoint (or a dump without other evidence) counts as complete.",
)
@option("--top-k", type=int, default=4, show_default=True, help="Samples per reward.snapshot (best score first).")
@option("--min-reward", type=float, help="Leave samples scored below this out of snapshots.")
@option("--max-text-chars", type=int, default=4000, show_default=True, help="Cut prompts and responses to this.")
@option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="Port of /metrics and /healthz; 0: none.")
@option("--listen", default="127.0.0.1", show_default=True, help="Address to bind /metrics to.")
@option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@format_option()
def verl(
    run_dir: str,
    verl_log: str | None,
    rollout_dir: str | None,
    checkpoint_root: str | None,
    run_id: str | None,
    state_dir: str | None,
    once: bool,
    poll_interval: float,
    stable_seconds: float,
    top_k: int,
    min_reward: float | None,
    max_text_chars: int,
    port: int,
    listen: str,
    log_level: str,
    output_format: str,
) -> None:
    """Follow a verl run and append Warden events to RUN_DIR/events.jsonl.

    step.completed per file-logger line (verl truncates that file on restart: the bridge
    notices and writes run.resumed), reward.snapshot with the top-k samples of each
    complete rollout dump, checkpoint.saved for the global_step_N named by
    latest_checkpointed_iteration.txt once both are stable. Point the signer and archiver
    sidecars at the same RUN_DIR. Without --once it runs until SIGTERM.
    """
    configure_json_logging(log_level)
    if poll_interval <= 0:
        raise ConfigError(f"--poll-interval: must be > 0, got {poll_interval}")
    state_dir = resolve_state_dir(state_dir, "bridge", run_dir, say=lambda line: echo(line, err=True))
    cfg = BridgeConfig(
        run_dir=run_dir,
        verl_log=verl_log,
        rollout_dir=rollout_dir,
        checkpoint_root=checkpoint_root,
        state_dir=state_dir,
        run_id=run_id,
        stable_seconds=stable_seconds,
        top_k=top_k,
        min_reward=min_reward,
        max_text_chars=max_text_chars,
    )
    worker = VerlBridge(cfg)
    if once:
        try:
            report = worker.run_pass()
        finally:
            worker.close()
        _print_report(report, output_format)
        sys.exit(report.exit_code)
    _follow(worker, poll_interval, port, listen)


def _follow(worker: VerlBridge, poll_interval: float, port: int, listen: str) -> None:
    """Runs the bridge through the sidecars' Runner until SIGTERM (metrics on ``port``; 0: none)."""
    ctx = SidecarContext(
        name=BridgeService.name,
        state_dir=worker.cfg.resolved_state_dir,
        run_dir=None,  # the bridge writes the journal; it follows none
        registry=worker.registry,
        log=worker.log,
    )
    runner = Runner(BridgeService(ctx, worker, poll_interval), poll_seconds=poll_interval)
    server = None
    if port:
        try:
            server = MetricsServer(worker.registry, listen, port, runner.health).start()
        except OSError as exc:
            worker.close()
            raise ConfigError(f"cannot listen on {listen}:{port} ({exc.strerror}); pick another with --port") from None
    worker.log.info(
        "bridge started",
        extra=log_fields(run_dir=worker.cfg.run_dir, run_id=worker.run_id, port=server.port if server else None),
    )
    try:
        runner.run_forever(server)
    finally:
        if server is not None:
            server.stop()
        worker.log.info("bridge stopped")
