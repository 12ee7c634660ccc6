"""Errors of the checkpoint signer, each mapped to an exit code by its Warden base.

Exit codes (DESIGN section 7): 1 violation (the checkpoint or its signature is wrong or
unsafe), 2 configuration (a key file or flag is wrong), 3 incomplete (something could
not be read, or vanished while it was read). Every message names the path it is about
and, where there is one, says what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden.errors import ConfigError, IncompleteError, ViolationError, WardenError

if TYPE_CHECKING:
    from warden.signing.verify import VerifyResult


QUOTE_LIMIT = 200
"""Characters of an untrusted value (from a signature file, an event) quoted in a message."""


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a hostile 2 MiB string never reaches a log."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else text[:limit] + f"...[{len(text) - limit}+ more]"


def clipped(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` itself (no quotes) cut to ``limit`` characters, for untrusted ids in messages."""
    return text if len(text) <= limit else text[:limit] + f"...[{len(text) - limit} more]"


class SignerError(WardenError):
    """Base of every error raised by :mod:`warden.signing` (exit code 3 unless a subclass says)."""


# --- the checkpoint directory -------------------------------------------------------------


class UnsafePathError(SignerError, ViolationError):
    """The checkpoint holds a symlink, device, FIFO, socket or a name that cannot be signed.

    ``paths`` lists every refused entry as ``(path, reason)``; nothing is silently skipped.
    """

    def __init__(self, message: str, paths: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.paths = paths


class CheckpointVanished(SignerError, IncompleteError):
    """A file (or the whole checkpoint) disappeared between listing and reading it.

    Usually a retention policy deleted the checkpoint while it was being hashed; the
    signer sidecar counts these and moves on.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class CheckpointChanged(SignerError, IncompleteError):
    """A file changed size while it was hashed: the checkpoint was still being written."""


class CheckpointUnreadable(SignerError, IncompleteError):
    """A file or directory of the checkpoint could not be read (permissions, I/O error)."""


class HashingCancelled(SignerError, IncompleteError):
    """Hashing stopped because the caller's cancel event was set (e.g. on SIGTERM)."""


class AnnouncementMismatch(SignerError, ViolationError):
    """The bytes on disk do not hash to the root digest (or file count) the trainer announced.

    Nothing is signed. ``reason`` is ``digest_mismatch`` or ``file_count_mismatch``;
    ``expected``/``actual`` are the announced and the computed values.
    """

    def __init__(self, message: str, reason: str, expected: str, actual: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.expected = expected
        self.actual = actual


# --- keys -----------------------------------------------------------------------------------


class KeyFileError(SignerError, ConfigError):
    """A key file is missing, unreadable, not PEM, or not an ECDSA P-256 key."""


class InsecureKeyPermissions(KeyFileError):
    """A private key file is accessible by group or others (it must be mode 0600), is owned
    by another user than the signer's, or lies in a directory others may write to."""


class KeyExistsError(KeyFileError):
    """``keys generate`` would overwrite an existing key; pass ``--force`` to do so."""


# --- signatures -----------------------------------------------------------------------------


class SignatureMissing(SignerError, IncompleteError):
    """There is no signature bundle where one was expected."""


class SignatureUnreadable(SignerError, IncompleteError):
    """The signature bundle exists but could not be read."""


class SignatureWriteError(SignerError, IncompleteError):
    """The signature bundle could not be written (read-only or full file system)."""


class UnsupportedSignature(SignerError, IncompleteError):
    """A validly signed bundle uses a serialization Warden cannot check (e.g. shards, blake2)."""


class VerificationFailed(SignerError, ViolationError):
    """Verification ran to the end and found problems; ``result`` holds the details."""

    def __init__(self, message: str, result: VerifyResult) -> None:
        super().__init__(message)
        self.result = result


# --- reasons a signature is rejected (each is a ``code`` in a verification result) -----------


class SignatureRejected(SignerError, ViolationError):
    """The bundle cannot vouch for the checkpoint; ``code`` names the reason for reports."""

    code = "rejected"


class MalformedBundle(SignatureRejected):
    """The signature file is not a Sigstore bundle v0.3 holding one DSSE envelope."""

    code = "malformed_bundle"


class WrongKey(SignatureRejected):
    """The bundle names (by key hint) a key that is not among the trusted keys."""

    code = "wrong_key"


class BadSignature(SignatureRejected):
    """The DSSE signature does not verify: the payload or signature was altered after signing."""

    code = "bad_signature"


class PayloadMismatch(SignatureRejected):
    """The signed payload is not a consistent model_signing v1.0 in-toto Statement."""

    code = "payload_mismatch"
