"""Fixtures of the deps CLI and sidecar tests: the library tests' venv, lock and OSV zip
(tests/warden/deps/deps_helpers.py)."""

from __future__ import annotations

from tests.warden.deps.deps_helpers import digests_settled, osv_zip, test_env, venv_template, wheel_dir

__all__ = ["digests_settled", "osv_zip", "test_env", "venv_template", "wheel_dir"]
