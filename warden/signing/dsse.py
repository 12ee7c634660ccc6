"""Signing layer: DSSE envelopes in Sigstore bundles v0.3, and signing a checkpoint.

Format (DESIGN section 4), byte-compatible with ``model_signing sign key``::

    {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
     "verificationMaterial": {"publicKey": {"hint": <key id>}, "tlogEntries": []},
     "dsseEnvelope": {"payload": <base64 statement>, "payloadType": "application/vnd.in-toto+json",
                      "signatures": [{"sig": <base64 DER ECDSA P-256/SHA-256 over PAE>, "keyid": ""}]}}

PAE is the DSSE v1 pre-authentication encoding:
``"DSSEv1" SP len(type) SP type SP len(body) SP body`` (lengths in bytes, ASCII decimal).

The signature of ``<parent>/step-000000050/`` is ``<parent>/step-000000050.sig``, written
atomically (temporary file, fsync, rename), so a reader never sees half a bundle.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from warden.safeio import atomic_write_bytes
from warden.signing.errors import (
    AnnouncementMismatch,
    BadSignature,
    MalformedBundle,
    SignatureWriteError,
    UnsupportedSignature,
    WrongKey,
    clipped,
    quoted,
)
from warden.signing.hashing import (
    FileEntry,
    ProgressCallback,
    hash_files,
    hash_shards,
    refuse_unsafe,
    scan_tree,
)
from warden.signing.keys import TrustedKey, TrustedKeys, key_id
from warden.signing.manifest import (
    DEFAULT_IGNORE_PATHS,
    FILES_SHA256,
    Announced,
    Manifest,
    Provenance,
    Serialization,
    build_manifest,
    build_statement,
    encode_statement,
    files_root,
    names_digest,
    parse_json,
    shard_resources,
)

PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
SIGNATURE_SUFFIX = ".sig"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload``: the bytes that are signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclass(frozen=True)
class DsseSignature:
    """One DSSE signature: raw DER bytes and the (usually empty) keyid."""

    sig: bytes
    keyid: str = ""


@dataclass(frozen=True)
class Bundle:
    """A Sigstore bundle v0.3 with a DSSE envelope and a public-key hint."""

    payload: bytes
    payload_type: str
    signatures: tuple[DsseSignature, ...]
    key_hint: str | None
    media_type: str = BUNDLE_MEDIA_TYPE


def sign_payload(payload: bytes, private_key: ec.EllipticCurvePrivateKey, payload_type: str = PAYLOAD_TYPE) -> Bundle:
    """Signs ``payload`` with ECDSA P-256/SHA-256 over its PAE; the hint is the key id."""
    signature = private_key.sign(pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    return Bundle(payload, payload_type, (DsseSignature(signature),), key_id(private_key.public_key()))


def encode_bundle(bundle: Bundle) -> bytes:
    """The bundle as JSON, standard base64 for payload and signatures."""
    document = {
        "mediaType": bundle.media_type,
        "verificationMaterial": {"publicKey": {"hint": bundle.key_hint}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(bundle.payload).decode("ascii"),
            "payloadType": bundle.payload_type,
            "signatures": [
                {"sig": base64.b64encode(s.sig).decode("ascii"), "keyid": s.keyid} for s in bundle.signatures
            ],
        },
    }
    return (json.dumps(document, indent=2) + "\n").encode("utf-8")


def _b64(value: Any, where: str) -> bytes:
    """Decodes standard (or URL-safe) base64, as DSSE allows both; raises MalformedBundle."""
    if not isinstance(value, str):
        raise MalformedBundle(f"{where} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            raise MalformedBundle(f"{where} is not valid base64") from None


def _object(parent: Any, key: str, where: str) -> dict[str, Any]:
    """``parent[key]`` as a JSON object; raises MalformedBundle naming the field."""
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise MalformedBundle(f"{where}{key} is missing or not an object")
    return value


def _parse_signatures(envelope: dict[str, Any]) -> tuple[DsseSignature, ...]:
    """The envelope's signatures; at least one is required."""
    raw = envelope.get("signatures")
    if not isinstance(raw, list) or not raw:
        raise MalformedBundle("dsseEnvelope.signatures must be a non-empty list")
    parsed = []
    for index, item in enumerate(raw):
        where = f"dsseEnvelope.signatures[{index}]"
        if not isinstance(item, dict):
            raise MalformedBundle(f"{where} must be an object")
        keyid = item.get("keyid") or ""
        parsed.append(DsseSignature(_b64(item.get("sig"), where + ".sig"), str(keyid)[:200]))
    return tuple(parsed)


def decode_bundle(data: bytes) -> Bundle:
    """Parses a bundle; raises MalformedBundle saying which field is wrong (quoted values cut short).

    Accepts what model_signing reads too: missing ``tlogEntries`` or ``hint``.
    """
    document = parse_json(data, MalformedBundle, "the bundle")
    if not isinstance(document, dict) or document.get("mediaType") != BUNDLE_MEDIA_TYPE:
        found = document.get("mediaType") if isinstance(document, dict) else None
        raise MalformedBundle(f"mediaType is {quoted(found)}, expected {BUNDLE_MEDIA_TYPE!r}")
    material = _object(document, "verificationMaterial", "")
    hint = _object(material, "publicKey", "verificationMaterial.").get("hint")
    if hint is not None and not isinstance(hint, str):
        raise MalformedBundle("verificationMaterial.publicKey.hint must be a string")
    envelope = _object(document, "dsseEnvelope", "")
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise MalformedBundle("dsseEnvelope.payloadType is missing")
    payload = _b64(envelope.get("payload"), "dsseEnvelope.payload")
    return Bundle(payload, payload_type, _parse_signatures(envelope), hint or None, document["mediaType"])


def _verifies(key: TrustedKey, bundle: Bundle) -> bool:
    """True if any signature of ``bundle`` verifies under ``key``."""
    message = pae(bundle.payload_type, bundle.payload)
    for signature in bundle.signatures:
        try:
            key.public_key.verify(signature.sig, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return True
    return False


def verify_bundle(bundle: Bundle, trusted: TrustedKeys) -> str:
    """Checks the DSSE signature against the trusted key named by the hint; returns its key id.

    Without a hint (older bundles) every trusted key is tried. Raises WrongKey when the
    hint names an untrusted key or no trusted key verifies a hint-less bundle, and
    BadSignature when the named key does not verify the payload.
    """
    if bundle.key_hint is None:
        match = next((k for k in trusted if _verifies(k, bundle)), None)
        if match is None:
            raise WrongKey(
                f"the bundle names no key, and none of the {len(trusted)} trusted keys in {trusted.source} verifies it"
            )
        return match.key_id
    key = trusted.get(bundle.key_hint)
    if key is None:
        known = ", ".join(k.key_id[:16] for k in trusted) or "none"
        raise WrongKey(
            f"signed by key {clipped(bundle.key_hint)}, which is not trusted "
            f"(trusted keys in {trusted.source}: {known}); "
            "if this key is legitimate, add its .pub file there"
        )
    if not _verifies(key, bundle):
        raise BadSignature(
            f"the signature does not verify under trusted key {key.key_id} ({key.source}): "
            "the payload or the signature was altered after signing"
        )
    return key.key_id


def signature_path_for(checkpoint_dir: str | os.PathLike[str]) -> str:
    """``<parent>/step-000000050/`` -> ``<parent>/step-000000050.sig`` (beside the directory)."""
    path = os.path.abspath(os.fspath(checkpoint_dir))
    return path + SIGNATURE_SUFFIX


def checkpoint_name(checkpoint_dir: str | os.PathLike[str]) -> str:
    """The subject name of a checkpoint: its directory's basename."""
    return os.path.basename(os.path.abspath(os.fspath(checkpoint_dir)))


def ignore_paths_for(checkpoint_dir: str, signature_path: str, base: tuple[str, ...]) -> tuple[str, ...]:
    """``base`` plus the signature file's relative path when it lies inside the checkpoint."""
    relative = os.path.relpath(os.path.abspath(signature_path), os.path.abspath(checkpoint_dir))
    if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
        return base
    return (*base, relative.replace(os.sep, "/"))


@dataclass(frozen=True)
class SignResult:
    """What :func:`sign_checkpoint` did: where the bundle is, and what it vouches for."""

    signature_path: str
    manifest: Manifest
    root_digest: str
    key_id: str
    total_bytes: int


def sign_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    private_key: ec.EllipticCurvePrivateKey,
    provenance: Provenance | None = None,
    *,
    signature_path: str | os.PathLike[str] | None = None,
    ignore_paths: tuple[str, ...] = DEFAULT_IGNORE_PATHS,
    max_workers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    expected: Announced | None = None,
    serialization: Serialization = FILES_SHA256,
    before_write: Callable[[], Callable[[], None] | None] | None = None,
) -> SignResult:
    """Hashes ``checkpoint_dir``, signs its manifest and writes the bundle atomically.

    The bundle goes to ``signature_path`` (default :func:`signature_path_for`); if that
    lies inside the directory it is added to the ignored paths. With ``expected`` (what
    the trainer announced) the manifest is signed only if its root digest and file count
    are the announced ones; the manifest compared is the one signed (one hash, no window
    between check and signature). Raises the hashing layer's errors (UnsafePathError,
    CheckpointVanished, CheckpointChanged, CheckpointUnreadable, HashingCancelled) and
    AnnouncementMismatch before anything is written, and SignatureWriteError if the
    bundle cannot be written.

    ``serialization``: ``files``/sha256 (default, what every model_signing verifies),
    ``shards`` (each file's shards hashed in parallel) or ``files``/blake3. The announcement is
    always the per-file SHA-256 root: in the other modes it is computed from the same read
    (one thread per file, so no faster than ``files``) and recorded as
    ``predicate.warden.files_root_digest``.

    ``before_write`` runs right before the bundle is written and may raise to write nothing (the
    signer's lease check: warden/lease.py); what it returns, if not None, is its after-write hook,
    run right after the bundle is written (the lease's check that the write did not outlast it).
    """
    directory = os.fspath(checkpoint_dir)
    target = os.fspath(signature_path) if signature_path is not None else signature_path_for(directory)
    ignored = ignore_paths_for(directory, target, ignore_paths)
    scan = refuse_unsafe(scan_tree(directory, ignored))
    check_shardable(directory, scan.files, serialization)
    # An announcement in the signed serialization is compared with the manifest itself (one hash);
    # a files/sha256 announcement under another serialization also needs each file's whole SHA-256.
    same_form = expected is not None and expected.serialization == serialization
    if expected is not None and expected.shard_size is not None and not same_form:
        raise AnnouncementMismatch(
            f"{directory}: refused to sign: the trainer announced its digest in the shards serialization "
            f"({expected.shard_size}-byte shards), this signer signs {serialization.resource_algorithm}",
            "serialization_mismatch",
            expected.serialization.resource_algorithm,
            serialization.resource_algorithm,
        )
    digests, files_digests = hash_resources(
        directory,
        scan.files,
        serialization,
        whole_files=expected is not None and not same_form,
        max_workers=max_workers,
        progress=progress,
        cancel=cancel,
    )
    manifest = build_manifest(checkpoint_name(directory), digests, ignored, serialization)
    if expected is not None and same_form:
        names = names_digest([r.name for r in manifest.resources], [f.name for f in scan.files])
        found = Announced(manifest.root_digest.hex(), len(manifest.resources), expected.shard_size, names)
        check_announced(directory, found, expected)
    elif expected is not None:
        assert files_digests is not None
        check_announced(directory, files_root(files_digests), expected)
        if serialization != FILES_SHA256:
            provenance = replace(provenance or Provenance(), files_root_digest=expected.root_digest)
    bundle = sign_payload(encode_statement(build_statement(manifest, provenance)), private_key)
    after_write = before_write() if before_write is not None else None
    write_bundle(target, bundle)
    if after_write is not None:
        after_write()
    return SignResult(target, manifest, manifest.root_digest.hex(), key_id(private_key.public_key()), scan.total_bytes)


def check_shardable(directory: str, files: tuple[FileEntry, ...], serialization: Serialization) -> None:
    """Raises UnsupportedSignature when a file name cannot be a shard resource (it holds ``:``,
    which model_signing's shard names use as separator)."""
    bad = [f.name for f in files if ":" in f.name] if serialization.sharded else []
    if bad:
        raise UnsupportedSignature(
            f"{directory}: {len(bad)} file names hold ':' (e.g. {quoted(bad[0])}), which the shards "
            "serialization cannot name; sign with serialization files"
        )


def hash_resources(
    directory: str,
    files: tuple[FileEntry, ...],
    serialization: Serialization,
    *,
    whole_files: bool = False,
    max_workers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> tuple[dict[str, bytes], dict[str, bytes] | None]:
    """``({resource name: digest}, {file name: sha256} or None)`` of ``files`` in ``serialization``.

    The second is the announcement form, computed when ``whole_files`` from the same read:
    in ``files``/sha256 mode it is the first; otherwise each file is read by one thread that
    feeds its shards (or its blake3) and its SHA-256 at once.
    """
    if serialization.sharded:
        assert serialization.shard_size is not None
        found = hash_shards(
            directory,
            files,
            serialization.shard_size,
            whole_files=whole_files,
            max_workers=max_workers,
            progress=progress,
            cancel=cancel,
        )
        return shard_resources(found.shards), found.files
    digests = hash_files(
        directory,
        files,
        algorithm=serialization.hash_type,
        max_workers=max_workers,
        progress=progress,
        cancel=cancel,
    )
    if not whole_files:
        return digests, None
    if serialization.hash_type == "sha256":
        return digests, digests
    sha = hash_files(directory, files, max_workers=max_workers, cancel=cancel)  # blake3: a second read
    return digests, sha


def check_announced(directory: str, actual: Announced, expected: Announced) -> None:
    """Raises AnnouncementMismatch unless ``actual`` (the files/sha256 root and file count found on
    disk) is the announced root digest and file count."""
    if actual.root_digest != expected.root_digest:
        raise AnnouncementMismatch(
            f"{directory}: refused to sign: the files hash to root sha256:{actual.root_digest}, "
            f"but the trainer announced sha256:{quoted(expected.root_digest)}",
            "digest_mismatch",
            expected.root_digest,
            actual.root_digest,
        )
    if actual.file_count != expected.file_count:
        raise AnnouncementMismatch(
            f"{directory}: refused to sign: {actual.file_count} files on disk, "
            f"the trainer announced {expected.file_count}",
            "file_count_mismatch",
            str(expected.file_count),
            str(actual.file_count),
        )
    if expected.names_digest is not None and actual.names_digest != expected.names_digest:
        raise AnnouncementMismatch(
            f"{directory}: refused to sign: the bytes match the announcement but the file names do not "
            "(renamed, split or added files)",
            "digest_mismatch",
            f"names {expected.names_digest}",
            f"names {actual.names_digest}",
        )


def write_bundle(path: str, bundle: Bundle) -> None:
    """Writes ``bundle`` to ``path`` atomically and durably (temp file, rename, fsync, fsync dir):
    visible as soon as it is complete, durable when this returns. The signer marks the event that
    asked for it handled only afterwards, so a crash in between signs again."""
    try:
        atomic_write_bytes(path, encode_bundle(bundle), sync_first=False)
    except OSError as exc:
        raise SignatureWriteError(f"{path}: cannot write the signature: {exc.strerror}") from None
