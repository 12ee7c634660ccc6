"""Cause in seconds, end to end: a real tiny PPO run (HF engine) whose reward function turns slow
mid-run, a real Prometheus scraping it with the generated recording rules, and ``warden diagnose``.

Measured (printed): from the start of the first slow step to Prometheus returning
``warden_rollout_slow_cause{cause="reward_scoring"}``, and to ``warden diagnose`` naming it. The slow
step itself is part of that time: its gauges exist only when it completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from support import TEST_CONFIG, free_port, http_get, merge, need_binary, spawn, stop_process, wait_http, warden_cmd

from warden.diagnose.causes import RECORD

pytestmark = pytest.mark.slow
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
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e["type"] == "step.completed"]


def event_epoch(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def wait_for(condition, deadline_s: float, what: str, proc=None):
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the trainer exited while waiting for {what}: {proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < end, f"no {what} within {deadline_s} s"
        time.sleep(0.05)


def slowed(timings: dict) -> bool:
    """The step had the staged slowdown: reward scoring over 1 s, or one rank 0.5 s behind another."""
    ranks = timings["rank_rollout_s"]
    return timings["reward_s"] > 1.0 or max(ranks) - min(ranks) >= 0.5


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http_get(url)
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def measure(tmp_path: Path, cause: str, ranks: int, env: dict[str, str], expect: str) -> None:
    """Starts the run, waits for fast scraped steps, slows it, and times the cause's appearance."""
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
    (code / "train.yaml").write_text(yaml.safe_dump(config))
    rules = Path(__file__).resolve().parents[2] / "alerts" / "rules" / "rollout-causes.yml"
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
    train = ["train", "--config", str(code / "train.yaml"), "--run-dir", str(run_dir), "--max-steps", "200"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m"]
    command = warden_cmd(*train) if ranks == 1 else [*launcher, "sidecars.cli", *train]
    trainer = spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **env})
    try:
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", deadline_s=60, proc=prom)
        # Fast steps first: scraped, and no cause named for them.
        wait_for(lambda: query(prom_port, "warden_trainer_last_step >= 3"), 300, "three scraped steps", trainer)
        assert query(prom_port, RECORD) == []
        quiet = subprocess.run(
            warden_cmd("diagnose", "--run-dir", str(run_dir)), capture_output=True, text=True, timeout=60
        )
        assert quiet.returncode == 0, quiet.stdout + quiet.stderr
        assert "no cause named" in quiet.stdout

        last_fast = len(journal_steps(run_dir))
        (code / "slow.flag").write_text("")
        shown = wait_for(lambda: query(prom_port, f'{RECORD}{{cause="{cause}"}}'), 120, cause, trainer)
        t_shown = time.time()
        steps = journal_steps(run_dir)
        slow = next(e for e in steps[last_fast:] if slowed(e["data"]["timings"]))
        t_slow_end = event_epoch(slow)
        t_slow_start = t_slow_end - slow["data"]["timings"]["step_s"]
        metrics = f"http://127.0.0.1:{trainer_port}/metrics"
        t0 = time.time()
        named = subprocess.run(
            warden_cmd("diagnose", "--run-dir", str(run_dir), "--metrics", metrics),
            capture_output=True,
            text=True,
            timeout=60,
        )
        diagnose_s = time.time() - t0
        assert named.returncode == 1, named.stdout + named.stderr
        assert expect in named.stdout, named.stdout
        assert float(shown[0]["value"][1]) > 0
        timings = slow["data"]["timings"]
        print(
            f"\n[{cause}, {ranks} rank(s)] slow step {slow['step']}: {timings['step_s']:.2f} s "
            f"(reward {timings['reward_s']:.2f} s, per rank {timings['rank_rollout_s']}); Prometheus showed "
            f"the cause {t_shown - t_slow_start:.2f} s after that step started ({t_shown - t_slow_end:.2f} s after "
            f"it ended); warden diagnose ran {diagnose_s:.2f} s\n{named.stdout}"
        )
        # The recorded cause holds only while the last step is slow: back to fast, it goes away.
        (code / "slow.flag").unlink()
        wait_for(lambda: not query(prom_port, f'{RECORD}{{cause="{cause}"}}'), 120, "the cause to clear", trainer)
    finally:
        stop_process(trainer)
        stop_process(prom)


def test_a_slow_reward_is_named_within_seconds_by_the_rules_and_by_diagnose(tmp_path):
    measure(tmp_path, "reward_scoring", 1, {}, "cause: Reward scoring (reward_scoring")


def test_one_slow_rank_of_two_is_named_within_seconds(tmp_path):
    """torchrun, two CPU ranks (gloo); only rank 1's reward function slows: the rank is named."""
    measure(tmp_path, "slow_rank", 2, {"SLOW_RANKS": "1"}, "rank 1 took")
