"""The `warden` root: help, version, exit codes, environment variables, events tail."""

from __future__ import annotations

import json

from support import run_warden

from sidecars import __version__
from trainer import events as ev


def test_help_and_version():
    result = run_warden("--help")
    assert result.returncode == 0
    for command in ("sidecar", "events"):
        assert command in result.stdout
    version = run_warden("--version")
    assert version.returncode == 0 and __version__ in version.stdout


def test_unknown_sidecar_is_a_usage_error():
    result = run_warden("sidecar", "run", "nosuch", "--once")
    assert result.returncode == 2
    assert "no sidecar named 'nosuch'" in result.stderr and "Traceback" not in result.stderr


def test_bad_flag_is_exit_2():
    assert run_warden("events", "tail", "--bogus").returncode == 2


def test_sidecar_list_json():
    result = run_warden("sidecar", "list", "--format", "json")
    rows = json.loads(result.stdout)
    assert {"name": "journal", "port": 9466}.items() <= rows[0].items()


def test_events_tail_text_json_and_filters(run_dir, journal):
    journal.emit(ev.RUN_STARTED, {"model": "/m"})
    journal.emit(ev.STEP_COMPLETED, {"reward_mean": 0.8125, "kl": 0.004}, step=1)
    journal.emit(ev.CHECKPOINT_SAVED, {"path": "checkpoints/step-000000001"}, step=1)
    text = run_warden("events", "tail", "--run-dir", str(run_dir))
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert len(lines) == 3 and "step.completed" in lines[1] and "reward_mean=0.8125" in lines[1]
    js = run_warden(
        "events", "tail", "--format", "json", "--type", "checkpoint.saved", env={"WARDEN_RUN_DIR": str(run_dir)}
    )
    assert js.returncode == 0, js.stderr
    assert [json.loads(line)["seq"] for line in js.stdout.splitlines()] == [3]
    last = run_warden("events", "tail", "--run-dir", str(run_dir), "--last", "1")
    assert last.stdout.count("\n") == 1 and "checkpoint.saved" in last.stdout


def test_events_tail_missing_journal_is_exit_3(tmp_path):
    result = run_warden("events", "tail", "--run-dir", str(tmp_path))
    assert result.returncode == 3
    assert "no journal here" in result.stderr and "Traceback" not in result.stderr


def test_events_tail_reports_corrupt_lines_on_stderr(run_dir, journal):
    journal.emit(ev.RUN_STARTED, {})
    with open(run_dir / "events.jsonl", "ab") as fh:
        fh.write(b"garbage\n")
    result = run_warden("events", "tail", "--run-dir", str(run_dir))
    assert result.returncode == 0 and "corrupt line at byte" in result.stderr
