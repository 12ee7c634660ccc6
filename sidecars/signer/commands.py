"""Click groups ``keys`` and ``checkpoint``, mounted by the ``warden`` root CLI.

The commands raise :class:`warden.errors.WardenError` subclasses and leave printing the
message and choosing the exit code to the root (0 valid, 1 invalid, 2 bad key or flag,
3 something could not be read). Every option has an environment variable
``WARDEN_<OPTION>``. Reports go to stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import click

from warden.cliutil import echo, trust_option
from warden.errors import WardenError
from warden.signer.policy import SHARD_SIZE
from warden.signing.dsse import sign_checkpoint
from warden.signing.keys import generate_keypair, load_private_key, load_trusted_keys
from warden.signing.manifest import SERIALIZATION_METHOD, SHARDS_METHOD, Provenance, Serialization
from warden.signing.verify import verify_checkpoint

PROGRESS_THRESHOLD_BYTES = 1 << 30
_FORMAT = click.Choice(["text", "json"])
# Options that sign and verify share.
workers_option = click.option(
    "--workers",
    type=click.IntRange(min=1),
    envvar="WARDEN_WORKERS",
    show_envvar=True,
    help="Hashing threads (default: cores).",
)
format_option = click.option(
    "--format", "fmt", type=_FORMAT, default="text", envvar="WARDEN_FORMAT", show_envvar=True, help="Output format."
)


class _Progress:
    """Progress bar on stderr for checkpoints over 1 GiB, when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_THRESHOLD_BYTES or not sys.stderr.isatty():
            return
        now = time.monotonic()
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        if done >= total or now - self.last >= 0.2:
            self.last = now
            self.bar.update(done - self.bar.pos)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _parent_digest(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Validates ``--parent-digest`` as 64 lowercase hex characters."""
    if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
        raise click.BadParameter("expected the parent checkpoint's root digest: 64 lowercase hex characters")
    return value


def _emit(fmt: str, text: str, document: dict[str, Any]) -> None:
    """Prints ``text`` or ``document`` as JSON, per ``--format``."""
    echo(json.dumps(document, indent=2) if fmt == "json" else text)


@click.group("keys")
def keys_group() -> None:
    """Create signing keys (ECDSA P-256) for checkpoint and snapshot signatures."""


@keys_group.command("generate")
@click.option(
    "--out",
    "out_dir",
    required=True,
    envvar="WARDEN_OUT",
    show_envvar=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Directory to write signing.key (PKCS#8 PEM, mode 0600) and signing.pub into; created if missing.",
)
@click.option(
    "--force", is_flag=True, envvar="WARDEN_FORCE", show_envvar=True, help="Replace an existing key pair in DIR."
)
def generate_command(out_dir: str, force: bool) -> None:
    """Generate a signing key pair.

    The private key never leaves DIR; copy signing.pub into policies/keys/ (any NAME.pub)
    so that verifiers trust it. Prints the key id: the hex SHA-256 of the public key PEM,
    the `hint` in every bundle signed with it.
    """
    files = generate_keypair(out_dir, force=force)
    echo(f"wrote {files.private_key} (private, mode 0600) and {files.public_key}")
    echo(f"key id {files.key_id}")


@click.group("checkpoint")
def checkpoint_group() -> None:
    """Sign and verify checkpoint directories (Sigstore bundle beside the directory)."""


@checkpoint_group.command("sign")
@click.argument("path", type=click.Path(file_okay=False))
@click.option(
    "--key",
    "key_path",
    required=True,
    envvar=["WARDEN_SIGNING_KEY", "WARDEN_KEY"],  # the sidecars' variable first; WARDEN_KEY still works
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="Private key (PEM, mode 0600) from `warden keys generate`.",
)
@click.option(
    "--run-id",
    envvar="WARDEN_RUN_ID",
    show_envvar=True,
    help="Run id recorded in the signature (predicate.warden.run_id).",
)
@click.option(
    "--step", type=int, envvar="WARDEN_STEP", show_envvar=True, help="Training step recorded in the signature."
)
@click.option(
    "--parent-digest",
    envvar="WARDEN_PARENT_DIGEST",
    show_envvar=True,
    callback=_parent_digest,
    metavar="HEX",
    help="Root digest (hex) of the previous checkpoint of the run, chaining the signatures.",
)
@click.option(
    "--trainer-version",
    envvar="WARDEN_TRAINER_VERSION",
    show_envvar=True,
    help="Trainer version recorded in the signature.",
)
@click.option(
    "--signature",
    "signature_path",
    envvar="WARDEN_SIGNATURE",
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="Where to write the bundle. Default: PATH with .sig appended, beside the directory.",
)
@click.option(
    "--serialization",
    type=click.Choice([SERIALIZATION_METHOD, SHARDS_METHOD]),
    default=SERIALIZATION_METHOD,
    show_default=True,
    envvar="WARDEN_SERIALIZATION",
    show_envvar=True,
    help="files: one digest per file (every model_signing verifies it); shards: one per --shard-size piece, "
    "hashed in parallel (model_signing's API verifies it, its 1.1.1 CLI does not).",
)
@click.option(
    "--shard-size",
    type=click.IntRange(min=1 << 20),
    default=SHARD_SIZE,
    show_default=True,
    envvar="WARDEN_SHARD_SIZE",
    show_envvar=True,
    help="Bytes per shard with --serialization shards.",
)
@click.option(
    "--hash",
    "hash_algorithm",
    type=click.Choice(["sha256", "blake3"]),
    default="sha256",
    show_default=True,
    envvar="WARDEN_HASH",
    show_envvar=True,
    help="File hash with --serialization files (blake3: model_signing's API verifies it, its 1.1.1 CLI does not).",
)
@workers_option
@format_option
def sign_command(
    path: str,
    key_path: str,
    run_id: str | None,
    step: int | None,
    parent_digest: str | None,
    trainer_version: str | None,
    signature_path: str | None,
    serialization: str,
    shard_size: int,
    hash_algorithm: str,
    workers: int | None,
    fmt: str,
) -> None:
    """Hash every file of the checkpoint directory PATH and sign it.

    Writes a Sigstore bundle (DSSE, in-toto Statement, model_signing `files` format) to
    PATH.sig atomically; `model_signing verify key` accepts it too. Refuses symlinks and
    special files inside PATH (exit 1) and a key readable by group or others (exit 2).
    """
    if serialization == SHARDS_METHOD and hash_algorithm != "sha256":
        raise click.UsageError("--serialization shards hashes with sha256 (model_signing's shards); drop --hash")
    method = Serialization(serialization, hash_algorithm, shard_size if serialization == SHARDS_METHOD else None)
    key = load_private_key(key_path)
    provenance = Provenance(run_id=run_id, step=step, trainer_version=trainer_version, parent_root_digest=parent_digest)
    progress = _Progress("hashing " + path)
    try:
        result = sign_checkpoint(
            path,
            key,
            provenance,
            signature_path=signature_path,
            max_workers=workers,
            progress=progress,
            serialization=method,
        )
    finally:
        progress.close()
    document = {
        "checkpoint": path,
        "signature": result.signature_path,
        "root_digest": result.root_digest,
        "key_id": result.key_id,
        "files": result.manifest.file_count,
        "serialization": result.manifest.serialization.method,
        "bytes": result.total_bytes,
        "provenance": provenance.to_dict(),
    }
    text = (
        f"signed {path}: {document['files']} files, {result.total_bytes} bytes, root sha256:{result.root_digest}\n"
        f"  key {result.key_id} -> {result.signature_path}"
    )
    _emit(fmt, text, document)


@checkpoint_group.command("verify")
@click.argument("path", type=click.Path(file_okay=False))
@click.option(
    "--signature",
    "signature_path",
    envvar="WARDEN_SIGNATURE",
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="Bundle to check. Default: PATH with .sig appended. Bundles from `model_signing sign key` work too.",
)
@trust_option()
@click.option(
    "--ignore-subject",
    is_flag=True,
    envvar="WARDEN_IGNORE_SUBJECT",
    show_envvar=True,
    help="Accept a signature made for a directory of another name (a renamed copy).",
)
@workers_option
@format_option
def verify_command(
    path: str, signature_path: str | None, trust: str, ignore_subject: bool, workers: int | None, fmt: str
) -> None:
    """Verify the checkpoint directory PATH against its signature.

    Exit 0: signed by a trusted key and every file matches. Exit 1: the report names each
    modified, missing or extra file with its hex SHA-256, or why the signature is
    rejected (untrusted key, bad signature, altered payload, signature of another
    checkpoint, symlink inside). Exit 2: bad trust keys. Exit 3: something unreadable.
    """
    trusted = load_trusted_keys(trust)
    progress = _Progress("verifying " + path)
    try:
        result = verify_checkpoint(
            path,
            trusted,
            signature_path=signature_path,
            check_subject=not ignore_subject,
            max_workers=workers,
            progress=progress,
        )
    except WardenError as exc:
        if fmt == "json":
            error = {"kind": type(exc).__name__, "exit_code": exc.exit_code, "message": str(exc)}
            echo(json.dumps({"ok": False, "checkpoint": path, "error": error}))
        raise
    finally:
        progress.close()
    _emit(fmt, result.report(), result.to_dict())
    result.raise_for_problems()
