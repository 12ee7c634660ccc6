"""``warden deps audit`` and ``warden deps osv-serve``. Exit codes 0 clean / 1 violation / 2 usage / 3 incomplete."""

from __future__ import annotations

import json
import os
import signal
import threading
from types import FrameType

import click

from warden.cliutil import echo, echo_json, option, policy_options
from warden.deps.audit import AuditSettings, run_audit
from warden.deps.environment import Target, discover_python, discover_self, discover_site_packages
from warden.deps.errors import DepsConfigError
from warden.deps.model import CHECKS
from warden.deps.osv.importer import import_export, server_date
from warden.deps.osv.loader import load_database
from warden.deps.osv.server import OsvServer
from warden.deps.policy import DepsPolicy, as_dict, resolve
from warden.deps.report import to_json, to_text
from warden.deps.sbom import build_sbom
from warden.logs import configure_json_logging, log_fields
from warden.policy import load_policy
from warden.safeio import atomic_write_bytes
from warden.statedir import resolve_state_dir

OSV_SERVE_PORT = 9469


@click.group()
def deps() -> None:
    """Dependency audit: lock hygiene, drift, installed-file integrity, known vulnerabilities."""


def load_deps_policy(path: str) -> tuple[DepsPolicy, str]:
    """The policy at ``path`` (resolved by :func:`warden.policy.resolve_policy_path`)."""
    return load_policy(path, DepsPolicy), path


def pick_target(python: str | None, site_packages: str | None, policy: DepsPolicy) -> Target:
    if python and site_packages:
        raise DepsConfigError("pass either --python or --site-packages, not both")
    homes, env_files = policy.target.user_homes, policy.target.env_files
    if python:
        return discover_python(python, user_homes=homes, env_files=env_files)
    if site_packages:
        return discover_site_packages(site_packages, as_dict(policy.target.markers))
    return discover_self(homes, env_files)


def build_settings(
    policy: DepsPolicy,
    policy_path: str | None,
    state_dir: str | None,
    lock: str | None = None,
    osv_db: str | None = None,
    baseline: str | None = None,
    **overrides: object,
) -> AuditSettings:
    """AuditSettings from the policy, with command-line values taking precedence."""
    lock_path = os.path.abspath(lock) if lock else (resolve(policy.lock.path, policy_path) if policy_path else None)
    db = os.path.abspath(osv_db) if osv_db else resolve(policy.vulnerabilities.osv_db, policy_path)
    base = os.path.abspath(baseline) if baseline else resolve(policy.integrity.baseline, policy_path)
    if base is None and state_dir:
        base = os.path.join(os.path.abspath(state_dir), "baseline.json")
    values: dict[str, object] = {
        "wheel_dirs": tuple(str(resolve(d, policy_path)) for d in policy.lock.wheel_dirs),
        "pip_audit": policy.vulnerabilities.pip_audit_crosscheck,
        "online": policy.vulnerabilities.online,
        "strict": policy.strict,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return AuditSettings(
        policy=policy,
        lock_path=lock_path,
        osv_db=db,
        state_dir=os.path.abspath(state_dir) if state_dir else None,
        baseline_path=base,
        **values,  # type: ignore[arg-type]
    )


@deps.command("audit")
@policy_options("deps")
@option(
    "--lock",
    type=click.Path(dir_okay=False),
    help="Lock file (pylock.toml or hashed requirements); overrides lock.path.",
)
@option("--python", "python", type=click.Path(dir_okay=False), help="Audit the environment of this interpreter.")
@option("--site-packages", type=click.Path(file_okay=False), help="Audit this site-packages directory (read only).")
@option("--osv-db", type=click.Path(), help="OSV export: a directory or all.zip; overrides vulnerabilities.osv_db.")
@option(
    "--state-dir",
    help="Cache and baseline directory. Default: $XDG_STATE_HOME/warden/deps (~/.local/state/warden/deps); "
    "never the current directory.",
)
@option("--baseline", type=click.Path(dir_okay=False), help="Approved baseline. Default: <state-dir>/baseline.json.")
@option("--approve", is_flag=True, help="Record the current RECORDs as the approved baseline (if integrity is clean).")
@option("--check", "checks", multiple=True, type=click.Choice(CHECKS), help="Run only these checks (repeatable).")
@option("--full", is_flag=True, help="Re-hash and re-compile everything, ignoring the incremental cache.")
@option("--pip-audit/--no-pip-audit", "pip_audit", default=None, help="Cross-check with pip-audit via osv-serve.")
@option("--online", is_flag=True, default=None, help="Also ask pip-audit's online service (fails closed).")
@option("--strict/--no-strict", default=None, help="A degraded source (stale OSV data, failed cross-check) exits 3.")
@option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "cyclonedx"]),
    default="text",
    show_default=True,
    help="Report format; cyclonedx prints the SBOM.",
)
@option("--sbom", type=click.Path(dir_okay=False), help="Also write a CycloneDX JSON SBOM to this file.")
@click.pass_context
def audit(
    ctx: click.Context,
    policy: str,
    lock: str | None,
    python: str | None,
    site_packages: str | None,
    osv_db: str | None,
    state_dir: str | None,
    baseline: str | None,
    approve: bool,
    checks: tuple[str, ...],
    full: bool,
    pip_audit: bool | None,
    online: bool | None,
    strict: bool | None,
    output_format: str,
    sbom: str | None,
) -> None:
    """Audit an environment against the lock; exit 0 clean, 1 violation, 3 incomplete.

    The target is the auditor's own environment, or --python PATH (its files are read, never run:
    its sys.path, site-packages and bytecode tag come from pyvenv.cfg, the stdlib and .pth files),
    or --site-packages DIR.
    """
    loaded, policy_path = load_deps_policy(policy)
    state_dir = resolve_state_dir(state_dir, "deps", say=lambda line: echo(line, err=True))
    target = pick_target(python, site_packages, loaded)
    settings = build_settings(
        loaded,
        policy_path,
        state_dir,
        lock,
        osv_db,
        baseline,
        checks=frozenset(checks or CHECKS),
        full_pass=full,
        pip_audit=pip_audit,
        online=online or None,
        strict=strict,
        approve=approve,
    )
    report = run_audit(settings, target)
    document = build_sbom(report) if (sbom or output_format == "cyclonedx") else None
    if sbom and document is not None:
        atomic_write_bytes(sbom, json.dumps(document, indent=2).encode())
    if output_format == "json":
        echo_json(to_json(report))
    elif output_format == "cyclonedx":
        echo(json.dumps(document, indent=2))
    else:
        echo(to_text(report))
    ctx.exit(report.exit_code)


@deps.command("osv-import")
@click.argument("source")
@click.argument("dest", type=click.Path())
@option("--date", default=None, help="The download's server Date (RFC 1123 or ISO 8601) for a local SOURCE.")
def osv_import(source: str, dest: str, date: str | None) -> None:
    """Copy or download (https) an OSV export to DEST and record its download time in DEST.meta.json."""
    when = None
    if date:
        when = server_date({"Date": date}) or _iso_time(date)
        if when is None:
            raise DepsConfigError(f"--date {date!r}: not an RFC 1123 or ISO 8601 date")
    echo(import_export(source, dest, when).decode())


def _iso_time(value: str) -> float | None:
    import datetime as dt

    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo else None


@deps.command("osv-serve")
@option("--db", "db_path", required=True, type=click.Path(), help="OSV export: a directory or all.zip.")
@option("--listen", default="127.0.0.1", show_default=True, help="Address to bind.")
@option("--port", type=int, default=OSV_SERVE_PORT, show_default=True, help="Port (0 picks a free one).")
@option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
def osv_serve(db_path: str, listen: str, port: int, log_level: str) -> None:
    """Serve an offline OSV database as an OSV-compatible API (/v1/query, /v1/querybatch, /v1/vulns/ID).

    Point pip-audit at it: pip-audit -s osv --osv-url http://127.0.0.1:PORT/v1/query
    """
    configure_json_logging(log_level)
    import logging

    log = logging.getLogger("warden.deps.osv")
    db = load_database(db_path)
    try:
        server = OsvServer(db, listen, port)
    except OSError as exc:
        raise DepsConfigError(f"cannot listen on {listen}:{port} ({exc.strerror}); pick another with --port") from None
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server.start()
    fields = log_fields(url=server.query_url, records=len(db.records), corrupt=len(db.errors), db=db_path)
    log.info("osv-serve listening", extra=fields)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        log.info("osv-serve stopped", extra=log_fields(url=server.query_url))
