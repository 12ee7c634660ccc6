"""The Store contract, the same for file://, SeaweedFS and moto (real servers, real HTTP)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from botocore.exceptions import ClientError
from support import free_port

from warden.archive.errors import StoreAccessDenied, StoreConfigError, StoreConflict, StoreUnavailable
from warden.archive.record import head_key, step_key, steps_prefix
from warden.archive.store import Created, FileStore, Retention, S3Store, open_store


@pytest.fixture(params=["file", "seaweedfs", "moto"])
def store(request, tmp_path, s3env):
    if request.param == "file":
        backend = open_store(f"file://{tmp_path}/archive")
    else:
        server = request.getfixturevalue("seaweed" if request.param == "seaweedfs" else "moto")
        s3env(server)
        backend = open_store(f"s3://{server.make_bucket()}/some/prefix?addressing_style=path")
    yield backend
    backend.close()


def test_create_never_overwrites(store):
    key = step_key("run-1", 7)
    assert store.create(key, b"record-7") is Created.NEW
    assert store.create(key, b"record-7") is Created.ALREADY_STORED  # a retry after a lost answer
    with pytest.raises(StoreConflict) as info:
        store.create(key, b"something else")
    assert info.value.key == key and info.value.exit_code == 1 and key in str(info.value)
    assert store.get(key) == b"record-7"


def test_heads_are_replaced_and_missing_keys_read_as_none(store):
    store.put(head_key("run-1"), b"head 1")
    store.put(head_key("run-1"), b"head 2")
    assert store.get(head_key("run-1")) == b"head 2"
    assert store.get(step_key("run-1", 1)) is None
    assert store.list_keys(steps_prefix("nothing-here")) == []


def test_listing_is_sorted_paged_and_bounded(store):
    for step in (9, 0, 3, 12, 5, 100):
        store.create(step_key("r", step), b"x")
    store.put(head_key("r"), b"h")
    store.create(step_key("r2", 1), b"other run")
    if isinstance(store, S3Store):
        store.page_size = 2  # several pages, as 1000+ keys would give
    keys = store.list_keys(steps_prefix("r"))
    assert keys == [step_key("r", s) for s in (0, 3, 5, 9, 12, 100)]
    assert store.list_keys(steps_prefix("r"), start_after=step_key("r", 3), limit=3) == [
        step_key("r", s) for s in (5, 9, 12)
    ]


def test_requests_are_counted(store):
    before = store.requests
    store.get(step_key("r", 1))
    store.list_keys(steps_prefix("r"))
    assert store.requests - before == 2
    assert {"GetObject", "ListObjectsV2"} <= set(store.operations)


def test_file_store_has_no_object_lock_and_refuses_odd_keys(tmp_path):
    backend = open_store(f"file://{tmp_path}")
    assert isinstance(backend, FileStore) and not backend.object_lock_enabled()
    with pytest.raises(StoreConfigError):
        backend.get("runs/../../etc/passwd")


def test_object_lock_is_detected(s3server, s3env):
    s3env(s3server)
    assert not open_store(f"s3://{s3server.make_bucket()}?addressing_style=path").object_lock_enabled()
    assert open_store(f"s3://{s3server.make_bucket(lock=True)}?addressing_style=path").object_lock_enabled()


def test_compliance_retention_is_enforced_and_the_store_cannot_delete(s3server, s3env):
    s3env(s3server)
    bucket = s3server.make_bucket(lock=True)
    backend = open_store(f"s3://{bucket}/p?addressing_style=path")
    backend.create("runs/r/steps/000000000001.json", b"locked", Retention("COMPLIANCE", 1))
    client = s3server.client()
    key = "p/runs/r/steps/000000000001.json"
    if s3server.name == "seaweedfs":  # moto answers GetObjectRetention with a 500
        assert client.get_object_retention(Bucket=bucket, Key=key)["Retention"]["Mode"] == "COMPLIANCE"
    version = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][0]["VersionId"]
    with pytest.raises(ClientError) as info:
        client.delete_object(Bucket=bucket, Key=key, VersionId=version)
    assert info.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError):
        client.delete_object(Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=True)
    assert backend.get("runs/r/steps/000000000001.json") == b"locked"
    # The archiver cannot ask: no store class has a way to delete or to change retention.
    for cls in (S3Store, FileStore):
        assert not [name for name in dir(cls) if "delete" in name.lower() or "retention" in name.lower()]


def test_seaweedfs_rejects_a_wrong_checksum_and_the_kind_says_so(seaweed, s3env):
    s3env(seaweed)
    bucket = seaweed.make_bucket()
    backend = open_store(f"s3://{bucket}?addressing_style=path")
    assert isinstance(backend, S3Store)
    wrong = base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode()
    with pytest.raises(ClientError) as info:
        backend.client.put_object(
            Bucket=bucket, Key="k", Body=b"body", ChecksumAlgorithm="SHA256", ChecksumSHA256=wrong
        )
    from warden.archive.store import _classify

    assert _classify(info.value, backend.url, "put k").kind == "checksum"


def test_unreachable_and_refused_stores_raise_bounded_kinds(seaweed, s3env, monkeypatch):
    s3env(seaweed)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    backend = open_store("s3://bucket-x?addressing_style=path", timeout=1)
    with pytest.raises(StoreUnavailable) as down:
        backend.get("k")
    assert down.value.kind == "connect" and down.value.exit_code == 3
    s3env(seaweed)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(StoreAccessDenied) as refused:
        open_store(f"s3://{seaweed.make_bucket()}?addressing_style=path").get("k")
    assert refused.value.kind == "access_denied"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file://relative/dir", "file:///absolute/dir"),
        ("gs://bucket", "unknown store scheme"),
        ("s3:///prefix", "no bucket"),
        ("s3://b?region=x", "unknown option"),
        ("s3://b?addressing_style=sideways", "addressing_style"),
    ],
)
def test_bad_urls_are_config_errors(url, message):
    with pytest.raises(StoreConfigError, match=message) as info:
        open_store(url)
    assert info.value.exit_code == 2
