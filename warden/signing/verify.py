"""Verification: a checkpoint directory against its signature bundle and the trusted keys.

:func:`verify_checkpoint` returns a :class:`VerifyResult` for every outcome that is a
finding (exit 1 when not ``ok``): the bundle is malformed, signed by an untrusted key,
the signature does not verify, the payload is not a consistent statement, the subject
names another checkpoint (a moved or swapped signature), the directory holds symlinks or
special files, or files were modified, are missing or were added. It raises only when
verification cannot be completed (exit 3): no signature file, an unreadable file, a file
deleted while hashing, or a validly signed bundle in a serialization Warden cannot check.

Bundles written by ``model_signing sign key`` with a P-256 key verify like ours: the
ignore paths recorded in their statement are honoured, and so is a signature file kept
inside the model directory.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warden.errors import quote_untrusted
from warden.safeio import FILE_FLAGS
from warden.signing.dsse import (
    PAYLOAD_TYPE,
    Bundle,
    checkpoint_name,
    decode_bundle,
    ignore_paths_for,
    signature_path_for,
    verify_bundle,
)
from warden.signing.errors import (
    MalformedBundle,
    PayloadMismatch,
    SignatureMissing,
    SignatureRejected,
    SignatureUnreadable,
    VerificationFailed,
)
from warden.signing.hashing import ProgressCallback, hash_files, hash_shards, refusal_reason, scan_tree
from warden.signing.keys import TrustedKeys
from warden.signing.manifest import (
    Provenance,
    SignedStatement,
    build_manifest,
    parse_statement,
    per_file_shard_digests,
    shard_resources,
)

SUBJECT_MISMATCH = "subject_mismatch"
UNSAFE_PATH = "unsafe_path"
FILES_MISMATCH = "files_mismatch"


@dataclass(frozen=True)
class FileDiff:
    """A file that differs from the signed manifest; digests are hex, None where absent."""

    name: str
    expected: str | None
    actual: str | None


@dataclass(frozen=True)
class Problem:
    """One reason the checkpoint does not match: a stable ``code`` and a precise message.

    Codes: malformed_bundle, wrong_key, bad_signature, payload_mismatch, subject_mismatch,
    unsafe_path, files_mismatch.
    """

    code: str
    message: str


@dataclass
class VerifyResult:
    """Everything verification found; ``ok`` when there is no problem."""

    checkpoint: str
    signature: str
    key_id: str | None = None
    subject_name: str | None = None
    signed_root_digest: str | None = None
    actual_root_digest: str | None = None
    provenance: Provenance | None = None
    files_checked: int = 0
    bytes_checked: int = 0
    modified: list[FileDiff] = field(default_factory=list)
    missing: list[FileDiff] = field(default_factory=list)
    extra: list[FileDiff] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the signature is trusted and valid and every file matches it."""
        return not self.problems

    @property
    def codes(self) -> list[str]:
        """The problem codes, in the order found."""
        return [p.code for p in self.problems]

    def summary(self) -> str:
        """One line: OK with counts, or INVALID with the first problems."""
        if self.ok:
            counts = f"{self.files_checked} files ({self.bytes_checked} bytes)"
            return f"OK {quote_untrusted(self.checkpoint, 500)}: {counts} match {quote_untrusted(self.signature, 500)}"
        return f"INVALID {quote_untrusted(self.checkpoint, 500)}: " + "; ".join(
            quote_untrusted(p.message, 1000) for p in self.problems
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report (``--format json``)."""
        return {
            "ok": self.ok,
            "checkpoint": self.checkpoint,
            "signature": self.signature,
            "key_id": self.key_id,
            "subject": self.subject_name,
            "signed_root_digest": self.signed_root_digest,
            "actual_root_digest": self.actual_root_digest,
            "provenance": self.provenance.to_dict() if self.provenance is not None else None,
            "files_checked": self.files_checked,
            "bytes_checked": self.bytes_checked,
            "modified": [{"name": d.name, "expected": d.expected, "actual": d.actual} for d in self.modified],
            "missing": [{"name": d.name, "expected": d.expected} for d in self.missing],
            "extra": [{"name": d.name, "actual": d.actual} for d in self.extra],
            "problems": [{"code": p.code, "message": p.message} for p in self.problems],
        }

    def report(self) -> str:
        """Multi-line text report (``--format text``) listing every differing file with hex digests."""
        if self.ok:
            lines = [self.summary(), f"  key {self.key_id}  root sha256:{self.signed_root_digest}"]
            info = self.provenance.to_dict() if self.provenance is not None else {}
            lines += [f"  {k}: {v}" for k, v in info.items()]
            return "\n".join(lines)
        # names come from the directory (the storage writer's): one quoted line each, never a newline
        lines = [f"INVALID {quote_untrusted(self.checkpoint, 500)} (signature {quote_untrusted(self.signature, 500)})"]
        lines += [f"  {p.code}: {quote_untrusted(p.message, 1000)}" for p in self.problems]
        lines += [
            f"    modified {quote_untrusted(d.name, 300)}: signed sha256:{d.expected}, found sha256:{d.actual}"
            for d in self.modified
        ]
        lines += [f"    missing  {quote_untrusted(d.name, 300)}: signed sha256:{d.expected}" for d in self.missing]
        lines += [f"    extra    {quote_untrusted(d.name, 300)}: found sha256:{d.actual}" for d in self.extra]
        return "\n".join(lines)

    def raise_for_problems(self) -> None:
        """Raises VerificationFailed (exit code 1) unless ``ok``."""
        if not self.ok:
            raise VerificationFailed(self.summary(), self)


def compare_digests(
    expected: Mapping[str, bytes], actual: Mapping[str, bytes]
) -> tuple[list[FileDiff], list[FileDiff], list[FileDiff]]:
    """(modified, missing, extra) between signed and found ``{name: raw digest}``, each sorted by name."""
    changed = [n for n in sorted(expected) if n in actual and expected[n] != actual[n]]
    modified = [FileDiff(n, expected[n].hex(), actual[n].hex()) for n in changed]
    missing = [FileDiff(n, expected[n].hex(), None) for n in sorted(expected) if n not in actual]
    extra = [FileDiff(n, None, actual[n].hex()) for n in sorted(actual) if n not in expected]
    return modified, missing, extra


MAX_BUNDLE_BYTES = 16 << 20
"""Largest signature file read; ours are a few KiB (the statement lists one digest per file)."""


def read_bundle_bytes(signature_path: str, limit: int = MAX_BUNDLE_BYTES) -> bytes:
    """The bytes of a signature file, read as untrusted: no link followed, no blocking, size-capped.

    Raises SignatureMissing (absent), SignatureUnreadable (an I/O error), MalformedBundle
    (a symlink, FIFO, device or directory, or over ``limit`` bytes): a FIFO never hangs
    the reader and a huge or sparse file is never read whole.
    """
    try:
        fd = os.open(signature_path, FILE_FLAGS)
    except FileNotFoundError:
        raise SignatureMissing(
            f"{signature_path}: no signature; sign the checkpoint with `warden checkpoint sign` "
            "or pass --signature FILE"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MalformedBundle(f"{signature_path}: is a symlink; a signature must be a regular file") from None
        raise SignatureUnreadable(f"{signature_path}: cannot read the signature: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = refusal_reason(st.st_mode) or ("a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
            raise MalformedBundle(f"{signature_path}: is {kind}; a signature must be a regular file")
        if st.st_size > limit:
            raise MalformedBundle(f"{signature_path}: {st.st_size} bytes, over the {limit}-byte limit for a signature")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SignatureUnreadable(f"{signature_path}: cannot read the signature: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise MalformedBundle(f"{signature_path}: grew over the {limit}-byte limit for a signature while read")
    return data


def load_bundle(signature_path: str | os.PathLike[str]) -> Bundle:
    """Reads and parses a bundle: SignatureMissing / SignatureUnreadable (exit 3), MalformedBundle (exit 1)."""
    return decode_bundle(read_bundle_bytes(os.fspath(signature_path)))


def verified_statement(bundle: Bundle, trusted: TrustedKeys) -> tuple[str, SignedStatement]:
    """(key id, statement) of a bundle whose signature verifies under a trusted key.

    Raises WrongKey, BadSignature, PayloadMismatch, UnsupportedSignature.
    """
    signer = verify_bundle(bundle, trusted)
    if bundle.payload_type != PAYLOAD_TYPE:
        raise PayloadMismatch(f"payloadType is {bundle.payload_type!r}, expected {PAYLOAD_TYPE!r}")
    return signer, parse_statement(bundle.payload)


def read_signed_statement(signature_path: str | os.PathLike[str], trusted: TrustedKeys) -> tuple[str, SignedStatement]:
    """Loads a bundle and returns its verified (key id, statement), without hashing any file.

    For chains: the signer reads the previous checkpoint's root digest and provenance.
    Raises like :func:`load_bundle` and :func:`verified_statement`.
    """
    return verified_statement(load_bundle(signature_path), trusted)


def _check_subject(result: VerifyResult, directory: str, statement: SignedStatement) -> None:
    """Adds subject_mismatch when the signature names another checkpoint."""
    expected = checkpoint_name(directory)
    signed = statement.manifest.name
    if signed != expected:
        result.problems.append(
            Problem(
                SUBJECT_MISMATCH,
                f"{result.signature} is the signature of checkpoint {signed!r}, not of {expected!r}: "
                "a signature was moved or swapped between checkpoints",
            )
        )


def _check_files(
    result: VerifyResult,
    directory: str,
    statement: SignedStatement,
    max_workers: int | None,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> None:
    """Hashes the directory as the statement says and records unsafe entries and differences."""
    ignored = ignore_paths_for(directory, result.signature, statement.manifest.ignore_paths)
    scan = scan_tree(directory, ignored)
    for refusal in scan.refused:
        path = os.path.join(scan.root, refusal.name)
        result.problems.append(Problem(UNSAFE_PATH, f"{path} is {refusal.reason}; a checkpoint holds only files"))
    serialization = statement.manifest.serialization
    if serialization.sharded:
        assert serialization.shard_size is not None
        shards = hash_shards(
            directory, scan.files, serialization.shard_size, max_workers=max_workers, progress=progress, cancel=cancel
        ).shards
        digests = shard_resources(shards)
        found = per_file_shard_digests(shards)
    else:
        digests = hash_files(
            directory,
            scan.files,
            algorithm=serialization.hash_type,
            max_workers=max_workers,
            progress=progress,
            cancel=cancel,
        )
        found = digests
    result.files_checked, result.bytes_checked = len(scan.files), scan.total_bytes
    actual = build_manifest(statement.manifest.name, digests, serialization=serialization)
    result.actual_root_digest = actual.root_digest.hex()
    result.modified, result.missing, result.extra = compare_digests(statement.manifest.file_digests(), found)
    counts = [(len(result.modified), "modified"), (len(result.missing), "missing"), (len(result.extra), "extra")]
    if any(count for count, _ in counts):
        detail = ", ".join(f"{count} {label}" for count, label in counts if count)
        result.problems.append(Problem(FILES_MISMATCH, f"{directory}: files differ from the signature: {detail}"))


def verify_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    trusted: TrustedKeys,
    *,
    signature_path: str | os.PathLike[str] | None = None,
    check_subject: bool = True,
    max_workers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> VerifyResult:
    """Verifies ``checkpoint_dir`` against its bundle (default ``<dir>.sig``) and ``trusted``.

    Returns a VerifyResult (``ok`` or a list of problems with the differing files).
    ``check_subject=False`` accepts a signature whose subject names another directory
    (a renamed copy). Raises SignatureMissing, SignatureUnreadable, UnsupportedSignature,
    CheckpointVanished, CheckpointUnreadable, CheckpointChanged, HashingCancelled.
    """
    directory = os.fspath(checkpoint_dir)
    signature = os.fspath(signature_path) if signature_path is not None else signature_path_for(directory)
    result = VerifyResult(checkpoint=directory, signature=signature)
    try:
        result.key_id, statement = verified_statement(load_bundle(signature), trusted)
    except SignatureRejected as exc:
        result.problems.append(Problem(exc.code, f"{signature}: {exc}"))
        return result
    result.subject_name = statement.manifest.name
    result.signed_root_digest = statement.subject_digest
    result.provenance = statement.provenance
    if check_subject:
        _check_subject(result, directory, statement)
    _check_files(result, directory, statement, max_workers, progress, cancel)
    return result
