"""Live: the verl and HF/TRL deployments' Prometheus configs page nothing while a run is healthy.

A real Prometheus (loopback, scratch dir, stopped by PID) with alerts/prometheus.verl.yml and
the repo's rules scrapes a following `warden bridge verl` over a verl run that keeps stepping
and saving, and the signer, archiver, journal and paths sidecars on the bridge's run directory.
The control: alerts/prometheus.yml (Warden's trainer expected) over the same processes shows the
false page of the issue (WardenTargetDown for job trainer; WardenTrainerAbsent once the trainer
job is dropped from it). Likewise alerts/prometheus.hf.yml over a real tiny HF Trainer run with
WardenCallback (training in a thread) and the same sidecars, nothing trainer-side scraped.

Synchronisation is on Prometheus' own state: every target up, then N new evaluations of every
rule group (/api/v1/rules lastEvaluation), collecting /api/v1/alerts at each poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import ROOT, free_port, need_binary, spawn, stop_process, wait_http, warden_cmd

from sidecars.registry import DEPLOYMENTS

pytestmark = pytest.mark.slow  # a real Prometheus and four or five real processes: about 20 s a test

ALERTS = os.path.join(ROOT, "alerts")
SIDECARS_HERE = ("signer", "archiver", "journal", "paths")
# Registered sidecars this test does not run (they need a tokenizer to scan, an OSV export, a
# baseline run): their jobs are left out of the test's config, so their own absent alerts fire
# and are the only ones allowed besides the always-firing Watchdog.
LEFT_OUT_ABSENT = {"WardenTokenscanAbsent", "WardenDepsAbsent", "WardenShadowAbsent"}
WARM_UP = 3  # evaluations of every rule group after all targets are up, before alerts count
EVALUATIONS = 8  # evaluations of every rule group after the warm-up, each polled
EVALUATION_INTERVAL = "1s"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return json.load(resp)


class VerlStepper(threading.Thread):
    """verl stepping on: a step every 0.3 s, a checkpoint every third step (a healthy run)."""

    def __init__(self, verl_run) -> None:
        super().__init__(daemon=True)
        self.verl_run = verl_run
        self.halt = threading.Event()
        self.step = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.step += 1
                self.verl_run.train_step(self.step, save=self.step % 3 == 0)
                self.halt.wait(0.3)
        except BaseException as exc:  # surfaced by the fixture
            self.error = exc


def sidecar_policies(request, tmp_path, signer_policy, archiver_policy) -> dict[str, str]:
    # The paths sidecar watches a mount the test does not fill: on the run's own filesystem, the
    # test's run (checkpoints every second) extrapolated over seconds of history makes
    # WardenPathSpaceRunningOut pending (for: 30m keeps it from paging a real deployment).
    watched = Path(tempfile.mkdtemp(prefix="warden-paths-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    request.addfinalizer(lambda: shutil.rmtree(watched, ignore_errors=True))
    paths_policy = tmp_path / "paths.yaml"
    paths_policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "check_interval_seconds": 0.2,
                "paths": [{"name": "data", "path": str(watched), "readable": True, "interval_seconds": 0.5}],
            }
        )
    )
    return {
        "signer": signer_policy,
        "archiver": archiver_policy,
        "journal": os.path.join(ROOT, "policies", "journal.yaml"),
        "paths": str(paths_policy),
    }


@contextlib.contextmanager
def running(tmp_path: Path, commands: dict[str, list[str]]) -> Iterator[dict[str, int]]:
    """The warden processes of ``commands`` ({job: argv after `warden`}), each on a free port,
    healthy on /healthz, then stopped by PID: {job: port}. No traceback in their logs."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    ports: dict[str, int] = {}
    try:
        for name, args in commands.items():
            ports[name] = free_port()
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(spawn([*warden_cmd(*args), "--port", str(ports[name])], stderr=log, stdout=log))
        for proc, name in zip(procs, commands, strict=True):
            wait_http(f"http://127.0.0.1:{ports[name]}/healthz", proc=proc, deadline_s=60)
        yield ports
    finally:
        for proc in procs:
            stop_process(proc, signal.SIGTERM)
        for log in logs:
            log.close()
    for name in commands:
        text = (tmp_path / f"{name}.log").read_text(errors="replace")
        # warden/httpserve.py logs a traceback when Prometheus, stopped mid-scrape, hangs up on
        # /metrics (BrokenPipeError): noise of the test's teardown, not a failure of the process.
        crashes = [t for t in text.split("Traceback")[1:] if "BrokenPipeError" not in t.split("----")[0]]
        assert not crashes, f"{name}:\n{text[-3000:]}"


def sidecar_commands(tmp_path: Path, run_dir: Path, policies: dict[str, str]) -> dict[str, list[str]]:
    return {
        name: [
            *("sidecar", "run", name, "--run-dir", str(run_dir)),
            *("--policy", policies[name], "--state-dir", str(tmp_path / "state" / name)),
        ]
        for name in SIDECARS_HERE
    }


@pytest.fixture
def verl_deployment(request, tmp_path, run_dir, verl_run, signer_policy, archiver_setup):
    """The bridge and the sidecars, all following run_dir, over a stepping verl run: {job: port}."""
    policies = sidecar_policies(request, tmp_path, signer_policy, archiver_setup[0])
    verl_run.start()
    stepper = VerlStepper(verl_run)
    stepper.start()
    bridge = [
        "bridge",
        "verl",
        "--run-dir",
        str(run_dir),
        "--verl-log",
        str(verl_run.log_path),
        "--rollout-dir",
        str(verl_run.rollout_dir),
        "--checkpoint-root",
        str(verl_run.ckpt_root),
        "--poll-interval",
        "0.2",
        "--stable-seconds",
        "0.3",
    ]
    try:
        with running(tmp_path, {"bridge": bridge, **sidecar_commands(tmp_path, run_dir, policies)}) as ports:
            yield ports
    finally:
        stepper.halt.set()
        stepper.join(5)
    assert stepper.error is None, stepper.error


def prometheus_config(source: str, scratch: Path, ports: dict[str, int], drop_jobs: tuple[str, ...] = ()) -> Path:
    """alerts/<source> with the test's targets: local ports, the bridge listed in a targets file,
    absolute rule paths, a short evaluation interval and no Alertmanager (alerts are read from
    Prometheus itself). Jobs of processes the test does not run are dropped, except trainer
    (the shipped default's trainer:9460 becomes a local port where nothing listens)."""
    with open(os.path.join(ALERTS, source), encoding="utf-8") as fh:
        conf = yaml.safe_load(fh)
    conf["global"] = {"scrape_interval": "500ms", "evaluation_interval": EVALUATION_INTERVAL}
    conf["rule_files"] = [os.path.join(ALERTS, p) for p in conf["rule_files"]]
    conf.pop("alerting", None)
    targets = scratch / "targets"
    targets.mkdir()
    if "bridge" in ports:
        (targets / "bridge.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{ports['bridge']}"]}]))
    kept = []
    for job in conf["scrape_configs"]:
        name = job["job_name"]
        if name in drop_jobs:
            continue
        if "file_sd_configs" in job:
            job["file_sd_configs"] = [{"files": [str(targets / "bridge*.json")], "refresh_interval": "1s"}]
        elif name == "trainer":
            job["static_configs"] = [{"targets": [f"127.0.0.1:{free_port()}"]}]
        elif name in ports:
            job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[name]}"]}]
        else:
            continue
        kept.append(job)
    conf["scrape_configs"] = kept
    path = scratch / "prometheus.yml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


class Prometheus:
    def __init__(self, config: Path, scratch: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(scratch / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = spawn(
            [
                need_binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={scratch / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        wait_http(f"{self.url}/-/ready", proc=self.proc, deadline_s=30)

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM)
        self.log.close()

    def targets(self) -> list[tuple[str, str]]:
        active = get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        return sorted((t["labels"]["job"], t["health"]) for t in active)

    def evaluations(self) -> dict[str, str]:
        groups = get_json(f"{self.url}/api/v1/rules")["data"]["groups"]
        return {g["name"]: g["lastEvaluation"] for g in groups}

    def alerts(self) -> list[dict]:
        return get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def query(self, expr: str) -> list[dict]:
        return get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["data"]["result"]


BRIDGE_BASELINE = (
    'warden_bridge_last_step > 0 and on () warden_bridge_events_emitted_total{type="checkpoint.saved"} > 0'
)


def observe(
    prom: Prometheus, want_up: set[str], baseline: str | None = BRIDGE_BASELINE, timeout: float = 60
) -> list[dict]:
    """Every alert Prometheus reported once each rule group was evaluated WARM_UP times after the
    jobs in ``want_up`` were all up, until it was evaluated EVALUATIONS more times."""
    deadline = time.monotonic() + timeout
    while not want_up <= {job for job, health in prom.targets() if health == "up"}:
        assert time.monotonic() < deadline, f"targets never all up: {prom.targets()}"
        time.sleep(0.2)
    # a healthy baseline (the bridge has reported a step and a checkpoint)
    while baseline and not prom.query(baseline):
        assert time.monotonic() < deadline, f"never true: {baseline}"
        time.sleep(0.2)
    seen: dict[str, set[str]] = {}
    start = prom.evaluations()
    alerts: list[dict] = []
    while True:
        for group, last in prom.evaluations().items():
            if last != start.get(group):
                seen.setdefault(group, set()).add(last)
        # From the third evaluation after every target was up: before it a rule may see one sample
        # of a job (up{job="bridge"} not scraped yet: WardenBridgeAbsent; one last_step sample, so
        # changes() == 0: WardenVerlNoProgress) and be pending for an evaluation, which their
        # for: clauses (2m, 5m) keep from ever paging. After it, nothing may be pending.
        if start and all(len(seen.get(g, ())) >= WARM_UP for g in start):
            alerts += prom.alerts()
        if start and all(len(seen.get(g, ())) >= WARM_UP + EVALUATIONS for g in start):
            return alerts
        assert time.monotonic() < deadline, f"rule groups not evaluated {EVALUATIONS} times: {seen}"
        time.sleep(0.2)


def active(alerts: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (a["labels"]["alertname"], a["labels"].get("job", ""), a["state"])
        for a in alerts
        if a["state"] in ("pending", "firing")
    }


def test_the_verl_config_pages_nothing_while_the_run_is_healthy(verl_deployment, tmp_path):
    assert DEPLOYMENTS["verl"].prometheus == "prometheus.verl.yml"
    scratch = tmp_path / "prom"
    scratch.mkdir()
    prom = Prometheus(prometheus_config("prometheus.verl.yml", scratch, verl_deployment), scratch)
    try:
        alerts = observe(prom, {"bridge", *SIDECARS_HERE})
        groups = set(prom.evaluations())
    finally:
        prom.stop()
    assert {"warden-meta", "warden-meta-bridge", "warden-bridge"} <= groups, groups
    assert "warden-meta-trainer" not in groups and "warden-trainer" not in groups, groups
    unexpected = {a for a in active(alerts) if a[0] != "Watchdog" and a[0] not in LEFT_OUT_ABSENT}
    assert unexpected == set(), unexpected
    assert ("Watchdog", "", "firing") in active(alerts)  # the rules did run and report


@pytest.mark.parametrize(
    ("drop_jobs", "false_page"),
    [((), ("WardenTargetDown", "trainer")), (("trainer",), ("WardenTrainerAbsent", "trainer"))],
    ids=["shipped-default", "default-without-trainer-job"],
)
def test_control_the_default_config_pages_for_the_missing_trainer(verl_deployment, tmp_path, drop_jobs, false_page):
    scratch = tmp_path / "prom"
    scratch.mkdir()
    prom = Prometheus(prometheus_config("prometheus.yml", scratch, verl_deployment, drop_jobs), scratch)
    try:
        alerts = observe(prom, {"bridge", *SIDECARS_HERE})
    finally:
        prom.stop()
    pages = {(name, job) for name, job, _state in active(alerts)}
    assert false_page in pages, active(alerts)
    unexpected = {a for a in active(alerts) if a[0] not in ("Watchdog", false_page[0]) and a[0] not in LEFT_OUT_ABSENT}
    assert unexpected == set(), unexpected  # only the trainer's absence differs from the verl config


class StopLater:
    """A TrainerCallback that keeps a tiny HF run going at a human pace until told to stop."""

    def __new__(cls, halt: threading.Event):
        from transformers import TrainerCallback

        class _Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                halt.wait(0.3)
                control.should_training_stop = halt.is_set()
                return control

        return _Stop()


@pytest.fixture
def hf_deployment(request, tmp_path, run_dir, tiny, signer_policy, archiver_setup):
    """A real HF Trainer with WardenCallback training in a thread (a checkpoint every 3 steps),
    the sidecars following its run directory: {job: port}."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from integrations.test_integ_hf import make_trainer

    from trainer.integrations import WardenCallback

    policies = sidecar_policies(request, tmp_path, signer_policy, archiver_setup[0])
    halt = threading.Event()
    trainer = make_trainer(tiny, tmp_path / "out", WardenCallback(run_dir=str(run_dir), run_id="hf-live"), 10_000)
    trainer.args.save_steps = 3
    trainer.add_callback(StopLater(halt))
    errors: list[BaseException] = []

    def train() -> None:
        try:
            trainer.train()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (run_dir / "events.jsonl").exists():
        assert thread.is_alive() and time.monotonic() < deadline, errors or "the callback wrote no journal"
        time.sleep(0.1)
    try:
        with running(tmp_path, sidecar_commands(tmp_path, run_dir, policies)) as ports:
            yield ports
    finally:
        halt.set()
        thread.join(60)
    assert not errors, errors


def test_the_hf_config_pages_nothing_while_the_run_is_healthy(hf_deployment, tmp_path):
    assert DEPLOYMENTS["hf"].prometheus == "prometheus.hf.yml" and DEPLOYMENTS["hf"].jobs == ()
    scratch = tmp_path / "prom"
    scratch.mkdir()
    prom = Prometheus(prometheus_config("prometheus.hf.yml", scratch, hf_deployment), scratch)
    try:
        # a healthy baseline: the signer signed a checkpoint the callback announced
        alerts = observe(prom, set(SIDECARS_HERE), baseline="sum(warden_signer_signed_total) > 0")
        groups = set(prom.evaluations())
        jobs = {job for job, _ in prom.targets()}
    finally:
        prom.stop()
    assert jobs == set(SIDECARS_HERE), jobs  # nothing trainer-side is scraped
    assert "warden-meta" in groups and not groups & {"warden-meta-trainer", "warden-trainer", "warden-bridge"}, groups
    unexpected = {a for a in active(alerts) if a[0] != "Watchdog" and a[0] not in LEFT_OUT_ABSENT}
    assert unexpected == set(), unexpected
    assert ("Watchdog", "", "firing") in active(alerts)
