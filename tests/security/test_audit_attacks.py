"""`warden audit` against an attacker who can write the store but cannot sign (issue 15, part 5).

Each attack must end in exit 1 naming the kind and the step (or a clean refusal), never
exit 0, a traceback or a hang. file:// stores are attacked with plain file operations;
SeaweedFS with Object Lock through the S3 API (delete markers, CopyObject of an old version).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support import run_warden

from sidecars.runtime import Outcome
from tests.warden.archive.archiver_helpers import Harness, audit_cli
from tests.warden.archive.conftest import keys, lock_bucket, s3env, seaweed  # noqa: F401 (fixtures)
from warden.archive.record import head_key, step_key

MAX_MESSAGE = 1500  # a hostile value is quoted in at most ~200 characters


def archive(h: Harness, steps) -> None:
    h.snapshots(steps)
    assert h.once()[0] is Outcome.OK


def verify(url: str, run_id: str, pub: str, *extra: str) -> tuple[int, dict, str]:
    code, out, err = audit_cli(
        "verify-run", "--run", run_id, "--store", url, "--trust", pub, "--format", "json", *extra
    )
    assert "Traceback" not in err
    return code, json.loads(out), err


def snapshot(url: str, run_id: str, pub: str, step: int, *extra: str) -> tuple[int, str, str]:
    code, out, err = audit_cli("snapshot", "--run", run_id, "--step", str(step), "--store", url, "--trust", pub, *extra)
    assert "Traceback" not in err
    return code, out, err


def kinds(report: dict) -> list[tuple[str, int | None]]:
    return [(f["kind"], f["step"]) for f in report["findings"]]


# --- file:// ------------------------------------------------------------------------------------------


@pytest.fixture
def filerun(tmp_path, keys):  # noqa: F811
    """Steps 1..8 archived to a file:// store: (harness, store URL, archive dir, public key)."""
    url = f"file://{tmp_path}/archive"
    h = Harness(tmp_path, url, keys[0])
    h.start()
    archive(h, range(1, 9))
    return h, url, tmp_path / "archive", keys[1]


def test_an_intact_file_run_verifies_with_and_without_the_anchor(filerun):
    h, url, _, pub = filerun
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 0 and report["records_checked"] == 8 and report["head_step"] == 8 and report["findings"] == []
    code, report, _ = verify(url, h.run_id, pub, "--run-dir", str(h.run_dir), "--grace", "0")
    assert code == 0 and report["anchor"].endswith("events.jsonl")


def test_a_whole_namespace_swapped_for_another_chain_of_the_same_run_id_and_key(tmp_path, keys):  # noqa: F811
    """Two runs that share a run id and a signing key: each chain is intact on its own, so only the
    run's genesis (its nonce, in its journal) tells them apart; verify-run --run-dir must say so."""
    runs = {}
    for name, nonce in (("a", "a" * 32), ("b", "b" * 32)):
        url = f"file://{tmp_path}/{name}/archive"
        h = Harness(tmp_path / name, url, keys[0])
        h.start(nonce=nonce)
        archive(h, range(1, 5))
        runs[name] = (h, url, tmp_path / name / "archive")
    (a, url, store_a), (_b, _url_b, store_b) = runs["a"], runs["b"]
    code, report, _ = verify(url, a.run_id, keys[1], "--run-dir", str(a.run_dir), "--grace", "0")
    assert code == 0, report
    shutil.rmtree(store_a / "runs" / a.run_id)
    shutil.copytree(store_b / "runs" / a.run_id, store_a / "runs" / a.run_id)
    code, report, _ = verify(url, a.run_id, keys[1], "--run-dir", str(a.run_dir), "--grace", "0")
    assert code == 1
    assert any("another chain under the same run id" in f["message"] for f in report["findings"]), report


def test_a_deleted_head_is_missing(filerun):
    h, url, root, pub = filerun
    os.unlink(root / head_key(h.run_id))
    code, report, err = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("missing", None)]
    assert "head object is missing, but the run has 8 records" in report["break"]["message"]
    assert "chain is broken" in err


def test_the_head_and_the_newest_records_deleted(filerun):
    h, url, root, pub = filerun
    for path in (head_key(h.run_id), *(step_key(h.run_id, s) for s in (6, 7, 8))):
        os.unlink(root / path)
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("missing", None)] and report["records_checked"] == 5
    code, _, err = snapshot(url, h.run_id, pub, 8)
    assert code == 1 and "head object is missing" in err


def test_a_middle_gap_is_missing_and_its_snapshot_exits_1(filerun):
    h, url, root, pub = filerun
    os.unlink(root / step_key(h.run_id, 4))
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("missing", 4)]
    assert "step 4, which step 5 is chained to, is missing" in report["break"]["message"]
    code, _, err = snapshot(url, h.run_id, pub, 4)
    assert code == 1 and "step 5 is chained to it" in err


def test_the_newest_record_deleted_is_found_through_the_head(filerun):
    h, url, root, pub = filerun
    os.unlink(root / step_key(h.run_id, 8))
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("missing", 8)]
    code, _, err = snapshot(url, h.run_id, pub, 8)
    assert code == 1 and "signed head names it" in err


def test_a_step_never_archived_is_not_a_violation(filerun):
    h, url, _, pub = filerun
    code, _, err = snapshot(url, h.run_id, pub, 20)
    assert code == 3 and "not archived" in err and "head is at step 8" in err


def test_an_old_head_written_back_needs_the_journal_anchor(filerun):
    """A file:// store holds no history: only the anchor tells the shorter chain from the real one."""
    h, url, root, pub = filerun
    head = root / head_key(h.run_id)
    old_head = head.read_bytes()  # head at step 8
    archive(h, range(9, 13))  # head at step 12
    for s in range(9, 13):
        os.unlink(root / step_key(h.run_id, s))
    head.write_bytes(old_head)
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 0 and report["head_step"] == 8  # consistent on its own: the limit the anchor exists for
    code, report, _ = verify(url, h.run_id, pub, "--run-dir", str(h.run_dir))
    assert code == 0 and report["anchor_within_grace"] == [9, 10, 11, 12]  # may still be uploading
    code, report, _ = verify(url, h.run_id, pub, "--run-dir", str(h.run_dir), "--grace", "0")
    assert code == 1 and kinds(report) == [("rolled_back", 9)]
    assert "steps 9-12" in report["break"]["message"] and "newest record is step 8" in report["break"]["message"]


HOSTILE = {
    "deep_json": b"[" * 100_000 + b"]" * 100_000,
    "huge_integer": b'{"mediaType": ' + b"9" * 5000 + b"}",
    "two_mib_string": json.dumps({"mediaType": "A" * (2 * 1024 * 1024)}).encode(),
    "invalid_utf8": b'{"mediaType": "\xff\xfe\xfd"}',
    "wrong_types": json.dumps(
        {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {"publicKey": {"hint": ["x"]}},
            "dsseEnvelope": 5,
        }
    ).encode(),
    "deep_payload": json.dumps(
        {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {"publicKey": {}},
            "dsseEnvelope": {"payload": "e30=", "payloadType": "x", "signatures": [{"sig": [[[[1]]]]}]},
        }
    ).encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_records_and_heads_are_malformed_not_tracebacks(filerun, name):
    h, url, root, pub = filerun
    (root / step_key(h.run_id, 3)).write_bytes(HOSTILE[name])
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and ("malformed", 3) in kinds(report), report["findings"]
    assert all(len(f["message"]) < MAX_MESSAGE for f in report["findings"])
    code, _, err = snapshot(url, h.run_id, pub, 3)
    assert code == 1 and len(err) < MAX_MESSAGE + 200
    (root / head_key(h.run_id)).write_bytes(HOSTILE[name])
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and ("malformed", None) in kinds(report)


def test_a_fifo_and_symlinks_in_the_store_are_refused_without_blocking(filerun, tmp_path):
    h, url, root, pub = filerun
    record = root / step_key(h.run_id, 3)
    outside = tmp_path / "outside.json"
    shutil.copy(record, outside)
    record.unlink()
    os.mkfifo(record)  # a reader that opened it blocking would hang here forever
    head = root / head_key(h.run_id)
    shutil.copy(head, tmp_path / "outside-head.json")
    head.unlink()
    head.symlink_to(tmp_path / "outside-head.json")  # the genuine bytes, behind a link
    os.symlink(outside, root / step_key(h.run_id, 9))
    result = run_warden(
        "audit", "verify-run", "--run", h.run_id, "--store", url, "--trust", pub, "--format", "json", timeout=60
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    found = {(f["kind"], f["step"]): f["message"] for f in json.loads(result.stdout)["findings"]}
    assert "a FIFO, not a regular file" in found[("malformed", 3)]
    assert "a symbolic link, not a regular file" in found[("malformed", None)]
    assert "a symbolic link" in found[("malformed", 9)]
    result = run_warden("audit", "snapshot", "--run", h.run_id, "--step", "3", "--store", url, "--trust", pub)
    assert result.returncode == 1 and "a FIFO" in result.stderr and "Traceback" not in result.stderr


def test_a_steps_directory_replaced_by_a_link_is_refused(filerun, tmp_path):
    """The genuine records, moved elsewhere and linked back: nothing below the store root is followed."""
    h, url, root, pub = filerun
    steps = (root / step_key(h.run_id, 1)).parent
    moved = tmp_path / "moved-steps"
    shutil.move(steps, moved)
    steps.symlink_to(moved)
    result = run_warden("audit", "snapshot", "--run", h.run_id, "--step", "2", "--store", url, "--trust", pub)
    assert result.returncode == 1 and "below a symbolic link" in result.stderr, result.stderr


def test_oversized_objects_are_not_read(filerun):
    h, url, root, pub = filerun
    (root / step_key(h.run_id, 5)).write_bytes(b" " * (2 * 1024 * 1024))
    code, report, _ = verify(url, h.run_id, pub, "--max-object-bytes", str(1024 * 1024))
    assert code == 1 and ("malformed", 5) in kinds(report)
    assert (
        "over the 1048576-byte cap"
        in dict(((f["kind"], f["step"]), f["message"]) for f in report["findings"])[("malformed", 5)]
    )
    (root / head_key(h.run_id)).write_bytes(b" " * (100 * 1024))  # heads are a few hundred bytes
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and ("malformed", None) in kinds(report)


# --- SeaweedFS with Object Lock --------------------------------------------------------------------------


@pytest.fixture
def locked(request, tmp_path, keys, seaweed, lock_bucket, s3env):  # noqa: F811
    """Steps 1..8 archived with COMPLIANCE retention in two passes (two head versions)."""
    s3env(seaweed)
    run_id = f"attack-{request.node.name}".replace("[", "-").replace("]", "")[:100]
    url = f"s3://{lock_bucket}/attacks?addressing_style=path"
    h = Harness(tmp_path, url, keys[0], run_id, retention={"mode": "COMPLIANCE", "days": 1})
    h.start()
    archive(h, range(1, 5))
    archive(h, range(5, 9))
    return h, url, keys[1], seaweed.client(), lock_bucket


def test_an_intact_locked_run_passes_without_reading_old_head_versions(locked):
    """The current head's ETag is the MD5 of its bytes and no older version has it: it was put
    fresh, so it is the newest and no older version needs reading (however many the run has)."""
    h, url, pub, client, bucket = locked
    versions = client.list_object_versions(Bucket=bucket, Prefix=f"attacks/{head_key(h.run_id)}")["Versions"]
    assert len(versions) >= 2  # the run's head really has history to skip
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 0 and report["versioned"] and report["head_versions_read"] == 0 and report["records_checked"] == 8
    # records + pages + one: 1 head GET, 1 version listing page, 8 record GETs
    assert report["requests"] == 10, report


def test_delete_markers_on_the_head_and_the_newest_records(locked):
    h, url, pub, client, bucket = locked
    for key in (head_key(h.run_id), step_key(h.run_id, 7), step_key(h.run_id, 8)):
        client.delete_object(Bucket=bucket, Key=f"attacks/{key}")  # Object Lock: a delete marker
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("missing", None), ("missing", 7), ("missing", 8)]
    assert "head object was deleted (a delete marker hides 2 retained version(s)" in report["findings"][0]["message"]
    assert "step 8 was deleted (a delete marker hides 1 retained version" in report["findings"][2]["message"]
    code, _, err = snapshot(url, h.run_id, pub, 8)
    assert code == 1 and "it was deleted (a delete marker hides 1 retained version" in err


def test_an_older_head_version_copied_over_the_current_one_is_rolled_back(locked):
    h, url, pub, client, bucket = locked
    key = f"attacks/{head_key(h.run_id)}"
    oldest = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][-1]["VersionId"]  # newest first
    for _ in range(2):  # twice: the version just before the current one is a copy too
        client.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key, "VersionId": oldest})
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("rolled_back", 4)], report["findings"]
    assert "names step 4" in report["break"]["message"] and "names step 8" in report["break"]["message"]


def _old_head_bytes(client, bucket, key):
    oldest = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][-1]["VersionId"]
    return client.get_object(Bucket=bucket, Key=key, VersionId=oldest)["Body"].read()


def test_an_older_head_put_again_single_part_is_rolled_back(locked):
    """A fresh PUT of old signed bytes: same MD5 ETag as the old version, so the shortcut reads."""
    h, url, pub, client, bucket = locked
    key = f"attacks/{head_key(h.run_id)}"
    client.put_object(Bucket=bucket, Key=key, Body=_old_head_bytes(client, bucket, key))
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("rolled_back", 4)], report["findings"]


def test_an_older_head_uploaded_multipart_is_rolled_back(locked):
    """A multipart ETag is not the MD5 of the bytes: the shortcut cannot vouch, the versions are read."""
    h, url, pub, client, bucket = locked
    key = f"attacks/{head_key(h.run_id)}"
    body = _old_head_bytes(client, bucket, key)
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
    )
    current = client.head_object(Bucket=bucket, Key=key)["ETag"]
    assert "-" in current  # really a multipart ETag
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and kinds(report) == [("rolled_back", 4)], report["findings"]
    assert report["head_versions_read"] >= 1


def test_old_head_versions_are_retained_and_cannot_be_erased(locked):
    """Heads are put under the archive's retention: the rollback evidence cannot be deleted."""
    from botocore.exceptions import ClientError

    h, _url, _pub, client, bucket = locked
    key = f"attacks/{head_key(h.run_id)}"
    oldest = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][-1]["VersionId"]
    with pytest.raises(ClientError):
        client.delete_object(Bucket=bucket, Key=key, VersionId=oldest)
    versions = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]
    assert oldest in [v["VersionId"] for v in versions]


def test_an_oversized_object_on_s3_is_refused_before_its_body_is_read(locked):
    h, url, pub, client, bucket = locked
    client.put_object(Bucket=bucket, Key=f"attacks/{step_key(h.run_id, 6)}", Body=b"x" * (2 * 1024 * 1024))
    code, report, _ = verify(url, h.run_id, pub, "--max-object-bytes", str(1024 * 1024))
    assert code == 1 and ("malformed", 6) in kinds(report)
    code, _, err = snapshot(url, h.run_id, pub, 6, "--max-object-bytes", str(1024 * 1024))
    assert code == 1 and "2097152 bytes, over the 1048576-byte cap" in err


@pytest.mark.parametrize("digits", ["٠٠٠٠٠٠٠٠٠٠٠٣", "０００００００００００３", "00000000000３"])
def test_keys_with_non_ascii_digits_do_not_hide_a_missing_record(filerun, digits):
    """A planted key whose name is all (non-ASCII) digits must not alias step 3 or turn the audit into
    "incomplete" (exit 3): the deleted step 5 is still reported missing (exit 1)."""
    h, url, root, pub = filerun
    steps_dir = root / step_key(h.run_id, 3).rsplit("/", 1)[0]
    (steps_dir / f"{digits}.json").write_bytes((root / step_key(h.run_id, 3)).read_bytes())
    os.unlink(root / step_key(h.run_id, 5))
    code, report, _ = verify(url, h.run_id, pub)
    assert code == 1 and ("missing", 5) in kinds(report)
