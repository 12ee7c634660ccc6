"""The `warden` root: help, version, exit codes, environment variables, events tail."""

from __future__ import annotations

import json

from support import run_warden

from sidecars import __version__
from warden import journal as ev


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


def _group_raising(exc: BaseException):
    """A Warden group with one command that raises ``exc`` (a bug, as the CLI sees it)."""

    from sidecars.cli import WardenGroup

    group = WardenGroup()

    @group.command()
    def boom() -> None:
        raise exc

    return group


def test_unexpected_exception_is_exit_3_with_one_short_line(monkeypatch):
    from click.testing import CliRunner

    monkeypatch.delenv("WARDEN_DEBUG", raising=False)
    for exc in (RecursionError("x\n" * 100_000), ValueError("Exceeds the limit (4300 digits)"), KeyError("k")):
        result = CliRunner().invoke(_group_raising(exc), ["boom"])
        assert result.exit_code == 3, (exc, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("internal error: ")
        assert len(lines[0]) < 260 and "Traceback" not in result.output


def test_native_panic_like_base_exception_is_exit_3(monkeypatch):
    """tokenizers' Rust panics surface as BaseException subclasses, not Exception."""
    from click.testing import CliRunner

    class PanicException(BaseException):
        pass

    monkeypatch.delenv("WARDEN_DEBUG", raising=False)
    result = CliRunner().invoke(_group_raising(PanicException("regex panicked")), ["boom"])
    assert result.exit_code == 3 and "internal error: PanicException" in result.output


def test_quote_untrusted_flattens_and_cuts():
    from warden.errors import quote_untrusted

    assert quote_untrusted("a\nb\tc") == "a b c"
    cut = quote_untrusted("y" * 5000)
    assert len(cut) == 200 and cut.endswith("…")
