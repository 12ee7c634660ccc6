"""Fixtures of the end-to-end drills; the machinery is in tests/drills.py."""

from __future__ import annotations

import pytest
from drills import Drill


@pytest.fixture
def drill(tmp_path):
    d = Drill(str(tmp_path))
    try:
        yield d
    finally:
        d.close()


# The deps drill audits a small real venv built from PyPI wheels (fixtures shared with the deps tests).
from tests.warden.deps.deps_helpers import test_env, venv_template, wheel_dir  # noqa: E402

__all__ = ["drill", "test_env", "venv_template", "wheel_dir"]
