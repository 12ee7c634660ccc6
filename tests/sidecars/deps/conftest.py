"""Fixtures of the deps tests: a real venv built from PyPI wheels (once per session, copied
per test), a hashed lock for it, and an OSV export zip made here."""

from __future__ import annotations

import pytest

from tests.sidecars.deps.deps_helpers import (
    base_env,
    fake_base_template,
    osv_zip,
    test_env,
    venv_template,
    wheel_dir,
)

__all__ = ["base_env", "fake_base_template", "osv_zip", "test_env", "venv_template", "wheel_dir"]


@pytest.fixture(autouse=True)
def digests_settled(monkeypatch):
    """The tests' files are seconds old: without this, no digest of them would be cached (walk.settled,
    DIGEST_RACY_NS); tests of that rule set it back."""
    monkeypatch.setattr("sidecars.deps.walk.DIGEST_RACY_NS", -(10**12), raising=False)
