"""`warden audit` against SeaweedFS: lookups, request counts, and every kind of tampering."""

from __future__ import annotations

import base64
import json

import pytest
from support import free_port, run_warden

from sidecars.runtime import Outcome
from tests.warden.archive.archiver_helpers import Harness, audit_cli, make_keys
from warden.archive.record import canonical_json, step_key
from warden.archive.signing import RecordSigner
from warden.signing.keys import load_private_key

STEPS = [*range(1, 6), *range(10, 13)]  # a gap: 6..9 never archived


@pytest.fixture
def archived(request, tmp_path, keys, seaweed, lock_bucket, s3env):
    """A run archived with retention in the shared Object Lock bucket: (run id, store URL, public key)."""
    s3env(seaweed)
    run_id = f"audit-{request.node.name.replace('[', '-').replace(']', '')}"[:100]
    url = f"s3://{lock_bucket}/audits?addressing_style=path"
    h = Harness(tmp_path, url, keys[0], run_id, retention={"mode": "COMPLIANCE", "days": 1})
    h.start()
    h.snapshots(STEPS)
    assert h.once()[0] is Outcome.OK
    return run_id, url, keys[1]


def object_key(run_id, step):
    return f"audits/{step_key(run_id, step)}"


def test_snapshot_verifies_one_step_in_at_most_three_requests(archived):
    run_id, url, pub = archived
    code, out, err = audit_cli("snapshot", "--run", run_id, "--step", "4", "--store", url, "--trust", pub)
    assert code == 0, err
    assert f"run {run_id} step 4" in out and "signature: ok" in out and "chained to step 3" in out
    code, out, _ = audit_cli(
        "snapshot", "--run", run_id, "--step", "10", "--store", url, "--trust", pub, "--format", "json"
    )
    document = json.loads(out)
    assert code == 0 and document["verified"] and document["requests"] <= 3
    assert document["record"]["prev_step"] == 5 and document["record"]["step"] == 10
    code, out, _ = audit_cli(
        "snapshot", "--run", run_id, "--step", "1", "--store", url, "--trust", pub, "--format", "json"
    )
    document = json.loads(out)
    assert code == 0 and "genesis" in document["link"] and document["requests"] == 2


def test_a_step_never_archived_names_the_steps_near_it(archived):
    run_id, url, pub = archived
    code, out, err = audit_cli(
        "snapshot", "--run", run_id, "--step", "7", "--store", url, "--trust", pub, "--format", "json"
    )
    assert code == 3
    document = json.loads(out)
    assert document["found"] is False and document["nearby"] == [2, 3, 4, 5, 10, 11, 12]
    assert "steps near it: 2, 3, 4, 5, 10, 11, 12" in err


def test_list_shows_the_archived_steps(archived):
    run_id, url, _ = archived
    code, out, _ = audit_cli("list", "--run", run_id, "--store", url)
    assert code == 0 and "8 archived steps" in out and "1-5, 10-12" in out
    code, out, _ = audit_cli("list", "--run", run_id, "--store", url, "--format", "json")
    assert json.loads(out)["steps"] == STEPS


def test_verify_run_passes_on_an_intact_chain_through_the_real_cli(archived, seaweed):
    run_id, url, pub = archived
    result = run_warden(
        "audit",
        "verify-run",
        "--run",
        run_id,
        "--format",
        "json",
        env={**seaweed.env(), "WARDEN_STORE": url, "WARDEN_TRUST": pub},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["records_checked"] == 8 and report["head_step"] == 12


def verify(run_id, url, pub):
    code, out, err = audit_cli("verify-run", "--run", run_id, "--store", url, "--trust", pub, "--format", "json")
    return code, json.loads(out), err


def rewrite(client, bucket, key, mutate):
    """Puts a new version of ``key`` whose signed payload ``mutate`` changed (signature left as it was)."""
    document = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    mutate(statement["predicate"])
    document["dsseEnvelope"]["payload"] = base64.b64encode(canonical_json(statement)).decode()
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())
    return statement["predicate"]


def test_a_rewritten_body_is_found(archived, seaweed, lock_bucket):
    run_id, url, pub = archived
    rewrite(seaweed.client(), lock_bucket, object_key(run_id, 3), lambda p: p["samples"][0].update(reward=42.0))
    code, report, err = verify(run_id, url, pub)
    assert code == 1 and report["break"]["step"] == 3 and report["break"]["kind"] == "altered", report
    assert "chain is broken" in err
    code, _, err = audit_cli("snapshot", "--run", run_id, "--step", "3", "--store", url, "--trust", pub)
    assert code == 1 and "does not verify" in err
    code, out, _ = audit_cli("snapshot", "--run", run_id, "--step", "4", "--store", url, "--trust", pub)
    assert code == 1 and "chain: BROKEN (altered)" in out  # step 4 no longer links to what is stored


def test_a_deleted_record_is_found(archived, seaweed, lock_bucket):
    run_id, url, pub = archived
    seaweed.client().delete_object(Bucket=lock_bucket, Key=object_key(run_id, 4))  # a delete marker
    code, report, _ = verify(run_id, url, pub)
    assert code == 1 and report["break"]["step"] == 4 and report["break"]["kind"] == "missing"
    assert "delete marker hides 1 retained version" in report["break"]["message"]
    code, _, err = audit_cli("snapshot", "--run", run_id, "--step", "4", "--store", url, "--trust", pub)
    assert code == 1 and "deleted" in err


def test_swapped_records_are_found(archived, seaweed, lock_bucket):
    run_id, url, pub = archived
    client = seaweed.client()
    two, three = (client.get_object(Bucket=lock_bucket, Key=object_key(run_id, s))["Body"].read() for s in (2, 3))
    client.put_object(Bucket=lock_bucket, Key=object_key(run_id, 2), Body=three)
    client.put_object(Bucket=lock_bucket, Key=object_key(run_id, 3), Body=two)
    code, report, _ = verify(run_id, url, pub)
    assert code == 1 and report["break"]["step"] == 2 and report["break"]["kind"] == "reordered"


def test_a_record_signed_by_an_untrusted_key_is_found(archived, seaweed, lock_bucket, tmp_path):
    run_id, url, pub = archived
    client = seaweed.client()
    forger = RecordSigner(load_private_key(make_keys(tmp_path / "forger")[0]))
    original = json.loads(client.get_object(Bucket=lock_bucket, Key=object_key(run_id, 11))["Body"].read())
    predicate = json.loads(base64.b64decode(original["dsseEnvelope"]["payload"]))["predicate"]
    predicate["samples"] = []  # same chain link, other content, valid signature by the wrong key
    client.put_object(Bucket=lock_bucket, Key=object_key(run_id, 11), Body=forger.sign_record(predicate))
    code, report, _ = verify(run_id, url, pub)
    assert code == 1 and report["break"]["step"] == 11 and report["break"]["kind"] == "wrong_key"
    assert "not trusted" in report["break"]["message"]


def test_a_deleted_newest_record_is_found_through_the_head(archived, seaweed, lock_bucket):
    run_id, url, pub = archived
    seaweed.client().delete_object(Bucket=lock_bucket, Key=object_key(run_id, 12))
    code, report, _ = verify(run_id, url, pub)
    assert code == 1 and report["break"]["step"] == 12 and report["break"]["kind"] == "missing"


def test_usage_and_reachability_errors(archived, tmp_path, monkeypatch):
    run_id, url, pub = archived
    code, _, err = audit_cli("verify-run", "--run", run_id, "--store", url, "--trust", str(tmp_path / "nope"))
    assert code == 2 and "not found" in err
    _, other_pub = make_keys(tmp_path / "other")
    code, _, _ = audit_cli("verify-run", "--run", run_id, "--store", url, "--trust", other_pub)
    assert code == 1
    code, _, err = audit_cli("list", "--run", run_id, "--policy", str(tmp_path / "none.yaml"))
    assert code == 2 and "--store" in err
    code, _, _ = audit_cli("list", "--run", "../x", "--store", url)
    assert code == 2
    code, _, err = audit_cli("verify-run", "--run", "never-archived", "--store", url, "--trust", pub)
    assert code == 3 and "no archived records" in err
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    code, _, err = audit_cli("snapshot", "--run", run_id, "--step", "1", "--store", url, "--trust", pub)
    assert code == 3 and "cannot connect" in err and "Traceback" not in err


def test_audit_has_no_default_trust(tmp_path, monkeypatch):
    """A key planted in ./policies/keys (where the auditor happens to stand) is never trusted."""
    monkeypatch.delenv("WARDEN_TRUST", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policies" / "keys").mkdir(parents=True)
    (tmp_path / "policies" / "keys" / "evil.pub").write_text("planted")
    for command in (["verify-run", "--run", "r"], ["snapshot", "--run", "r", "--step", "1"]):
        code, _, err = audit_cli(*command, "--store", (tmp_path / "store").as_uri())
        assert code == 2 and "--trust" in err, (command, code, err)
