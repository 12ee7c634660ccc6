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
