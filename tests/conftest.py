from __future__ import annotations

import os

import pytest

from warden.journal import EventWriter


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def journal(run_dir):
    """An EventWriter on run_dir/events.jsonl, closed after the test."""
    writer = EventWriter(os.path.join(run_dir, "events.jsonl"), "test-run")
    yield writer
    writer.close()
