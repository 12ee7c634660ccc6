"""Pure parts of the archiver: records, sample selection, keys, signing and verification."""

from __future__ import annotations

import base64
import json
import pathlib

import pytest

from tests.warden.archive.archiver_helpers import make_keys
from warden.archive.errors import RecordInvalid
from warden.archive.findings import ranges
from warden.archive.record import (
    ChainLink,
    Limits,
    build_record,
    canonical_json,
    cap_text,
    genesis_for_run,
    head_key,
    object_hash,
    parse_record,
    repair_text,
    select_samples,
    step_from_key,
    step_key,
    valid_run_id,
)
from warden.archive.signing import RecordSigner, verify_head, verify_record
from warden.payloads import RewardSnapshot
from warden.signing.keys import load_private_key, load_trusted_keys

LIMITS = Limits(top_k=2, min_reward=None, max_text_bytes=64)


def sample(index, reward, prompt="p", response="r", **extra):
    return {"index": index, "prompt": prompt, "response": response, "reward": reward, "truncated": False, **extra}


def record_for(step=5, prev="a" * 64, prev_step=4, data=None):
    return build_record(
        run_id="run-1",
        step=step,
        time="2026-11-30T00:00:00.000000Z",
        event_seq=9,
        snapshot=RewardSnapshot.from_data(data or {"samples": [sample(0, 0.5), sample(1, 0.9)]}),
        link=ChainLink(prev, prev_step),
        limits=LIMITS,
        checkpoint={"step": 0, "path": "step-000000000"},
    )


def test_keys_and_run_ids():
    assert step_key("run-1", 17) == "runs/run-1/steps/000000000017.json"
    assert head_key("run-1") == "runs/run-1/head.json"
    assert step_from_key(step_key("r", 123456)) == 123456
    assert step_from_key("runs/r/steps/17.json") is None
    assert step_from_key("runs/r/steps/000000000017.json.tmp") is None
    for good in ("demo-20261130-0001", "a", "A.b_c-1"):
        assert valid_run_id(good)
    for bad in ("", ".", "..", "-x", "a/b", "a b", "x" * 200, None, 3):
        assert not valid_run_id(bad)


def test_canonical_json_is_stable_and_refuses_nan():
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_selection_keeps_top_k_by_reward_then_index_and_applies_the_threshold():
    data = {"samples": [sample(3, 0.5), sample(1, 0.9), sample(2, 0.9), sample(0, -1.0)]}
    kept, offered, notes = select_samples(RewardSnapshot.from_data(data), LIMITS)
    assert [s["index"] for s in kept] == [1, 2] and offered == 4 and notes == []
    kept, _, _ = select_samples(RewardSnapshot.from_data(data), Limits(top_k=10, min_reward=0.5, max_text_bytes=64))
    assert [s["index"] for s in kept] == [1, 2, 3]


def test_bad_samples_are_dropped_and_described():
    data = {
        "samples": [
            "not an object",
            {"index": 1, "prompt": "p", "response": "r"},  # no reward
            sample(2, float("inf")),
            sample(-1, 0.1),
            sample(4, True),
            {"index": 5, "prompt": None, "response": "r", "reward": 0.3},
            sample(6, 0.2),
        ]
    }
    kept, offered, notes = select_samples(RewardSnapshot.from_data(data), LIMITS)
    assert [s["index"] for s in kept] == [6] and offered == 7
    assert len(notes) == 6 and all("dropped" in n for n in notes)
    kept, offered, notes = select_samples(RewardSnapshot.from_data({"k": 4}), LIMITS)
    assert kept == [] and offered == 0 and "no 'samples'" in notes[0]


def test_huge_text_is_cut_on_a_character_boundary_and_recorded():
    text, size = cap_text("é" * 40, 7)  # 2 bytes each: 3 whole characters fit
    assert text == "ééé" and size == 80
    kept, _, notes = select_samples(RewardSnapshot(samples=(sample(0, 1.0, prompt="ü" * 5000, response="ok"),)), LIMITS)
    only = kept[0]
    assert only["truncated"] is True and only["original_bytes"] == {"prompt": 10000}
    assert len(only["prompt"].encode()) <= 64 and only["response"] == "ok"
    assert notes == ["sample index 0: prompt truncated from 10000 to 64 bytes"]


def test_invalid_utf8_is_replaced_and_recorded():
    assert repair_text("ok \ud800 and \udcff") == ("ok \ufffd and \ufffd", True)
    assert repair_text("fine 😀") == ("fine 😀", False)
    kept, _, notes = select_samples(RewardSnapshot(samples=(sample(0, 1.0, response="bad \udc80 bytes"),)), LIMITS)
    assert kept[0]["response"] == "bad \ufffd bytes" and kept[0]["repaired"] is True
    assert "not valid UTF-8" in notes[0]
    canonical_json(kept)  # encodable now


def test_record_fields_and_parse():
    record = record_for()
    assert record["prev"] == "a" * 64 and record["prev_step"] == 4
    assert record["selection"] == {"top_k": 2, "min_reward": None, "offered": 2}
    assert record["checkpoint"] == {"step": 0, "path": "step-000000000"}
    parsed = parse_record(json.loads(canonical_json(record)))
    assert (parsed.run_id, parsed.step, parsed.prev_step) == ("run-1", 5, 4)
    for field, value in (("schema", 2), ("step", -1), ("prev", "xyz"), ("prev_step", "4"), ("run_id", "a/b")):
        with pytest.raises(ValueError, match=field):
            parse_record({**record, field: value})
    assert genesis_for_run("r") != genesis_for_run("s")
    assert ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10" and ranges([]) == ""


@pytest.fixture
def signer_and_trust(tmp_path):
    private, public = make_keys(tmp_path / "k")
    return RecordSigner(load_private_key(private)), load_trusted_keys(public)


def test_signed_record_verifies_and_its_hash_is_the_chain_hash(signer_and_trust):
    signer, trusted = signer_and_trust
    body = signer.sign_record(record_for())
    document = json.loads(body)
    assert document["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert document["verificationMaterial"] == {"publicKey": {"hint": signer.key_id}, "tlogEntries": []}
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    assert statement["predicateType"] == "https://warden.dev/reward-snapshot/v1"
    assert statement["subject"][0]["name"] == "runs/run-1/steps/000000000005.json"
    record, key_id = verify_record(body, trusted, "r")
    assert key_id == signer.key_id and record.step == 5
    assert len(object_hash(body)) == 64
    # A head is not a record, and a record is not a head.
    with pytest.raises(RecordInvalid) as info:
        verify_head(body, trusted, "head")
    assert info.value.code == "malformed"


def test_altered_and_foreign_records_are_refused(signer_and_trust, tmp_path):
    signer, trusted = signer_and_trust
    body = signer.sign_record(record_for())
    document = json.loads(body)
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    statement["predicate"]["samples"][0]["reward"] = 99.0
    document["dsseEnvelope"]["payload"] = base64.b64encode(canonical_json(statement)).decode()
    with pytest.raises(RecordInvalid) as info:
        verify_record(json.dumps(document).encode(), trusted, "run-1 step 5")
    assert info.value.code == "altered" and "run-1 step 5" in str(info.value)
    other_private, _ = make_keys(tmp_path / "other")
    foreign = RecordSigner(load_private_key(other_private)).sign_record(record_for())
    with pytest.raises(RecordInvalid) as info:
        verify_record(foreign, trusted, "r")
    assert info.value.code == "wrong_key"
    for junk in (b"not json", b"{}", json.dumps({**document, "dsseEnvelope": {}}).encode()):
        with pytest.raises(RecordInvalid) as info:
            verify_record(junk, trusted, "r")
        assert info.value.code == "malformed"


def test_the_shipped_policy_loads_and_bad_values_name_their_key(tmp_path, monkeypatch):
    from warden.archive.policy import ArchiverPolicy
    from warden.archive.service import load_signer
    from warden.errors import ConfigError
    from warden.policy import PolicyError, load_policy, policy_from_mapping

    root = pathlib.Path(__file__).resolve().parents[3]
    policy = load_policy(root / "policies" / "archiver.yaml", ArchiverPolicy)
    assert policy.retention.needs_object_lock and policy.addressing_style == "path"
    monkeypatch.setenv("WARDEN_STORE", "file:///elsewhere")
    assert policy.store_url() == "file:///elsewhere"
    for raw, key in (
        ({"retention": {"mode": "LOOSE"}}, "retention: mode"),
        ({"retention": {"mode": "COMPLIANCE", "days": 0}}, "retention: days"),
        ({"top_k": 0}, "top_k"),
        ({"addressing_style": "dns"}, "addressing_style"),
        ({"bucket": "x"}, "bucket: unknown key"),
    ):
        with pytest.raises(PolicyError, match=key):
            policy_from_mapping({"version": 1, **raw}, ArchiverPolicy, "archiver.yaml")
    monkeypatch.delenv("WARDEN_SIGNING_KEY", raising=False)
    with pytest.raises(ConfigError, match="WARDEN_SIGNING_KEY"):
        load_signer(policy)
    private, _ = make_keys(tmp_path / "k")
    monkeypatch.setenv("WARDEN_SIGNING_KEY", private)
    assert len(load_signer(policy).key_id) == 64


def test_the_spool_index_survives_restarts_and_finds_steps_after_a_point(tmp_path):
    from warden.archive.spool import Spool

    spool = Spool(str(tmp_path / "spool"))
    for step in (5, 1, 3, 9, 7):
        spool.add("r", step, b"%d" % step)
    (tmp_path / "spool" / "r" / ".tmp-000000000011.json.1.2").write_bytes(b"torn")
    assert spool.steps_after("r", 3, 2) == [5, 7]
    for step in (1, 3, 5):
        spool.remove("r", step)
    assert spool.steps_after("r", -1, 10) == [7, 9] and spool.depth() == 2
    spool.set_head("r", b"head")
    spool.close()
    again = Spool(str(tmp_path / "spool"))
    assert again.steps("r") == [7, 9] and again.read("r", 9) == b"9" and again.head("r") == b"head"
    assert sorted(p.name for p in (tmp_path / "spool" / "r").iterdir()) == [
        "000000000007.json",
        "000000000009.json",
        "head.json",
    ]
    assert again.drop_stored("r", 8) == 1 and again.runs() == ["r"]
    again.close()
