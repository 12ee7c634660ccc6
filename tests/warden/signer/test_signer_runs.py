"""The signer's run registry (``<state_dir>/runs.json``)."""

from __future__ import annotations

from pathlib import Path

from warden.signer.runs import RunRegistry


def test_run_registry_survives_a_restart(tmp_path):
    path = str(tmp_path / "state" / "runs.json")
    runs = RunRegistry(path)
    runs.record("r1", "1.0")
    runs.record("r1", None)  # a checkpoint event without version keeps the known one
    runs.record("r2", None)
    again = RunRegistry(path)
    assert again.version("r1") == "1.0" and again.version("r2") is None and again.last_run_id == "r2"
    Path(path).write_text("{not json")
    assert RunRegistry(path).versions == {}
