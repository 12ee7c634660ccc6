"""Manifest layer: file digests -> model_signing ``files`` manifest -> in-toto Statement v1.

Pure functions, no I/O. The format is exactly what ``model_signing`` 1.1.1 writes for
``sign key`` with the ``files`` serialization, so either tool verifies the other's output:

- resources ``{"name", "algorithm": "sha256", "digest": hex}``, one per file, sorted by
  path components (``a/b/x`` sorts before ``a.b``: ``("a", "b", "x") < ("a.b",)``);
- the subject is ``{"name": <directory basename>, "digest": {"sha256": root}}`` where the
  root is SHA-256 over the concatenated raw file digests in resource order;
- ``predicate.serialization`` is ``{"method": "files", "hash_type": "sha256",
  "allow_symlinks": false, "ignore_paths": [...]}`` (``ignore_paths`` omitted when empty).

The ``shards`` serialization (model_signing's ``use_shard_serialization``) has one resource
per ``shard_size`` piece of each file, ``{"name": "path:start:end", "algorithm":
"sha256-sharded-<shard_size>"}``, sorted by (path components, start, end), and
``"shard_size": <int>`` in the serialization; empty files have no resource. ``files`` with
``hash_type: blake3`` (``"algorithm": "blake3"``) is accepted too; the root stays SHA-256.

Warden's own fields (run id, step, trainer version, parent checkpoint's root digest) go
in one extra predicate object, ``predicate.warden``. model_signing documents that v1.0
verifiers ignore predicate fields other than ``serialization`` and ``resources``, reads
only those two (``model_signing/_signing/signing.py``), and the interop tests check that
``model_signing verify key`` accepts our bundles with the extra object present.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from warden.signing.errors import PayloadMismatch, UnsupportedSignature, quoted
from warden.signing.hashing import hash_tree, is_ignored, normalize_ignore_path

HASH_ALGORITHM = "sha256"
"""The subject (root) digest is always SHA-256, whatever hashes the files."""
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
SERIALIZATION_METHOD = "files"
SHARDS_METHOD = "shards"
DEFAULT_SHARD_SIZE = 1_000_000_000
"""model_signing's default shard size (1 GB)."""
WARDEN_PREDICATE_KEY = "warden"
DEFAULT_IGNORE_PATHS: tuple[str, ...] = (".git", ".gitattributes", ".github", ".gitignore")
"""What ``model_signing sign key`` ignores by default (``--ignore-git-paths``); we match it
so that its verifier, which ignores them too, computes the same manifest."""

_HEX64 = re.compile(r"[0-9a-f]{64}")


def parse_json(data: bytes, error: type[Exception], what: str) -> Any:
    """``json.loads`` of untrusted bytes; every parse failure becomes ``error`` with a short message.

    Deep nesting (RecursionError), numbers over the int-digit limit (ValueError), invalid
    UTF-8 and any other decode failure are all reported the same way, never as a traceback.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise error(f"{what} is not JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError and the int-digit limit
        raise error(f"{what} is not JSON: {str(exc)[:200]}") from None


def sort_key(name: str) -> tuple[str, ...]:
    """Resource order of model_signing: by POSIX path components, not by raw string."""
    return PurePosixPath(name).parts


def root_digest(digests: Iterable[bytes]) -> bytes:
    """SHA-256 over the concatenation of raw digests, in the order given."""
    hasher = hashlib.sha256()
    for digest in digests:
        hasher.update(digest)
    return hasher.digest()


@dataclass(frozen=True)
class Serialization:
    """How the files were turned into resources (``predicate.serialization``).

    ``files``: one resource per file, named by its path, digest ``hash_type`` of the file.
    ``shards``: one resource per ``shard_size`` piece of each file, named ``path:start:end``,
    algorithm ``sha256-sharded-<shard_size>`` (model_signing's names); empty files have none.
    """

    method: str = SERIALIZATION_METHOD
    hash_type: str = HASH_ALGORITHM
    shard_size: int | None = None

    def __post_init__(self) -> None:
        if self.method == SERIALIZATION_METHOD:
            if self.hash_type not in ("sha256", "blake3") or self.shard_size is not None:
                raise ValueError(f"serialization files: hash sha256 or blake3 and no shard size, got {self}")
        elif self.method == SHARDS_METHOD:
            if self.hash_type != "sha256" or self.shard_size is None or self.shard_size <= 0:
                raise ValueError(
                    "serialization shards: sha256 with a shard size > 0 (model_signing hashes blake3 "
                    "by files, in parallel within each file)"
                )
        else:
            raise ValueError(f"serialization method {self.method!r}: expected files or shards")

    @property
    def sharded(self) -> bool:
        """True for the ``shards`` method."""
        return self.method == SHARDS_METHOD

    @property
    def resource_algorithm(self) -> str:
        """The ``algorithm`` of each resource, as model_signing names it."""
        return f"{self.hash_type}-sharded-{self.shard_size}" if self.sharded else self.hash_type


FILES_SHA256 = Serialization()


def shard_name(path: str, start: int, end: int) -> str:
    """The resource name of a shard, model_signing's ``path:start:end``."""
    return f"{path}:{start}:{end}"


def split_shard_name(name: str) -> tuple[str, int, int]:
    """``"a/b:0:10"`` -> ``("a/b", 0, 10)``; ValueError unless it has exactly two ``:`` and offsets
    ``0 <= start < end`` (model_signing's parser splits on every ``:``, so a path cannot hold one)."""
    parts = name.split(":")
    if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts[1:]):
        raise ValueError(f"{name!r} is not a shard name path:start:end")
    start, end = int(parts[1]), int(parts[2])
    if start >= end:
        raise ValueError(f"{name!r}: the shard is empty or reversed")
    return parts[0], start, end


def resource_sort_key(name: str, sharded: bool = False) -> tuple[Any, ...]:
    """Resource order of model_signing: path components, then (shards) start and end offsets."""
    if not sharded:
        return sort_key(name)
    path, start, end = name.rsplit(":", 2)  # names from disk may hold ':' (then they are extra)
    return (PurePosixPath(path).parts, int(start), int(end))


def shard_resources(shards: Mapping[tuple[str, int, int], bytes]) -> dict[str, bytes]:
    """``{(path, start, end): digest}`` -> ``{"path:start:end": digest}``."""
    return {shard_name(*key): digest for key, digest in shards.items()}


def names_digest(resource_names: Iterable[str], file_names: Iterable[str]) -> str:
    """SHA-256 over the resource names in manifest order and every file's name (empty files too).

    model_signing's root digest covers the resources' digests only, in name order: a file renamed
    within that order, a file split at a shard boundary or an empty file added leaves it unchanged.
    An announcement carries this digest too, so what is signed is bound to the names the trainer
    wrote as well as to their bytes."""
    hasher = hashlib.sha256(b"warden-names-v1\0")
    for name in resource_names:
        hasher.update(name.encode("utf-8", "surrogateescape") + b"\0")
    hasher.update(b"\1")
    for name in sorted(file_names, key=sort_key):
        hasher.update(name.encode("utf-8", "surrogateescape") + b"\0")
    return hasher.hexdigest()


def files_root(digests: Mapping[str, bytes]) -> Announced:
    """The announcement form (``files``/sha256 root, file count and names) of ``{name: raw sha256}``."""
    names = sorted(digests, key=sort_key)
    return Announced(root_digest(digests[n] for n in names).hex(), len(names), None, names_digest(names, names))


@dataclass(frozen=True)
class Announced:
    """What a trainer announces with ``checkpoint.saved``: the manifest root digest (hex) and its
    resource count, in the ``files``/sha256 serialization (``shard_size`` None: one resource per file)
    or in the ``shards`` serialization with that shard size (one resource per shard)."""

    root_digest: str
    file_count: int
    shard_size: int | None = None
    names_digest: str | None = None
    """:func:`names_digest` of the resources and files; None from producers that predate it."""

    @property
    def serialization(self) -> Serialization:
        if self.shard_size is None:
            return FILES_SHA256
        return Serialization(SHARDS_METHOD, "sha256", self.shard_size)


def shards_root(
    shard_digests: Mapping[tuple[str, int, int], bytes], shard_size: int, file_names: Iterable[str]
) -> Announced:
    """The announcement in the ``shards`` serialization of ``{(path, start, end): raw sha256}``: the
    root digest :func:`build_manifest` gives those resources, their count, and the names digest over
    them and ``file_names`` (every file, empty ones included: they have no shard)."""
    resources = shard_resources(shard_digests)
    names = sorted(resources, key=lambda n: resource_sort_key(n, True))
    root = root_digest(resources[n] for n in names).hex()
    return Announced(root, len(names), shard_size, names_digest(names, file_names))


def announced_root(hex_digests: Mapping[str, str], ignore_paths: Iterable[str] = DEFAULT_IGNORE_PATHS) -> Announced:
    """The root digest :func:`warden.signing.dsse.sign_checkpoint` would sign, from ``{relpath: sha256 hex}``.

    ``hex_digests`` must list every regular file of the checkpoint (POSIX relative names,
    e.g. from the trainer's own manifest plus the manifest file itself). Paths under
    ``ignore_paths`` (model_signing's git defaults) are left out as the signer leaves them
    out; the order is model_signing's (:func:`sort_key`). Raises ValueError on a digest
    that is not 64 hex digits.
    """
    ignored = [normalize_ignore_path(p) for p in ignore_paths]
    kept = {name: digest for name, digest in hex_digests.items() if not is_ignored(name, ignored)}
    for name, digest in kept.items():
        if not _HEX64.fullmatch(digest):
            raise ValueError(f"{name}: not a sha256 hex digest")
    return files_root({name: bytes.fromhex(digest) for name, digest in kept.items()})


def announce_tree(
    path: str | os.PathLike[str],
    ignore_paths: Iterable[str] = DEFAULT_IGNORE_PATHS,
    *,
    max_workers: int | None = None,
    cancel: threading.Event | None = None,
) -> Announced:
    """Hashes the directory ``path`` as :func:`warden.signing.dsse.sign_checkpoint` will and
    returns the root digest and file count to announce in ``checkpoint.saved``.

    For trainer-side processes that have no manifest of their own (the HF callback, the verl
    bridge). Raises like :func:`warden.signing.hashing.hash_tree` (UnsafePathError for a
    symlink or special file inside, CheckpointVanished, CheckpointChanged, ...).
    """
    digests = hash_tree(path, ignore_paths, max_workers=max_workers, cancel=cancel)
    return announced_root({name: digest.hex() for name, digest in digests.items()}, ignore_paths)


@dataclass(frozen=True)
class Resource:
    """One file of the manifest: relative POSIX name and raw SHA-256."""

    name: str
    digest: bytes

    @property
    def hex(self) -> str:
        """The digest as lowercase hex."""
        return self.digest.hex()


@dataclass(frozen=True)
class Manifest:
    """The signed content of a checkpoint: its name, files in canonical order, ignored paths."""

    name: str
    resources: tuple[Resource, ...]
    ignore_paths: tuple[str, ...] = ()
    serialization: Serialization = FILES_SHA256

    @property
    def root_digest(self) -> bytes:
        """The subject digest of this manifest (raw bytes)."""
        return root_digest(r.digest for r in self.resources)

    def digests(self) -> dict[str, bytes]:
        """``{resource name: raw digest}`` (shard names ``path:start:end`` in shard mode)."""
        return {r.name: r.digest for r in self.resources}

    def file_digests(self) -> dict[str, bytes]:
        """``{file name: raw digest}``: the resources in ``files`` mode; in ``shards`` mode one
        SHA-256 per file over its shards' ``start:end:digest`` in order (for naming changed files)."""
        if not self.serialization.sharded:
            return self.digests()
        return per_file_shard_digests({split_shard_name(r.name): r.digest for r in self.resources})

    @property
    def file_count(self) -> int:
        """Files listed (in shard mode: files with at least one byte)."""
        return len(self.file_digests())


def per_file_shard_digests(shards: Mapping[tuple[str, int, int], bytes]) -> dict[str, bytes]:
    """``{(path, start, end): digest}`` -> ``{path: sha256 over its shards' start:end:digest}``.

    Two files get the same value exactly when they have the same shards with the same digests,
    so comparing these names every file whose content or size changed.
    """
    grouped: dict[str, list[tuple[int, int, bytes]]] = {}
    for (path, start, end), digest in shards.items():
        grouped.setdefault(path, []).append((start, end, digest))
    out = {}
    for path, pieces in grouped.items():
        hasher = hashlib.sha256()
        for start, end, digest in sorted(pieces):
            hasher.update(b"%d:%d:" % (start, end) + digest)
        out[path] = hasher.digest()
    return out


def build_manifest(
    name: str,
    digests: Mapping[str, bytes],
    ignore_paths: Iterable[str] = (),
    serialization: Serialization = FILES_SHA256,
) -> Manifest:
    """Builds the manifest of directory ``name`` from ``{resource name: raw digest}`` (file names,
    or shard names from :func:`shard_resources` for the ``shards`` serialization)."""
    names = sorted(digests, key=lambda n: resource_sort_key(n, serialization.sharded))
    ignored = tuple(sorted({normalize_ignore_path(p) for p in ignore_paths}))
    return Manifest(name, tuple(Resource(n, digests[n]) for n in names), ignored, serialization)


@dataclass(frozen=True)
class Provenance:
    """Warden's fields in ``predicate.warden``; all optional, unknown keys kept in ``other``.

    ``parent_root_digest`` is the hex root digest of the previous checkpoint of the run,
    so the signatures of a run form a chain. ``files_root_digest``: in ``shards`` mode, the
    ``files``/sha256 root the signer computed from the same read and found equal to the trainer's
    announcement (the announcement stays per-file; the signed subject is the shard root).
    """

    run_id: str | None = None
    step: int | None = None
    trainer_version: str | None = None
    parent_root_digest: str | None = None
    files_root_digest: str | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to the predicate; None fields are left out."""
        known = {
            "run_id": self.run_id,
            "step": self.step,
            "trainer_version": self.trainer_version,
            "parent_root_digest": self.parent_root_digest,
            "files_root_digest": self.files_root_digest,
        }
        return {**dict(self.other), **{k: v for k, v in known.items() if v is not None}}

    @classmethod
    def from_dict(cls, raw: Any) -> Provenance:
        """Parses ``predicate.warden``; raises PayloadMismatch on a wrongly typed field."""
        if not isinstance(raw, dict):
            raise PayloadMismatch(f"predicate.{WARDEN_PREDICATE_KEY} must be an object, got {type(raw).__name__}")
        for key in ("run_id", "trainer_version", "parent_root_digest", "files_root_digest"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                raise PayloadMismatch(f"predicate.{WARDEN_PREDICATE_KEY}.{key} must be a string")
        step = raw.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise PayloadMismatch(f"predicate.{WARDEN_PREDICATE_KEY}.step must be an integer")
        known = {"run_id", "step", "trainer_version", "parent_root_digest", "files_root_digest"}
        return cls(
            run_id=raw.get("run_id"),
            step=step,
            trainer_version=raw.get("trainer_version"),
            parent_root_digest=raw.get("parent_root_digest"),
            files_root_digest=raw.get("files_root_digest"),
            other={k: v for k, v in raw.items() if k not in known},
        )

    def is_empty(self) -> bool:
        """True when there is nothing to write."""
        return not self.to_dict()


def serialization_params(manifest: Manifest) -> dict[str, Any]:
    """``predicate.serialization`` as model_signing 1.1.1 writes it (``shard_size`` as an integer:
    model_signing itself writes a float there, which its own verifier then rejects)."""
    method = manifest.serialization
    params: dict[str, Any] = {"method": method.method, "hash_type": method.hash_type}
    if method.sharded:
        params["shard_size"] = method.shard_size
    params["allow_symlinks"] = False
    if manifest.ignore_paths:
        params["ignore_paths"] = list(manifest.ignore_paths)
    return params


def build_statement(manifest: Manifest, provenance: Provenance | None = None) -> dict[str, Any]:
    """The in-toto Statement v1 (as a JSON-ready dict) that is signed for ``manifest``."""
    predicate: dict[str, Any] = {
        "serialization": serialization_params(manifest),
        "resources": [
            {"name": r.name, "algorithm": manifest.serialization.resource_algorithm, "digest": r.hex}
            for r in manifest.resources
        ],
    }
    if provenance is not None and not provenance.is_empty():
        predicate[WARDEN_PREDICATE_KEY] = provenance.to_dict()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": manifest.name, "digest": {HASH_ALGORITHM: manifest.root_digest.hex()}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def encode_statement(statement: Mapping[str, Any]) -> bytes:
    """The DSSE payload bytes: UTF-8 JSON, indented like model_signing's."""
    return json.dumps(statement, indent=2, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class SignedStatement:
    """A parsed, self-consistent Statement: its manifest, subject digest and Warden fields."""

    manifest: Manifest
    subject_digest: str
    provenance: Provenance


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    """``obj[key]`` checked to be of ``kind``; raises PayloadMismatch naming ``where.key``."""
    if not isinstance(obj, dict) or key not in obj:
        raise PayloadMismatch(f"the signed statement has no {where}{key}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PayloadMismatch(f"{where}{key} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _check_name(name: str) -> str:
    """A resource name must be a normalized relative POSIX path inside the checkpoint."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or str(pure) != name:
        raise PayloadMismatch(f"resource name {quoted(name)} is not a normalized path inside the checkpoint")
    return name


def _parse_method(raw: Any) -> Serialization:
    """The serialization method of ``predicate.serialization``; UnsupportedSignature for one
    Warden cannot check (its hashes are still model_signing's to verify)."""
    where = "predicate.serialization."
    method = _field(raw, "method", str, where)
    hash_type = _field(raw, "hash_type", str, where)
    size = raw.get("shard_size")
    if isinstance(size, float) and size.is_integer():  # model_signing 1.1.1 writes 1000000000.0
        size = int(size)
    try:
        if isinstance(size, bool) or not isinstance(size, int | None):
            raise ValueError("shard_size is not an integer")
        return Serialization(method, hash_type, size if method == SHARDS_METHOD else None)
    except ValueError as exc:
        raise UnsupportedSignature(
            f"the signature uses serialization method {quoted(method)} with {quoted(hash_type)} "
            f"(shard_size {quoted(size)}); Warden checks files with sha256 or blake3 and shards with sha256 "
            f"and a positive integer shard_size ({exc}; re-sign with `warden checkpoint sign` or verify "
            "with `model_signing verify`)"
        ) from None


def _parse_serialization(raw: Any) -> tuple[Serialization, tuple[str, ...]]:
    """Checks ``predicate.serialization``; returns its method and ignore paths (normalized)."""
    where = "predicate.serialization."
    method = _parse_method(raw)
    _field(raw, "allow_symlinks", bool, where)
    ignored = raw.get("ignore_paths", [])
    if not isinstance(ignored, list) or not all(isinstance(p, str) for p in ignored):
        raise PayloadMismatch(f"{where}ignore_paths must be a list of strings")
    try:
        return method, tuple(sorted({normalize_ignore_path(p) for p in ignored}))
    except ValueError as exc:
        raise PayloadMismatch(f"{where}ignore_paths: {exc}") from None


def _check_resource_name(name: str, serialization: Serialization) -> str:
    """A file path, or in shard mode ``path:start:end`` with offsets on the shard grid."""
    if not serialization.sharded:
        return _check_name(name)
    try:
        path, start, end = split_shard_name(name)
    except ValueError as exc:
        raise PayloadMismatch(f"resource name {quoted(name)}: {exc}") from None
    size = serialization.shard_size or 0
    if start % size or end - start > size:
        raise PayloadMismatch(f"resource name {quoted(name)} is not a shard of size {size}")
    _check_name(path)
    return name


def _parse_resources(raw: Any, serialization: Serialization = FILES_SHA256) -> list[Resource]:
    """Parses ``predicate.resources`` in their signed order; rejects duplicates."""
    if not isinstance(raw, list):
        raise PayloadMismatch("predicate.resources must be a list")
    resources: list[Resource] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"predicate.resources[{index}]."
        name = _check_resource_name(_field(item, "name", str, where), serialization)
        algorithm = _field(item, "algorithm", str, where)
        digest = _field(item, "digest", str, where)
        wanted = serialization.resource_algorithm
        if algorithm != wanted or not _HEX64.fullmatch(digest):
            got = f"{quoted(algorithm)}:{quoted(digest)}"
            raise PayloadMismatch(f"{where[:-1]} ({quoted(name)}): expected a {wanted} hex digest, got {got}")
        if name in seen:
            raise PayloadMismatch(f"predicate.resources lists {quoted(name)} twice")
        seen.add(name)
        resources.append(Resource(name, bytes.fromhex(digest)))
    return resources


def _parse_subject(statement: dict[str, Any]) -> tuple[str, str]:
    """Returns (name, hex sha256) of the single subject."""
    subjects = _field(statement, "subject", list, "")
    if len(subjects) != 1:
        raise PayloadMismatch(f"expected exactly one subject, got {len(subjects)}")
    name = _field(subjects[0], "name", str, "subject[0].")
    digest = _field(_field(subjects[0], "digest", dict, "subject[0]."), HASH_ALGORITHM, str, "subject[0].digest.")
    if not _HEX64.fullmatch(digest):
        raise PayloadMismatch(f"subject[0].digest.sha256 is not a sha256 hex digest: {quoted(digest)}")
    return name, digest


def parse_statement(payload: bytes) -> SignedStatement:
    """Parses and checks a signed payload.

    Raises PayloadMismatch when it is not an in-toto Statement v1 with the model_signing
    v1.0 predicate, or when the subject digest does not match the resources (in their
    signed order, as model_signing computes it); UnsupportedSignature for a serialization
    other than ``files`` (sha256, blake3) or ``shards`` (sha256). Resources come back in
    canonical order.
    """
    statement = parse_json(payload, PayloadMismatch, "the signed payload")
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise PayloadMismatch(f"the signed payload is not an in-toto statement of type {STATEMENT_TYPE}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise PayloadMismatch(f"predicateType is {quoted(statement.get('predicateType'))}, expected {PREDICATE_TYPE!r}")
    name, subject_digest = _parse_subject(statement)
    predicate = _field(statement, "predicate", dict, "")
    serialization, ignored = _parse_serialization(predicate.get("serialization"))
    resources = _parse_resources(predicate.get("resources"), serialization)
    computed = root_digest(r.digest for r in resources).hex()
    if computed != subject_digest:
        raise PayloadMismatch(
            f"the statement is inconsistent: subject digest is {subject_digest} but its resources hash to {computed}"
        )
    raw_provenance = predicate.get(WARDEN_PREDICATE_KEY)
    provenance = Provenance() if raw_provenance is None else Provenance.from_dict(raw_provenance)
    ordered = tuple(sorted(resources, key=lambda r: resource_sort_key(r.name, serialization.sharded)))
    return SignedStatement(Manifest(name, ordered, ignored, serialization), subject_digest, provenance)
