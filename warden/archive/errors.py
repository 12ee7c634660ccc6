"""Errors of the archiver and of ``warden audit``, each mapped to an exit code by its Warden base.

Exit codes (docs/design.md section 7): 1 a violation (a conflict in the store, a broken chain, a
record that does not verify), 2 configuration (store URL, policy, Object Lock missing),
3 incomplete (store unreachable, step not found). Messages name the run, step or key.
"""

from __future__ import annotations

from warden.errors import ConfigError, IncompleteError, ViolationError, WardenError


class ArchiverError(WardenError):
    """Base of every error raised by :mod:`warden.archive` (exit code 3 unless a subclass says),
    but for :class:`warden.errors.TryAgainLater`, which the sidecar turns into RetryLater."""


# --- the store ---------------------------------------------------------------------------


class StoreError(ArchiverError):
    """Base of the errors of a :class:`~warden.archive.store.Store`.

    ``kind`` is a bounded label value for ``warden_archiver_store_errors_total{kind}``.
    """

    kind = "other"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class StoreUnavailable(StoreError, IncompleteError):
    """The store could not be reached or answered with an error worth retrying (5xx, throttling)."""

    kind = "unavailable"


class StoreAccessDenied(StoreError, IncompleteError):
    """The store refused the credentials or the request (403); the IAM policy may be wrong."""

    kind = "access_denied"


class StoreConfigError(StoreError, ConfigError):
    """The store URL or its settings are wrong (unknown scheme, missing bucket, bad option)."""

    kind = "config"


class StoreConflict(StoreError, ViolationError):
    """A key already holds different bytes than the ones being written: never overwritten."""

    kind = "conflict"

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class ObjectRefused(StoreError, ViolationError):
    """An object that is not read at all: not a regular file (a symlink, a FIFO, a directory...)
    in a ``file://`` store, or larger than the reader's cap. Only someone writing to the store
    by hand puts such a thing there, so it is a violation (reported as ``malformed``)."""

    kind = "refused"

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class ObjectLockMissing(StoreError, ConfigError):
    """The policy requires Object Lock and the bucket was not created with it."""

    kind = "object_lock_missing"


# --- records and events ------------------------------------------------------------------


class BadSnapshotEvent(ArchiverError, IncompleteError):
    """A ``reward.snapshot`` event cannot be archived at all (no step, unusable run id)."""


class RecordInvalid(ArchiverError, ViolationError):
    """A stored record or head does not verify; ``code`` names why for reports.

    Codes: ``altered`` (signature or content does not verify), ``wrong_key`` (signed by
    an untrusted key), ``malformed`` (not a bundle of the expected statement).
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ChainRecoveryError(ArchiverError, ViolationError):
    """The store holds a chain for the run that this archiver cannot verify and extend."""


# --- audit -----------------------------------------------------------------------------------


class StepNotFound(ArchiverError, IncompleteError):
    """No record for the step; ``nearby`` lists the archived steps around it."""

    def __init__(self, message: str, nearby: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.nearby = nearby


class ChainBroken(ArchiverError, ViolationError):
    """Verification found a break: a missing, reordered, altered or wrongly signed record."""
