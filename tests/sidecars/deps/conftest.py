"""Fixtures of the deps tests: a real venv built from PyPI wheels (once per session, copied
per test), a hashed lock for it, and an OSV export zip made here."""

from __future__ import annotations

from tests.sidecars.deps.deps_helpers import (
    base_env,
    fake_base_template,
    osv_zip,
    test_env,
    venv_template,
    wheel_dir,
)

__all__ = ["base_env", "fake_base_template", "osv_zip", "test_env", "venv_template", "wheel_dir"]
