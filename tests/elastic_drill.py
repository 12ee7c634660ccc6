"""The node-loss drill (issue 22 part 2): three torchrun agents on loopback, one lost mid-run.

Used by tests/e2e/test_elastic_drill.py (functional assertions) and bench/bench_elastic.py
(the timings). Each "node" is one ``torchrun --nnodes=2:3 --nproc-per-node=1`` agent with
c10d rendezvous on 127.0.0.1, in its own session, so losing a node is ``killpg(SIGKILL)`` of
the agent and its worker together (killing only the agent would leave its worker running).

The agent started first hosts the rendezvous store (c10d: every agent whose endpoint host is
local tries to bind the port; the first one wins, the others connect as clients). Killing
it would take the rendezvous down with it: with the c10d backend the store host is a single
point of failure, so the drill kills another node (and one whose worker is not rank 0, so the
run's journal writer survives; rank 0 moving to another node is covered by shared storage,
not by this drill). A real signer and archiver (file:// store) follow the run directory;
checkpoints need a valid signature to be resumed (``checkpoint.trusted_keys``).

Waits are on conditions with deadlines (journal events, files, ports); nothing sleeps to sync.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from support import ROOT, TEST_CONFIG, free_port, merge, scrape, stop_process, wait_http, warden_cmd

from warden import journal as ev

RDZV_CONF = "join_timeout=120,last_call_timeout=3,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"
"""Short rendezvous timeouts: a lost node is noticed within ~3 s, the survivors wait 3 s for more."""


def wait_for(what: str, check: Callable[[], Any], deadline_s: float, alive: Callable[[], str | None]) -> Any:
    """Polls ``check`` until truthy; fails naming ``what`` at the deadline or when ``alive`` reports a death."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        problem = alive()
        if problem:
            raise AssertionError(f"{what}: {problem}")
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {deadline_s}s (last: {last!r})")


def event_time(event: ev.Event) -> float:
    """Unix time of a journal event (its RFC 3339 ``time``)."""
    return dt.datetime.strptime(event.time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


def workers(agent_pid: int) -> dict[int, int]:
    """{pid: RANK} of a torchrun agent's workers: its children with torchrun's environment (/proc).

    torchrun starts each worker in a session of its own, so the agent's process group does
    not hold them.
    """
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != agent_pid:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        values = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"TORCHELASTIC_RUN_ID" in values and b"RANK" in values:
            found[int(pid)] = int(values[b"RANK"])
    return found


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class ElasticDrill:
    """One drill's world under ``base``. ``run()`` does it all and returns the figures."""

    base: Path
    steps: int = 8
    kill_after_step: int = 3  # the node is lost while step kill_after_step + 1 runs
    checkpoint_every: int = 2
    nodes: int = 3
    max_restarts: int = 3
    # Big enough that a step takes about a second on 2 cores with 3 workers: the kill lands mid-step.
    model: dict[str, Any] = field(
        default_factory=lambda: {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 768}
    )
    new_tokens: int = 16
    # torch's default shares the agent's TCPStore with the workers and keeps it across restarts
    # while the same node stays rank 0, so a restarted group can read the previous generation's
    # gloo/NCCL addresses and fail once more (pytorch/pytorch#135712); docs/elastic.md.
    extra_env: dict[str, str] = field(default_factory=lambda: {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    agents: list[Node] = field(default_factory=list)
    services: list[tuple[str, subprocess.Popen[bytes], Path, int]] = field(default_factory=list)
    killed: Node | None = None
    kill_time: float = 0.0

    def __post_init__(self) -> None:
        self.run_dir = self.base / "run"
        self.root = self.run_dir / "checkpoints"
        self.store = self.base / "store"
        self.run_dir.mkdir(parents=True, mode=0o755)
        self.store.mkdir()
        self.rdzv_port = free_port()

    # -- setup ------------------------------------------------------------------------------
    def write_config(self, tiny_cache: str) -> str:
        """6 prompts x 2 responses: the global batch of 12 splits over 3 ranks and over 2."""
        from warden.signing import generate_keypair

        self.keys = generate_keypair(str(self.base / "keys"))
        raw = merge(
            TEST_CONFIG,
            {
                "run": {"run_id": "elastic-drill", "metrics_port": 0},
                "model": {"tiny": {"cache_dir": tiny_cache, **self.model}},
                "rollout": {"n": 2, "max_new_tokens": self.new_tokens},
                "ppo": {"train_batch_size": 6, "mini_batch_size": 12, "micro_batch_size": 2},
                "checkpoint": {
                    "every_steps": self.checkpoint_every,
                    "keep_last": self.steps,  # keep every one: the test verifies each signature
                    "trusted_keys": str(self.keys.public_key),
                },
                "max_steps": self.steps,
            },
        )
        # Built once here: three workers building the same assets at once would race.
        from trainer.assets import ensure_tiny_assets
        from trainer.config import TinyAssets

        ensure_tiny_assets(TinyAssets(**raw["model"]["tiny"]))
        self.config = self.base / "elastic.yaml"
        self.config.write_text(yaml.safe_dump(raw))
        return str(self.config)

    def _policies(self) -> tuple[Path, Path]:
        key = str(self.keys.private_key)
        signer = self.base / "signer.yaml"
        signer.write_text(
            yaml.safe_dump({"version": 1, "signing_key": key, "check_interval_seconds": 0.05, "stable_seconds": 0})
        )
        archiver = self.base / "archiver.yaml"
        archiver.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "store": self.store.as_uri(),
                    "signing_key": key,
                    "top_k": 3,
                    "retention": {"mode": "none", "days": 0, "require_object_lock": False},
                    "check_interval_seconds": 0.1,
                }
            )
        )
        return signer, archiver

    # -- processes ----------------------------------------------------------------------------
    def _agent(self, index: int) -> Node:
        log = self.base / f"node{index}.log"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes=2:{self.nodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.rdzv_port}",
            "--rdzv-id=elastic-drill",
            f"--rdzv-conf={RDZV_CONF}",
            f"--max-restarts={self.max_restarts}",
            "--monitor-interval=0.2",
            "--local-addr=127.0.0.1",
            *warden_cmd("train", "--config", str(self.config), "--run-dir", str(self.run_dir))[1:],
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **self.extra_env}
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        return Node(f"node{index}", proc, log)

    def _service(self, name: str, policy: Path) -> None:
        port = free_port()
        log = self.base / f"{name}.log"
        args = ["sidecar", "run", name, "--run-dir", str(self.run_dir), "--poll-interval", "0.05"]
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                warden_cmd(*args, "--policy", str(policy), "--port", str(port)),
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        self.services.append((name, proc, log, port))
        wait_http(f"http://127.0.0.1:{port}/healthz", deadline_s=60, proc=proc)

    def samples(self, name: str) -> dict:
        port = next(p for n, _, _, p in self.services if n == name)
        return scrape(port)

    def problem(self) -> str | None:
        """A dead sidecar or a survivor agent that exited: the drill cannot go on."""
        for name, proc, log, _ in self.services:
            if proc.poll() is not None:
                return f"{name} exited {proc.returncode}: {log.read_text()[-2000:]}"
        for node in self.agents:
            if node is not self.killed and node.proc.poll() not in (None, 0):
                return f"{node.name} exited {node.proc.returncode}: {node.log.read_text()[-3000:]}"
        return None

    def _store_listening(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            return sock.connect_ex(("127.0.0.1", self.rdzv_port)) == 0

    # -- the journal ---------------------------------------------------------------------------
    def events(self) -> list[ev.Event]:
        path = self.run_dir / ev.JOURNAL_NAME
        if not path.exists():
            return []
        return [e for e, _ in ev.JournalReader(str(path)).read_available()]

    def completed(self, step: int) -> bool:
        return any(e.type == ev.STEP_COMPLETED and e.step == step for e in self.events())

    def signed(self, step: int) -> bool:
        from warden.signing import load_trusted_keys, verify_checkpoint

        path = self.root / f"step-{step:09d}"
        if not Path(str(path) + ".sig").exists():
            return False
        return verify_checkpoint(str(path), load_trusted_keys(str(self.keys.public_key))).ok

    # -- the drill -------------------------------------------------------------------------------
    def start(self) -> None:
        """Agent 0 first (it hosts the rendezvous store), then the others; the sidecars once the journal exists."""
        # The sidecars follow the journal from its first line: an empty one made as the trainer
        # would (0644: sidecars refuse a journal others can write), before anything trains.
        journal = self.run_dir / ev.JOURNAL_NAME
        os.close(os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        signer, archiver = self._policies()
        self._service("signer", signer)
        self._service("archiver", archiver)
        self.agents.append(self._agent(0))
        wait_for("the rendezvous store of node0", self._store_listening, 60, self.problem)
        self.agents += [self._agent(i) for i in range(1, self.nodes)]

    def lose_a_node(self) -> Node:
        """Waits for step kill_after_step (and a signed checkpoint before it), then kills a node."""
        last_ckpt = self.kill_after_step - self.kill_after_step % self.checkpoint_every
        wait_for(f"step {self.kill_after_step}", lambda: self.completed(self.kill_after_step), 180, self.problem)
        if last_ckpt:
            wait_for(f"step-{last_ckpt} signed", lambda: self.signed(last_ckpt), 60, self.problem)
        assert not any(e.type == ev.RUN_FINISHED for e in self.events()), "the run ended before a node was lost"
        victim = next(n for n in reversed(self.agents[1:]) if 0 not in workers(n.proc.pid).values())
        doomed = workers(victim.proc.pid)
        assert victim.proc.poll() is None and doomed, f"{victim.name} has no worker to lose"
        self.killed = victim
        self.kill_time = time.time()
        # The node's power goes: its agent and its worker (each in a session of its own) at once.
        os.killpg(victim.proc.pid, signal.SIGKILL)
        for pid in doomed:
            os.killpg(pid, signal.SIGKILL)
        victim.proc.wait()
        return victim

    def finish(self, deadline_s: float = 240) -> None:
        survivors = [n for n in self.agents if n is not self.killed]
        done = lambda: all(n.proc.poll() is not None for n in survivors)  # noqa: E731
        wait_for("the survivors to finish", done, deadline_s, self.problem)
        for node in survivors:
            assert node.proc.returncode == 0, f"{node.name}: {node.log.read_text()[-3000:]}"

    def drain(self, archived_steps: int, deadline_s: float = 60) -> None:
        """Waits until the archiver holds every step and the signer signed every checkpoint."""
        saved = sorted(p.name for p in self.root.iterdir() if p.name.startswith("step-") and p.is_dir())
        wait_for(
            "every checkpoint signed",
            lambda: all(self.signed(int(n[5:])) for n in saved),
            deadline_s,
            self.problem,
        )
        wait_for(
            "every step archived",
            lambda: (
                self.samples("archiver").get(("warden_archiver_last_archived_step", ()), 0) >= archived_steps
                and self.samples("archiver").get(("warden_archiver_spool_depth", ()), 1) == 0
            ),
            deadline_s,
            self.problem,
        )

    def close(self) -> None:
        for node in self.agents:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
        for _, proc, _, _ in self.services:
            stop_process(proc, timeout=10)


@dataclass(frozen=True)
class Figures:
    """The drill's measurements (bench/bench_elastic.py prints them)."""

    kill_to_first_step_s: float
    steps_per_s_before: float
    steps_per_s_after: float
    world_before: int
    world_after: int
    lost_steps: int
    kill_to_restart_s: float  # the new generation's first event: failure seen, rendezvous, worker start
    kill_to_resumed_s: float  # run.resumed: models built, the signed checkpoint verified and loaded

    @property
    def ratio(self) -> float:
        return self.steps_per_s_after / self.steps_per_s_before


def measure(events: list[ev.Event], kill_time: float) -> Figures:
    """Kill -> first step completed after the resume; steps/s of each generation between its own steps.

    Throughput is measured between step completions of one generation (so model loading and
    the first step's warm-up are left out on both sides).
    """
    resumed = next(e for e in events if e.type == ev.RUN_RESUMED)
    at = events.index(resumed)
    before = [e for e in events[:at] if e.type == ev.STEP_COMPLETED]
    after = [e for e in events[at:] if e.type == ev.STEP_COMPLETED]

    def rate(steps: list[ev.Event]) -> float:
        times = [event_time(e) for e in steps[1:]]  # from the end of the first step: no warm-up
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 2 else float("nan")

    failed = max(i for i, e in enumerate(events[:at]) if e.type in (ev.STEP_COMPLETED, ev.RUN_FINISHED))
    restart = events[failed + 1]  # the first event the new generation's rank 0 wrote
    return Figures(
        kill_to_first_step_s=event_time(after[0]) - kill_time,
        kill_to_restart_s=event_time(restart) - kill_time,
        kill_to_resumed_s=event_time(resumed) - kill_time,
        steps_per_s_before=rate(before),
        steps_per_s_after=rate(after),
        world_before=int(before[-1].data["world_size"]),
        world_after=int(after[-1].data["world_size"]),
        lost_steps=int(resumed.data["lost_steps"]),
    )
