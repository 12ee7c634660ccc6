"""The ``warden_signer_*`` metric families (DESIGN section 8).

Label values are bounded: ``layout`` is one of :data:`warden.signer.policy.LAYOUTS`,
``operation`` is ``sign`` or ``verify``, ``kind`` is the snake-case name of a signer
error class, ``reason`` a verification problem code. No path or step is ever a label.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warden.signer.announcements import REFUSAL_REASONS, SIGNATURE_MISSING, VIOLATION_REASONS
from warden.signer.policy import LAYOUTS
from warden.signer.resumes import CHECKPOINT_MISSING, RESULTS
from warden.signing.verify import FILES_MISMATCH, SUBJECT_MISMATCH, UNSAFE_PATH

OPERATIONS = ("sign", "verify")
ERROR_KINDS = (
    "checkpoint_vanished",
    "checkpoint_changed",
    "checkpoint_unreadable",
    "unsafe_path_error",
    "signature_write_error",
    "signature_missing",
    "unsupported_signature",
)
VERIFY_REASONS = (
    "malformed_bundle",
    "wrong_key",
    "bad_signature",
    "payload_mismatch",
    SUBJECT_MISMATCH,
    UNSAFE_PATH,
    FILES_MISMATCH,
    SIGNATURE_MISSING,
    CHECKPOINT_MISSING,
)
HASH_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class SignerMetrics:
    """Registers the signer's families on ``registry``; every labelled series starts at 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.signed = Counter("warden_signer_signed", "Checkpoints signed, by layout.", ["layout"], registry=registry)
        self.verifications = Counter(
            "warden_signer_verifications",
            "Re-verifications of signed checkpoints (periodic, and of the checkpoint a run.resumed names), "
            "by result (ok, failed, incomplete).",
            ["result"],
            registry=registry,
        )
        self.verify_failures = Counter(
            "warden_signer_verify_failures",
            "Re-verifications that found a signed checkpoint altered or its signature invalid (first problem code; "
            "checkpoint_missing: a resumed checkpoint gone without a checkpoint.pruned).",
            ["reason"],
            registry=registry,
        )
        self.invalid = Gauge(
            "warden_signer_invalid_checkpoints",
            "Signed checkpoints (and checkpoints a run resumed from) whose last re-verification failed.",
            registry=registry,
        )
        self.hashed_bytes = Counter(
            "warden_signer_hashed_bytes",
            "Bytes read and hashed, by operation (sign, verify); grows while a hash runs.",
            ["operation"],
            registry=registry,
        )
        self.hash_seconds = Histogram(
            "warden_signer_hash_duration_seconds",
            "Wall time of one complete checkpoint hash (sign or verify).",
            ["operation"],
            buckets=HASH_SECONDS_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "warden_signer_errors",
            "Checkpoints that could not be signed or verified, by kind (checkpoint_vanished: deleted while hashed).",
            ["kind"],
            registry=registry,
        )
        self.unsigned_age = Gauge(
            "warden_signer_unsigned_checkpoint_age_seconds",
            "Seconds since the newest complete but unsigned checkpoint last changed; 0 when all are signed.",
            registry=registry,
        )
        self.unsigned = Gauge(
            "warden_signer_unsigned_checkpoints",
            "Complete checkpoints (stable or not yet) without a signature.",
            registry=registry,
        )
        self.last_signed = Gauge(
            "warden_signer_last_signed_timestamp_seconds",
            "Unix time of the last signature written.",
            registry=registry,
        )
        self.last_reverify = Gauge(
            "warden_signer_last_reverify_timestamp_seconds",
            "Unix time the last full re-verification round finished.",
            registry=registry,
        )
        self.watchdog = Gauge(
            "warden_signer_watchdog_active",
            "1 when inotify (watchdog) watches every existing root; polling covers the rest.",
            registry=registry,
        )
        self.refused = Counter(
            "warden_signer_refused",
            "checkpoint.saved events whose checkpoint was not signed: the bytes on disk do not hash to the "
            "announced root digest or file count, or no digest was announced for the run's own root.",
            ["reason"],
            registry=registry,
        )
        self.violations = Counter(
            "warden_signer_violations",
            "Checkpoints found in a state the signer must not sign (counted once per checkpoint and reason): "
            "unannounced, signature_missing, signature_replaced, unsafe_path (a checkpoint name that is a symlink "
            "or not a directory, in any root), or a refusal.",
            ["reason"],
            registry=registry,
        )
        self.violating = Gauge(
            "warden_signer_violating_checkpoints",
            "Checkpoints in violation now, by reason (see warden_signer_violations_total): the run's own root, "
            "and unsafe_path in every root.",
            ["reason"],
            registry=registry,
        )
        self.pruned = Counter(
            "warden_signer_pruned",
            "Signed checkpoints found pruned by the trainer's retention, not tampered with (verl: actor/ and "
            "critic/ removed as a whole, the rest unchanged); counted once per checkpoint, no longer verified.",
            ["layout"],
            registry=registry,
        )
        self.resumed_checks = Counter(
            "warden_signer_resumed_checks",
            "run.resumed events, by what verifying the checkpoint the run went on from found: ok, failed (counted "
            "in warden_signer_invalid_checkpoints too), pruned (retired since), incomplete, refused (a path the "
            "signer does not check), unnamed (no checkpoint known).",
            ["result"],
            registry=registry,
        )
        self.violating_reasons = VIOLATION_REASONS
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason)
        for reason in VIOLATION_REASONS:
            self.violations.labels(reason)
            self.violating.labels(reason)
        for layout in LAYOUTS:
            self.signed.labels(layout)
            self.pruned.labels(layout)
        for operation in OPERATIONS:
            self.hashed_bytes.labels(operation)
            self.hash_seconds.labels(operation)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        for reason in VERIFY_REASONS:
            self.verify_failures.labels(reason)
        for result in ("ok", "failed", "incomplete"):
            self.verifications.labels(result)
        for result in RESULTS:
            self.resumed_checks.labels(result)

    def progress(self, operation: str) -> ByteProgress:
        """A progress callback for the hashing layer that feeds ``hashed_bytes`` as it goes."""
        return ByteProgress(self.hashed_bytes.labels(operation))


class ByteProgress:
    """``progress(done, total)`` -> increments a counter by the bytes since the last call."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._last = 0
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            delta, self._last = done - self._last, done
        if delta > 0:
            self._counter.inc(delta)
