"""Cause in seconds, live: a real tiny PPO run scraped by a real Prometheus with the generated
recording rules (alerts/rules/rollout-causes.yml), and ``warden diagnose`` on its run directory.

Shared by tests/alerts/test_rollout_causes_live.py (HF engine) and
tests/vllm/test_rollout_causes_vllm.py (vLLM engine). The run's reward function sleeps per sample
while ``slow.flag`` exists next to it, so a test can slow a running trainer and time the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from support import (
    ROOT,
    TEST_CONFIG,
    free_port,
    http_get,
    merge,
    need_binary,
    spawn,
    stop_process,
    wait_http,
    warden_cmd,
)

from warden.diagnose.causes import RECORD

SLOW_PER_SAMPLE_S = 0.15  # 16 responses per step: 2.4 s of scoring

REWARD = f"""
import os
import time

FLAG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow.flag")
SLOW_RANKS = os.environ.get("SLOW_RANKS", "")  # empty: every rank is slowed


def score(data_source, solution_str, ground_truth, extra_info):
    mine = not SLOW_RANKS or os.environ.get("RANK", "0") in SLOW_RANKS.split(",")
    if mine and os.path.exists(FLAG):
        time.sleep({SLOW_PER_SAMPLE_S})
    return sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
"""


def journal_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]  # drop a line being written
    events = [json.loads(line) for line in lines if line.strip()]
    return [e for e in events if e["type"] == "step.completed"]


def event_epoch(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def step_started(event: dict) -> float:
    """Epoch seconds at which the journalled step began (its end minus its ``step_s``)."""
    return event_epoch(event) - event["data"]["timings"]["step_s"]


@dataclass
class Live:
    """A running trainer and the Prometheus scraping it."""

    code: Path  # the reward module and the trainer's config (slow.flag goes here)
    run_dir: Path
    trainer_port: int
    prom_port: int
    trainer: subprocess.Popen[bytes]
    log: Path  # the trainer's stderr

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.trainer_port}/metrics"

    def check_alive(self, what: str) -> None:
        if self.trainer.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"the trainer exited ({self.trainer.returncode}) while waiting for {what}: {tail}")

    def wait_for(self, condition: Callable[[], Any], deadline_s: float, what: str) -> Any:
        """The first truthy value of ``condition`` within ``deadline_s``; fails early if the trainer exits."""
        end = time.monotonic() + deadline_s
        while True:
            value = condition()
            if value:
                return value
            self.check_alive(what)
            assert time.monotonic() < end, f"no {what} within {deadline_s} s"
            time.sleep(0.05)

    def query(self, expr: str) -> list[dict]:
        return query(self.prom_port, expr)

    def cause_shown(self, cause: str) -> list[dict]:
        return self.query(f'{RECORD}{{cause="{cause}"}}')

    def diagnose(self, with_metrics: bool = True) -> tuple[subprocess.CompletedProcess[str], float]:
        """``warden diagnose`` on the run directory (and the trainer's /metrics); with its run time."""
        args = ["diagnose", "--run-dir", str(self.run_dir)]
        if with_metrics:
            args += ["--metrics", self.metrics]
        t0 = time.time()
        done = subprocess.run(warden_cmd(*args), capture_output=True, text=True, timeout=60, cwd=ROOT)
        return done, time.time() - t0


def slowed(timings: dict) -> bool:
    """The step had the staged slowdown: reward scoring over 1 s, or one rank 0.5 s behind another."""
    ranks = timings["rank_rollout_s"]
    return timings["reward_s"] > 1.0 or max(ranks) - min(ranks) >= 0.5


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http_get(url)
    assert status == 200, body
    return json.loads(body)["data"]["result"]


@contextmanager
def live_run(
    tmp_path: Path, extra: dict | None = None, ranks: int = 1, env: dict[str, str] | None = None
) -> Iterator[Live]:
    """Starts Prometheus (1 s scrape and evaluation, the cause rules) and a trainer (``TEST_CONFIG``
    merged with ``extra``, the slow-able reward function) and yields them once Prometheus is ready."""
    prometheus = need_binary("prometheus")
    code = tmp_path / "code"
    code.mkdir()
    (code / "slow_reward.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    trainer_port, prom_port = free_port(), free_port()
    config = merge(
        TEST_CONFIG,
        {
            "model": {"tiny": {"cache_dir": str(tmp_path / "assets")}},
            "run": {"metrics_port": trainer_port},
            "reward": {"functions": {"slow_reward:score": 1.0}},
            "checkpoint": {"every_steps": 1000},
        },
    )
    config = merge(config, extra or {})
    (code / "train.yaml").write_text(yaml.safe_dump(config))
    rules = Path(ROOT) / "alerts" / "rules" / "rollout-causes.yml"
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": "trainer", "static_configs": [{"targets": [f"127.0.0.1:{trainer_port}"]}]}
                ],
            }
        )
    )
    prom = spawn(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if ranks > 1:  # built once here: the ranks find a complete build (their own build race is not this test's)
        from trainer.assets import ensure_tiny_assets
        from trainer.config import TinyAssets

        ensure_tiny_assets(TinyAssets(**config["model"]["tiny"]))
    train = ["train", "--config", str(code / "train.yaml"), "--run-dir", str(run_dir), "--max-steps", "200"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m"]
    command = warden_cmd(*train) if ranks == 1 else [*launcher, "sidecars.cli", *train]
    log = tmp_path / "trainer.log"
    with log.open("wb") as err:  # a file, not a pipe: a chatty engine cannot block on a full pipe
        trainer = spawn(command, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **(env or {})})
    try:
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", deadline_s=60, proc=prom)
        yield Live(code, run_dir, trainer_port, prom_port, trainer, log)
    finally:
        stop_process(trainer)
        stop_process(prom)


def measure_slowdown(
    tmp_path: Path,
    cause: str,
    expect: str,
    ranks: int = 1,
    env: dict[str, str] | None = None,
    extra: dict | None = None,
    label: str = "hf",
) -> float:
    """Fast scraped steps with no cause named, then the staged slowdown; returns (and prints) the
    seconds from the start of the first slow step to Prometheus showing ``cause``, asserts that
    ``warden diagnose`` names it (``expect`` in its output) and that the cause clears once fast again."""
    with live_run(tmp_path, extra, ranks, env) as live:
        # Fast steps first: scraped, and no cause named for them.
        live.wait_for(lambda: live.query("warden_trainer_last_step >= 3"), 300, "three scraped steps")
        assert live.query(RECORD) == []
        quiet, _ = live.diagnose(with_metrics=False)
        assert quiet.returncode == 0, quiet.stdout + quiet.stderr
        assert "no cause named" in quiet.stdout

        last_fast = len(journal_steps(live.run_dir))
        (live.code / "slow.flag").write_text("")
        shown = live.wait_for(lambda: live.cause_shown(cause), 120, cause)
        t_shown = time.time()
        slow = next(e for e in journal_steps(live.run_dir)[last_fast:] if slowed(e["data"]["timings"]))
        t_slow_start, t_slow_end = step_started(slow), event_epoch(slow)
        named, diagnose_s = live.diagnose()
        assert named.returncode == 1, named.stdout + named.stderr
        assert expect in named.stdout, named.stdout
        assert float(shown[0]["value"][1]) > 0
        timings = slow["data"]["timings"]
        seconds = t_shown - t_slow_start
        print(
            f"\n[{cause}, {ranks} rank(s), {label}] slow step {slow['step']}: {timings['step_s']:.2f} s "
            f"(reward {timings['reward_s']:.2f} s, per rank {timings['rank_rollout_s']}); Prometheus showed "
            f"the cause {seconds:.2f} s after that step started ({t_shown - t_slow_end:.2f} s after "
            f"it ended); warden diagnose ran {diagnose_s:.2f} s\n{named.stdout}"
        )
        # The recorded cause holds only while the last step is slow: back to fast, it goes away.
        (live.code / "slow.flag").unlink()
        live.wait_for(lambda: not live.cause_shown(cause), 120, "the cause to clear")
        return seconds
