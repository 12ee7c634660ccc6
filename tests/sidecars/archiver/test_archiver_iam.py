"""policies/iam/*.json are least privilege, and cover what the archiver and auditor really send."""

from __future__ import annotations

import fnmatch
import json
import pathlib

import pytest

from sidecars.runtime import Outcome
from tests.warden.archive.archiver_helpers import Harness
from warden.archive.lookup import fetch_snapshot, list_steps
from warden.archive.store import open_store
from warden.archive.verify import verify_run
from warden.signing.keys import load_trusted_keys

IAM = pathlib.Path(__file__).resolve().parents[3] / "policies" / "iam"
BUCKET = "arn:aws:s3:::warden-archive"
# S3 API operation (as botocore names it) -> the IAM action that authorizes it.
ACTION_OF = {
    "PutObject": "s3:PutObject",
    "GetObject": "s3:GetObject",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjectVersions": "s3:ListBucketVersions",
    "GetObjectLockConfiguration": "s3:GetBucketObjectLockConfiguration",
}
NEVER_FOR_ARCHIVER = {
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:BypassGovernanceRetention",
    "s3:PutBucketObjectLockConfiguration",
    "s3:PutBucketVersioning",
    "s3:PutLifecycleConfiguration",
    "s3:PutObjectLegalHold",
}


def statements(name):
    document = json.loads((IAM / name).read_text())
    assert document["Version"] == "2012-10-17"
    return document["Statement"]


def as_list(value):
    return value if isinstance(value, list) else [value]


def allowed(name):
    return {a for s in statements(name) if s["Effect"] == "Allow" for a in as_list(s["Action"])}


def unconditionally_denied(name, action, resource):
    for s in statements(name):
        if s["Effect"] != "Deny" or "Condition" in s:
            continue
        if not any(fnmatch.fnmatch(resource, r) for r in as_list(s["Resource"])):
            continue
        if "Action" in s and any(fnmatch.fnmatch(action, a) for a in as_list(s["Action"])):
            return True
        if "NotAction" in s and not any(fnmatch.fnmatch(action, a) for a in as_list(s["NotAction"])):
            return True
    return False


def test_every_resource_is_the_archive_bucket_or_its_runs_prefix():
    for name in ("archiver.json", "auditor.json"):
        for s in statements(name):
            for resource in as_list(s["Resource"]):
                assert resource in (BUCKET, f"{BUCKET}/*") or resource.startswith(f"{BUCKET}/runs/"), (name, s["Sid"])


def test_the_archiver_may_put_and_read_but_never_delete_or_loosen_retention():
    actions = allowed("archiver.json")
    assert actions == {
        "s3:GetBucketObjectLockConfiguration",
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:PutObjectRetention",  # S3 requires it for retention headers on a new object's PUT
    }
    for action in NEVER_FOR_ARCHIVER:
        assert unconditionally_denied("archiver.json", action, f"{BUCKET}/runs/r/steps/000000000001.json"), action
    retention = next(s for s in statements("archiver.json") if s["Action"] == "s3:PutObjectRetention")
    assert retention["Condition"]["StringEquals"] == {"s3:object-lock-mode": "COMPLIANCE"}
    create_only = next(s for s in statements("archiver.json") if s["Sid"] == "RecordsAreCreateOnly")
    assert create_only["Effect"] == "Deny" and create_only["Condition"] == {"Null": {"s3:if-none-match": "true"}}


def test_the_auditor_may_only_read():
    actions = allowed("auditor.json")
    assert all(a.startswith(("s3:Get", "s3:List")) for a in actions)
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectRetention", "s3:BypassGovernanceRetention"):
        assert unconditionally_denied("auditor.json", action, f"{BUCKET}/runs/r/head.json"), action
    for action in actions:
        assert not unconditionally_denied("auditor.json", action, f"{BUCKET}/runs/r/head.json")


@pytest.fixture
def exercised(tmp_path, keys, seaweed, lock_bucket, s3env):
    """Operations sent by an archiver (retention, recovery from the store, 412s) and by an auditor."""
    s3env(seaweed)
    url = f"s3://{lock_bucket}/iam?addressing_style=path"
    h = Harness(tmp_path, url, keys[0], "iam-run", retention={"mode": "COMPLIANCE", "days": 1})
    h.start()
    h.snapshots(range(1, 4))
    outcome, first = h.once()
    assert outcome is Outcome.OK
    (h.state_dir / "chain.json").unlink()  # forces the look-up in the store, and 412s on the replays
    (h.state_dir / "cursor.json").unlink()
    outcome, second = h.once()
    assert outcome is Outcome.OK
    archiver_ops = set(first.store.operations) | set(second.store.operations)
    auditor = open_store(url)
    trusted = load_trusted_keys(keys[1])
    fetch_snapshot(auditor, "iam-run", 2, trusted)
    verify_run(auditor, "iam-run", trusted)
    list_steps(auditor, "iam-run")
    auditor.versions("runs/iam-run/steps/000000000002.json")
    return archiver_ops, set(auditor.operations)


def test_the_policies_cover_the_operations_really_sent(exercised):
    archiver_ops, auditor_ops = exercised
    assert archiver_ops <= set(ACTION_OF), archiver_ops
    assert {ACTION_OF[op] for op in archiver_ops} <= allowed("archiver.json")
    assert {ACTION_OF[op] for op in auditor_ops} <= allowed("auditor.json")
    assert "GetObjectLockConfiguration" in archiver_ops and "PutObject" in archiver_ops
