"""Fixtures of the archiver sidecar and ``warden audit`` tests: the library tests' SeaweedFS, moto,
keys and AWS env (tests/warden/archive/conftest.py)."""

from __future__ import annotations

from tests.warden.archive.conftest import keys, lock_bucket, moto, own_seaweed, s3env, s3server, seaweed

__all__ = ["keys", "lock_bucket", "moto", "own_seaweed", "s3env", "s3server", "seaweed"]
