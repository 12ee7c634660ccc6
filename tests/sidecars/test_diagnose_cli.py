"""``warden diagnose``: the causes from a real journal and a real /metrics endpoint, and its exit codes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import run_warden

from warden.journal import STEP_COMPLETED, EventWriter

FAST = {"step_s": 1.0, "data_s": 0.01, "rollout_s": 0.6, "reward_s": 0.05, "rank_rollout_s": [0.65]}
QUEUEING = {"max_num_seqs": 32, "running_max": 32, "waiting_max": 32, "kv_cache_usage_max": 0.7, "preemptions_last": 0}


def write_run(run_dir, *steps):
    run_dir.mkdir(exist_ok=True)
    writer = EventWriter(str(run_dir / "events.jsonl"), "diag-run")
    writer.emit("run.started", {"config_digest": "x"})
    for i, data in enumerate(steps, 1):
        writer.emit(STEP_COMPLETED, data, step=i)
    return run_dir


@pytest.fixture
def metrics_server():
    """A real HTTP server on 127.0.0.1 serving one exposition text (set by the test)."""
    body = {"text": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            payload = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield body, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_a_fast_step_names_no_cause_exit_0(tmp_path):
    run = write_run(tmp_path / "run", {"timings": FAST})
    result = run_warden("diagnose", "--run-dir", str(run))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 1: 1.00 s" in result.stdout and "no cause named" in result.stdout


def test_the_newest_step_is_diagnosed_with_the_number_to_change_exit_1(tmp_path):
    slow = {"timings": {**FAST, "step_s": 4.0, "reward_s": 2.5}, "scheduler": QUEUEING}
    run = write_run(tmp_path / "run", {"timings": FAST}, slow)
    result = run_warden("diagnose", "--run-dir", str(run))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "step 2: 4.00 s" in result.stdout
    assert "raise rollout.max_num_seqs from 32 to >= 64" in result.stdout
    assert "cause: Reward scoring (reward_scoring; share of the step = 0.625)" in result.stdout
    as_json = run_warden("diagnose", "--run-dir", str(run), "--format", "json")
    assert as_json.returncode == 1
    causes = [c["cause"] for c in json.loads(as_json.stdout)["causes"]]
    assert causes == ["queueing_at_max_num_seqs", "reward_scoring"]


def test_metrics_are_newer_than_the_journal_and_add_the_gpu(tmp_path, metrics_server):
    body, url = metrics_server
    body["text"] = (
        "# TYPE warden_trainer_last_step_seconds gauge\nwarden_trainer_last_step_seconds 3.0\n"
        "# TYPE warden_trainer_rank_rollout_seconds gauge\n"
        'warden_trainer_rank_rollout_seconds{rank="0"} 1.0\nwarden_trainer_rank_rollout_seconds{rank="1"} 2.6\n'
        '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 7\n'
    )
    run = write_run(tmp_path / "run", {"timings": FAST})
    result = run_warden("diagnose", "--run-dir", str(run), "--metrics", url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank 1 took 2.60 s" in result.stdout and "the busiest GPU is 7% utilised" in result.stdout
    assert f"from: journal, {url}" in result.stdout
    only_metrics = run_warden("diagnose", "--metrics", url)
    assert only_metrics.returncode == 1 and "rank 1 took 2.60 s" in only_metrics.stdout


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        ((), 2, "name --run-dir DIR, --metrics URL or both"),
        (("--run-dir", "{tmp}/nowhere"), 2, "no journal there"),
        (("--metrics", "file:///etc/passwd"), 2, "not an http(s) URL"),
        (("--metrics", "http://127.0.0.1:1/metrics"), 3, "--metrics http://127.0.0.1:1/metrics"),
        (("--run-dir", "{tmp}/empty"), 3, "no completed step to diagnose"),
    ],
)
def test_usage_and_unreadable_inputs_exit_2_or_3_with_one_line(tmp_path, args, code, words):
    write_run(tmp_path / "empty")
    result = run_warden("diagnose", *(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == code, result.stdout + result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


def test_garbage_from_the_endpoint_is_one_error_exit_3(tmp_path, metrics_server):
    body, url = metrics_server
    body["text"] = "warden_trainer_last_step_seconds {{{ nonsense\n"
    result = run_warden("diagnose", "--metrics", url)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "not a Prometheus exposition" in result.stderr and "Traceback" not in result.stderr


def test_a_journal_that_is_a_symlink_is_refused(tmp_path):
    real = write_run(tmp_path / "real", {"timings": FAST})
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").symlink_to(real / "events.jsonl")
    result = run_warden("diagnose", "--run-dir", str(run))
    assert result.returncode == 2 and "not a regular file" in result.stderr
