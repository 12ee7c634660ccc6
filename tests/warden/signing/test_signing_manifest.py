"""Manifest and bundle formats: ordering, statement round trip, strict parsing, PAE."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from warden.signing.dsse import decode_bundle, encode_bundle, pae, sign_payload, verify_bundle
from warden.signing.errors import MalformedBundle, PayloadMismatch
from warden.signing.keys import key_id, trusted_keys_from
from warden.signing.manifest import (
    Provenance,
    build_manifest,
    build_statement,
    encode_statement,
    parse_statement,
    root_digest,
)

DIGESTS = {name: hashlib.sha256(name.encode()).digest() for name in ["a.b", "a/b/x", "b", "a/c", "A"]}


def test_resources_sort_by_path_components() -> None:
    manifest = build_manifest("m", DIGESTS, [".git"])
    assert [r.name for r in manifest.resources] == ["A", "a/b/x", "a/c", "a.b", "b"]
    assert manifest.root_digest == root_digest(DIGESTS[r.name] for r in manifest.resources)


def test_statement_shape_and_round_trip() -> None:
    manifest = build_manifest("step-000000050", DIGESTS, [".git", "./.github/"])
    provenance = Provenance(run_id="r", step=50, parent_root_digest="00" * 32, other={"future": 1})
    statement = build_statement(manifest, provenance)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    assert statement["subject"] == [{"name": "step-000000050", "digest": {"sha256": manifest.root_digest.hex()}}]
    assert statement["predicate"]["serialization"] == {
        "method": "files",
        "hash_type": "sha256",
        "allow_symlinks": False,
        "ignore_paths": [".git", ".github"],
    }
    assert statement["predicate"]["resources"][0] == {"name": "A", "algorithm": "sha256", "digest": DIGESTS["A"].hex()}
    parsed = parse_statement(encode_statement(statement))
    assert parsed.manifest == manifest
    assert parsed.provenance == provenance
    assert "ignore_paths" not in build_statement(build_manifest("m", DIGESTS))["predicate"]["serialization"]
    assert "warden" not in build_statement(manifest, Provenance())["predicate"]


def _statement() -> dict[str, Any]:
    return build_statement(build_manifest("m", DIGESTS, [".git"]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(_type="x"), "not an in-toto statement"),
        (lambda s: s.update(predicateType="x"), "predicateType is 'x'"),
        (lambda s: s["subject"].append(s["subject"][0]), "exactly one subject, got 2"),
        (lambda s: s["predicate"]["resources"].reverse(), "statement is inconsistent"),
        (lambda s: s["predicate"]["resources"][0].update(name="../escape"), "not a normalized path"),
        (lambda s: s["predicate"]["resources"][0].update(digest="zz"), "expected a sha256 hex digest"),
        (lambda s: s["predicate"]["serialization"].update(ignore_paths=["."]), "would ignore the whole checkpoint"),
        (lambda s: s["predicate"].update(warden={"step": "50"}), "warden.step must be an integer"),
        (lambda s: s["predicate"].pop("resources"), "predicate.resources must be a list"),
    ],
)
def test_parse_rejects_bad_statements_precisely(edit: Callable[[dict[str, Any]], object], message: str) -> None:
    statement = _statement()
    edit(statement)
    with pytest.raises(PayloadMismatch, match=message):
        parse_statement(json.dumps(statement).encode())


def test_pae_matches_the_dsse_spec_vector() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_bundle_round_trip_and_strict_decoding() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    bundle = sign_payload(b'{"x": 1}', key)
    assert decode_bundle(encode_bundle(bundle)) == bundle
    assert verify_bundle(bundle, trusted_keys_from([key.public_key()])) == bundle.key_hint
    document = json.loads(encode_bundle(bundle))
    document["dsseEnvelope"]["signatures"] = []
    with pytest.raises(MalformedBundle, match="signatures must be a non-empty list"):
        decode_bundle(json.dumps(document).encode())
    document["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.1"
    with pytest.raises(MalformedBundle, match="mediaType is"):
        decode_bundle(json.dumps(document).encode())


def test_bundle_without_hint_is_checked_against_every_trusted_key() -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    document = json.loads(encode_bundle(sign_payload(b"{}", key)))
    del document["verificationMaterial"]["publicKey"]["hint"]
    bundle = decode_bundle(json.dumps(document).encode())
    assert bundle.key_hint is None
    trusted = trusted_keys_from([other.public_key(), key.public_key()])
    assert verify_bundle(bundle, trusted) == key_id(key.public_key())
