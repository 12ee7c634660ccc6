"""Signing and verifying records and heads: DSSE envelopes in Sigstore bundles (docs/design.md section 4).

The same format and key type as checkpoint signatures (ECDSA P-256 over the DSSE PAE,
``verificationMaterial.publicKey.hint`` = key id), built with the signer's helpers; only
the predicate types differ (:data:`~warden.archive.record.PREDICATE_TYPE` and
:data:`~warden.archive.record.HEAD_PREDICATE_TYPE`). ECDSA signatures are randomized:
signing the same record twice gives different bytes, which is why a record is signed
once, spooled, and those exact bytes are what is uploaded and chained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from warden.archive.errors import RecordInvalid
from warden.archive.record import (
    HEAD_PREDICATE_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Head,
    Record,
    canonical_json,
    clip,
    head_key,
    parse_head,
    parse_record,
    statement,
    step_key,
)
from warden.signing.dsse import PAYLOAD_TYPE, decode_bundle, encode_bundle, sign_payload, verify_bundle
from warden.signing.errors import SignatureRejected, WrongKey
from warden.signing.keys import TrustedKeys, key_id, trusted_keys_from


class RecordSigner:
    """Signs record and head predicates with one private key; ``key_id`` is its hint."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        self._key = private_key
        self.key_id = key_id(private_key.public_key())
        self.own_trust = trusted_keys_from([private_key.public_key()], source="the archiver's own key")

    def sign_record(self, record: dict[str, Any]) -> bytes:
        """The bundle bytes of ``record`` (the object stored under its step key)."""
        subject = step_key(record["run_id"], record["step"])
        return self._sign(statement(record, subject, PREDICATE_TYPE))

    def sign_head(self, head: dict[str, Any]) -> bytes:
        """The bundle bytes of a head predicate."""
        return self._sign(statement(head, head_key(head["run_id"]), HEAD_PREDICATE_TYPE))

    def _sign(self, document: dict[str, Any]) -> bytes:
        return encode_bundle(sign_payload(canonical_json(document), self._key))


@dataclass(frozen=True)
class Verified:
    """A bundle that verified: its predicate and the trusted key that signed it."""

    predicate: dict[str, Any]
    key_id: str


# What parsing hostile bytes may raise besides the parsers' own errors: RecursionError (deep
# nesting), ValueError (an integer of more digits than int() accepts, invalid UTF-8), TypeError
# and AttributeError (a field of the wrong type), MemoryError. All become ``malformed``.
_PARSE_ERRORS = (RecursionError, ValueError, TypeError, AttributeError, KeyError, MemoryError)


def _open(body: bytes, trusted: TrustedKeys, predicate_type: str, what: str) -> Verified:
    """Verifies the signature, then the statement's shape. Raises RecordInvalid with a code.

    Never raises anything else for any ``body``; messages quote at most ~200 characters of it.
    """
    try:
        bundle = decode_bundle(body)
        signer = verify_bundle(bundle, trusted)
    except WrongKey as exc:
        raise RecordInvalid(f"{what}: {clip(str(exc), 500)}", "wrong_key") from None
    except SignatureRejected as exc:
        code = "malformed" if exc.code == "malformed_bundle" else "altered"
        raise RecordInvalid(f"{what}: {clip(str(exc), 500)}", code) from None
    except _PARSE_ERRORS as exc:
        raise RecordInvalid(f"{what}: not a bundle ({type(exc).__name__}: {clip(str(exc))})", "malformed") from None
    if bundle.payload_type != PAYLOAD_TYPE:
        found = clip(repr(bundle.payload_type))
        raise RecordInvalid(f"{what}: payloadType is {found}, expected {PAYLOAD_TYPE!r}", "malformed")
    try:
        document = json.loads(bundle.payload)
    except _PARSE_ERRORS:
        raise RecordInvalid(f"{what}: the signed payload is not JSON", "malformed") from None
    if not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE:
        raise RecordInvalid(f"{what}: the payload is not an in-toto Statement v1", "malformed")
    if document.get("predicateType") != predicate_type:
        found = clip(repr(document.get("predicateType")))
        raise RecordInvalid(f"{what}: predicateType is {found}, expected {predicate_type!r}", "malformed")
    predicate = document.get("predicate")
    if not isinstance(predicate, dict):
        raise RecordInvalid(f"{what}: the statement has no predicate object", "malformed")
    return Verified(predicate, signer)


def verify_record(body: bytes, trusted: TrustedKeys, what: str) -> tuple[Record, str]:
    """The record in ``body`` and the key id that signed it.

    Raises RecordInvalid: ``wrong_key`` (untrusted signer), ``altered`` (signature does
    not verify) or ``malformed`` (not a reward-snapshot statement). ``what`` names the
    object in messages (e.g. ``run R step N``).
    """
    verified = _open(body, trusted, PREDICATE_TYPE, what)
    try:
        return parse_record(verified.predicate), verified.key_id
    except _PARSE_ERRORS as exc:
        raise RecordInvalid(f"{what}: {clip(str(exc))}", "malformed") from None


def verify_head(body: bytes, trusted: TrustedKeys, what: str) -> tuple[Head, str]:
    """The head in ``body`` and its signer; raises RecordInvalid like :func:`verify_record`."""
    verified = _open(body, trusted, HEAD_PREDICATE_TYPE, what)
    try:
        return parse_head(verified.predicate), verified.key_id
    except _PARSE_ERRORS as exc:
        raise RecordInvalid(f"{what}: {clip(str(exc))}", "malformed") from None
