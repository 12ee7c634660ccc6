"""``warden sidecar list|run``."""

from __future__ import annotations

import os
import sys

import click

from sidecars.registry import SIDECARS, sidecar_class
from sidecars.runner import Runner
from sidecars.runtime import Sidecar, SidecarContext
from warden.cliutil import echo, echo_json, format_option, option, policy_options, run_dir_option
from warden.errors import ConfigError
from warden.httpserve import MetricsServer
from warden.logs import configure_json_logging, log_fields
from warden.policy import load_policy, resolve_policy_path
from warden.statedir import resolve_state_dir


@click.group()
def sidecar() -> None:
    """List the sidecars or run one."""


@sidecar.command("list")
@format_option()
def list_sidecars(output_format: str) -> None:
    """Show every registered sidecar, its default port and what it does."""
    rows = []
    for name in SIDECARS:
        cls = sidecar_class(name)
        rows.append(
            {"name": name, "port": cls.default_port, "description": cls.description, "events": sorted(cls.handles)}
        )
    if output_format == "json":
        echo_json(rows)
        return
    for row in rows:
        echo(f"{row['name']:<10} :{row['port']:<6} {row['description']}")


def _resolve_policy(cls: type[Sidecar], policy: str | None, policy_dir: str | None) -> tuple[object, str | None]:
    if cls.policy_schema is None:
        return None, None
    path = resolve_policy_path(cls.name, policy, policy_dir)
    return load_policy(path, cls.policy_schema), path


@sidecar.command("run")
@click.argument("name")
@run_dir_option(required=False)
@option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Where cursors and spools live. Default: <run-dir>/state/<name>, else $XDG_STATE_HOME/warden/<name> "
    "(~/.local/state/warden/<name>); never the current directory.",
)
@policy_options()
@option("--port", type=int, help="Port of /metrics and /healthz. Default: the sidecar's own (see `sidecar list`).")
@option("--listen", default="127.0.0.1", show_default=True, help="Address to bind /metrics to.")
@option("--once", is_flag=True, help="Handle the backlog and run one round of checks, then exit 0/1/3.")
@option(
    "--poll-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between journal polls (inotify misses writes made by other NFS clients).",
)
@option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
def run_sidecar(
    name: str,
    run_dir: str | None,
    state_dir: str | None,
    policy: str | None,
    policy_dir: str | None,
    port: int | None,
    listen: str,
    once: bool,
    poll_interval: float,
    log_level: str,
) -> None:
    """Run sidecar NAME until SIGTERM (or one pass with --once).

    Logs JSON lines to stderr; serves Prometheus metrics on /metrics and liveness on /healthz.
    """
    configure_json_logging(log_level)
    cls = sidecar_class(name)
    if cls.needs_run_dir and not run_dir:
        raise click.UsageError(f"sidecar {name!r} follows a journal: pass --run-dir DIR (or WARDEN_RUN_DIR)")
    policy_obj, policy_path = _resolve_policy(cls, policy, policy_dir)
    state_dir = resolve_state_dir(state_dir, name, run_dir, say=lambda line: echo(line, err=True))
    os.makedirs(state_dir, exist_ok=True)
    ctx = SidecarContext(
        name=name,
        state_dir=os.path.abspath(state_dir),
        run_dir=os.path.abspath(run_dir) if run_dir else None,
        policy=policy_obj,
        policy_path=policy_path,
    )
    runner = Runner(cls(ctx), poll_seconds=poll_interval)
    if once:
        sys.exit(int(runner.run_once()))
    try:
        server = MetricsServer(ctx.registry, listen, cls.default_port if port is None else port, runner.health)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {listen}:{port or cls.default_port} ({exc.strerror}); pick another with --port"
        ) from None
    server.start()
    ctx.log.info("serving metrics", extra=log_fields(sidecar=name, url=f"http://{listen}:{server.port}/metrics"))
    try:
        code = runner.run_forever(server)
    finally:
        server.stop()
    sys.exit(code)
