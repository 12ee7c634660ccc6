"""Fixtures of the deps library tests: a real venv built from PyPI wheels (once per session, copied
per test), a hashed lock for it, a base interpreter the tests own, and an OSV export zip made here."""

from __future__ import annotations

from tests.warden.deps.deps_helpers import (
    base_env,
    digests_settled,
    fake_base_template,
    osv_zip,
    test_env,
    venv_template,
    wheel_dir,
)

__all__ = ["base_env", "digests_settled", "fake_base_template", "osv_zip", "test_env", "venv_template", "wheel_dir"]
