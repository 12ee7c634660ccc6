"""`warden demo`: a short PPO run with every available sidecar attached, then a summary.

Steps: make a run directory, a demo signing key and demo policies that point at the run;
start the sidecars (and S3, Prometheus and Alertmanager where installed) as local
processes on free ports; run the trainer on the tiny offline model; let the sidecars
catch up; run the one-shot checks; stop everything by PID; print what happened.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecars.stack import components, verdicts
from sidecars.stack.summary import ascii_chart, facts_from_events
from sidecars.stack.supervisor import Supervisor
from warden.errors import ConfigError
from warden.journal import JOURNAL_NAME, Cursor, JournalReader

Echo = Callable[[str], None]


def demo_config_path() -> str:
    """trainer/configs/demo.yaml, found without importing the trainer package."""
    spec = importlib.util.find_spec("trainer")
    if spec is None or spec.origin is None:
        raise ConfigError("the trainer package is not installed; install warden with the train extra")
    return os.path.join(os.path.dirname(spec.origin), "configs", "demo.yaml")


@dataclass
class DemoResult:
    run_dir: str
    trainer_exit: int
    verdicts: dict[str, str] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)


def run_trainer(run_dir: str, steps: int, metrics_port: int, echo: Echo) -> int:
    """Runs `warden train` on the demo config, echoing its step lines."""
    argv = [
        sys.executable,
        "-m",
        "sidecars.cli",
        "train",
        "--config",
        demo_config_path(),
        "--run-dir",
        run_dir,
        "--max-steps",
        str(steps),
        "--set",
        f"run.metrics_port={metrics_port}",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    log_path = os.path.join(run_dir, "logs", "trainer.log")
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            for line in proc.stdout:
                log.write(line)
                if line.startswith(("step ", "resumed", "error")):
                    echo("  " + line.rstrip())
    except BaseException:
        proc.terminate()  # the trainer journals run.finished and exits; never leave it behind
        proc.wait(30)
        raise
    return proc.wait()


def approve_demo_assets(run_dir: str, echo: Echo) -> None:
    """Approves the demo's own tokenizer and model for tokenscan before the run, as a person
    would after reviewing them (issue 33: the sidecar never approves; a directory it sees first
    is unapproved): builds the tiny offline assets the demo config names (the trainer reuses the
    build) and runs ``warden scan tokenizer DIR... --approve`` into the sidecar's state."""
    from trainer.assets import ensure_tiny_assets
    from trainer.config import load_config

    tiny = load_config(demo_config_path()).model.tiny
    if tiny is None:
        return
    built = ensure_tiny_assets(tiny, seed=0)
    state = os.path.join(run_dir, "state", "tokenscan")
    result = components.run_quiet(
        "scan", "tokenizer", built.tokenizer_dir, built.model_dir, "--approve", "--state-dir", state
    )
    if result.returncode != 0:
        echo(f"  note: the demo's tokenizer was not approved (scan exit {result.returncode}): tokenscan reports it")


def wait_for_sidecars(plan: components.Plan, timeout: float = 60.0) -> None:
    """Waits until every journal-following sidecar reports zero lag."""
    deadline = time.monotonic() + timeout
    pending = [n for n in ("signer", "archiver", "tokenscan") if plan.port(n)]
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if components.lag_of(plan, n) != 0]
        time.sleep(0.5)
    time.sleep(2)  # the archiver uploads from its spool right after handling


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(run_dir: str, steps: int, echo: Echo) -> DemoResult:
    from sidecars.stack.local import start_in_order

    run_dir = os.path.abspath(run_dir)
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    echo(f"Warden demo: run directory {run_dir}")
    plan = components.plan_demo(run_dir)
    for note in plan.notes:
        echo(f"  note: {note}")
    supervisor = Supervisor(plan.stack.services)
    echo(f"starting {len(plan.stack.services)} services: {', '.join(s.name for s in plan.stack.services)}")
    # SIGTERM must unwind through `finally`, or the services (own sessions) would outlive us.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    result = DemoResult(run_dir=run_dir, trainer_exit=-1, urls=plan.urls)
    try:
        if plan.port("tokenscan"):
            echo("approving the demo's own tokenizer and model for tokenscan...")
            approve_demo_assets(run_dir, echo)
        start_in_order(supervisor, plan.stack)
        echo(f"training {steps} PPO steps on the tiny offline model (CPU)...")
        result.trainer_exit = run_trainer(run_dir, steps, plan.trainer_port, echo)
        echo("waiting for the sidecars to catch up with the journal...")
        wait_for_sidecars(plan)
        echo("staging a fault: a watched directory disappears for a moment...")
        staged = verdicts.staged_alert(plan)
        result.verdicts = collect_verdicts(plan, run_dir)
        result.verdicts["staged alert"] = staged
    finally:
        supervisor.stop_all()
    print_summary(result, plan, echo)
    return result


def collect_verdicts(plan: components.Plan, run_dir: str) -> dict[str, str]:
    events = [e for e, _ in JournalReader(os.path.join(run_dir, JOURNAL_NAME), Cursor()).read_available()]
    facts = facts_from_events(events)
    tokenizer = next(
        (e.data.get("path") for e in events if e.type == "model.loading" and e.data.get("kind") == "tokenizer"), None
    )
    return {
        "signatures": verdicts.signatures(plan),
        "archive": verdicts.archive(plan, facts.run_id, facts.snapshot_steps),
        "tokenizer": verdicts.tokenizer(plan, tokenizer),
        "deps": verdicts.deps(plan),
        "paths": verdicts.paths(plan),
        "alerts": verdicts.alerts(plan),
    }


def print_summary(result: DemoResult, plan: components.Plan, echo: Echo) -> None:
    events = [e for e, _ in JournalReader(os.path.join(result.run_dir, JOURNAL_NAME), Cursor()).read_available()]
    facts = facts_from_events(events)
    echo("")
    echo("=" * 76)
    echo(f"Run {facts.run_id}: {facts.last_step} steps, status {facts.status} (trainer exit {result.trainer_exit})")
    echo("")
    echo("Reward per step (mean over the batch; the task: answer with digits)")
    for line in ascii_chart(facts.rewards, label=f"last {facts.rewards[-1]:.2f}" if facts.rewards else ""):
        echo("  " + line)
    echo("")
    echo(f"Checkpoints written: {len(facts.checkpoints)}; reward snapshots: {len(facts.snapshot_steps)}")
    for name, verdict in result.verdicts.items():
        echo(f"  {name:<11} {verdict}")
    echo("")
    echo("Where to look next:")
    echo(f"  journal  warden events tail --run-dir {result.run_dir}")
    echo(f"  logs     {os.path.join(result.run_dir, 'logs')}/   policies {os.path.join(result.run_dir, 'policies')}/")
    for line in plan.next_steps:
        echo(f"  {line}")
    echo("  the stack as services: warden stack up --run-dir DIR (Prometheus, Alertmanager, S3 when installed)")
    echo("=" * 76)
