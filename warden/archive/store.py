"""Where records go: the :class:`Store` interface, S3 through boto3, and ``file:///`` for air-gapped use.

URLs: ``s3://bucket[/prefix][?addressing_style=path|virtual|auto]`` (endpoint, region and
credentials from the standard AWS environment: ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``... or any other link of the
AWS credential chain), and ``file:///absolute/dir``. Both use the same keys (see
:mod:`warden.archive.record`), relative to the prefix or directory.

Contracts:
- :meth:`Store.create` never overwrites: S3 puts with ``If-None-Match: *``; on 412 the
  stored bytes are read back, equal bytes mean "already stored" (a retry after a lost
  answer), different bytes raise :class:`StoreConflict`. ``file://`` gets the same
  semantics from ``link(2)``, which fails when the name exists.
- the only mutable object is the per-run head (:meth:`Store.put`); nothing here deletes
  or changes the retention of an object: the classes have no such method.
- every failure is a :class:`~warden.archive.errors.StoreError` whose ``kind`` is a
  bounded label value; ``requests`` counts the requests sent (retries included).
- reads are hostile-object safe (an attacker may hold a bucket credential or write to the
  directory): every read has a size cap (``max_bytes``; S3: a ranged GET whose
  ``Content-Range`` total is checked before the body is read), and ``file://`` objects are
  opened without following a final symlink and without blocking (a FIFO), regular files
  only; anything else raises :class:`~warden.archive.errors.ObjectRefused` (a violation).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import enum
import hashlib
import os
import stat
import threading
import urllib.parse
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any

from warden import safeio
from warden.archive.errors import (
    ObjectRefused,
    StoreAccessDenied,
    StoreConfigError,
    StoreConflict,
    StoreError,
    StoreUnavailable,
)
from warden.safeio import UnsafeFile, read_regular_below

DEFAULT_MAX_OBJECT_BYTES = 64 * 1024 * 1024


class Created(enum.Enum):
    """What :meth:`Store.create` did."""

    NEW = "new"
    ALREADY_STORED = "already_stored"


@dataclass(frozen=True)
class Retention:
    """Object Lock retention for a new object: ``mode`` GOVERNANCE or COMPLIANCE for ``days``."""

    mode: str
    days: int

    def until(self, now: dt.datetime | None = None) -> dt.datetime:
        return (now or dt.datetime.now(dt.UTC)) + dt.timedelta(days=self.days)


@dataclass(frozen=True)
class Version:
    """One version of a key, for diagnostics (``is_delete_marker``: a deletion hides the older ones)."""

    version_id: str
    is_latest: bool
    is_delete_marker: bool


@dataclass(frozen=True)
class Blob:
    """The bytes of one read, and the version read (None where the store keeps no versions)."""

    body: bytes
    version_id: str | None = None


@dataclass(frozen=True)
class VersionEntry:
    """One row of a version listing: a stored version or a delete marker of ``key``."""

    key: str
    version_id: str
    is_latest: bool
    is_delete_marker: bool
    etag: str
    last_modified: float
    size: int


def _too_large(url: str, key: str, size: int | str, cap: int) -> ObjectRefused:
    return ObjectRefused(f"{url}: {key} is {size} bytes, over the {cap}-byte cap for this object; not read", key)


class Store(ABC):
    """A flat namespace of immutable objects plus mutable heads. Thread-safe."""

    url: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self.operations: Counter[str] = Counter()

    @property
    def requests(self) -> int:
        """Requests sent so far (every attempt counts)."""
        with self._lock:
            return sum(self.operations.values())

    def _count(self, operation: str) -> None:
        with self._lock:
            self.operations[operation] += 1

    def create(self, key: str, body: bytes, retention: Retention | None = None) -> Created:
        """Stores ``body`` under a new ``key``; see the module contract. Raises StoreError."""
        if self._put_if_absent(key, body, retention):
            return Created.NEW
        existing = self.get(key)
        if existing == body:
            return Created.ALREADY_STORED
        if existing is None:
            raise StoreUnavailable(f"{self.url}: {key} existed on put and vanished on read; will retry", "race")
        raise StoreConflict(
            f"{self.url}: {key} already holds different bytes ({len(existing)} stored, {len(body)} new); "
            "not overwritten",
            key,
        )

    @abstractmethod
    def _put_if_absent(self, key: str, body: bytes, retention: Retention | None) -> bool:
        """Writes ``body`` unless ``key`` exists; False when it exists."""

    @abstractmethod
    def put(self, key: str, body: bytes, retention: Retention | None = None) -> None:
        """Writes or replaces ``key`` (only for heads); on a versioned store every version is kept
        under ``retention``, so the head's history (the rollback check's evidence) cannot be erased."""

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES) -> bytes | None:
        """The bytes under ``key``, None when there is no current object.

        Raises ObjectRefused (over ``max_bytes``, or not a regular file), StoreError.
        """
        blob = self.read(key, max_bytes)
        return None if blob is None else blob.body

    @abstractmethod
    def read(self, key: str, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES, version_id: str | None = None) -> Blob | None:
        """Like :meth:`get`, with the version read; ``version_id`` reads that version."""

    def list_versions(self, prefix: str) -> list[VersionEntry] | None:
        """Every version and delete marker under ``prefix`` (all pages); None where the store keeps no versions."""
        return None

    @abstractmethod
    def list_keys(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[str]:
        """Keys starting with ``prefix``, sorted, after ``start_after``, at most ``limit``."""

    def versions(self, key: str) -> list[Version]:
        """The versions of ``key``, newest first; empty where the store keeps no versions."""
        return []

    @abstractmethod
    def object_lock_enabled(self) -> bool:
        """Whether the bucket was created with Object Lock. Raises StoreError."""

    def close(self) -> None:  # noqa: B027 (optional hook: most stores hold nothing)
        """Releases connections."""


# --- file:// -----------------------------------------------------------------------------------


class FileStore(Store):
    """Objects as files under a directory; written atomically, created with ``link(2)``."""

    def __init__(self, url: str, root: str) -> None:
        super().__init__(url)
        self.root = root

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise StoreConfigError(f"{self.url}: refusing key {key!r} (empty, '.' or '..' segment)")
        return os.path.join(self.root, *parts)

    def _io_error(self, exc: OSError, key: str) -> StoreError:
        return StoreUnavailable(f"{self.url}: {key}: {exc.strerror or exc}", "io")

    def _put_if_absent(self, key: str, body: bytes, retention: Retention | None) -> bool:
        self._count("PutObject")
        self._path(key)  # refuses empty, '.' and '..' segments
        directories, name = key.split("/")[:-1], key.rsplit("/", 1)[-1]
        try:
            safeio.make_root(self.root)  # the operator's directory; below it nothing is followed
            dir_fd = safeio.open_dirs_below(self.root, directories, create=True)
            try:
                return safeio.create_new_at(dir_fd, name, body)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise self._io_error(exc, key) from None

    def put(self, key: str, body: bytes, retention: Retention | None = None) -> None:
        self._count("PutObject")  # no versions on a file store: retention has nothing to keep
        self._path(key)
        directories, name = key.split("/")[:-1], key.rsplit("/", 1)[-1]
        try:
            safeio.make_root(self.root)  # the operator's directory; below it nothing is followed
            dir_fd = safeio.open_dirs_below(self.root, directories, create=True)
            try:
                safeio.atomic_write_at(dir_fd, name, body)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise self._io_error(exc, key) from None

    def read(self, key: str, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES, version_id: str | None = None) -> Blob | None:
        self._count("GetObject")
        if version_id is not None:
            return None
        path = self._path(key)
        try:
            body = read_regular_below(self.root, key, max_bytes)  # no link at any depth, no FIFO, capped
        except UnsafeFile as exc:
            if exc.reason == "too_large":
                raise _too_large(self.url, key, f"more than {max_bytes}", max_bytes) from None
            what = _file_kind(path) if exc.reason != "link" or os.path.islink(path) else "below a symbolic link"
            raise ObjectRefused(f"{self.url}: {key} is {what}, not a regular file; not read", key) from None
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._io_error(exc, key) from None
        return Blob(body)

    def list_keys(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[str]:
        self._count("ListObjectsV2")
        directory, _, name_prefix = prefix.rpartition("/")
        base = self._path(directory) if directory else self.root
        try:
            # Every entry but directories (d_type, no stat per name): a symlink or FIFO put where
            # a record belongs is listed, so that reading it reports it instead of skipping it.
            with os.scandir(base) as entries:
                names = sorted(
                    e.name
                    for e in entries
                    if e.name.startswith(name_prefix)
                    and not e.name.startswith(".tmp-")
                    and not e.is_dir(follow_symlinks=False)
                )
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._io_error(exc, prefix) from None
        keys = [f"{directory}/{n}" if directory else n for n in names]
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        return keys[:limit] if limit is not None else keys

    def object_lock_enabled(self) -> bool:
        return False


def _file_kind(path: str) -> str:
    """'a symbolic link', 'a FIFO'... for a refusal message."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not readable as a file"
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


# --- s3:// -----------------------------------------------------------------------------------------

_UNAVAILABLE_CODES = {"SlowDown": "throttled", "RequestTimeout": "timeout", "ServiceUnavailable": "throttled"}
_CHECKSUM_CODES = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"}


def _classify(exc: Exception, url: str, what: str) -> StoreError:
    """A StoreError with a bounded ``kind`` for a boto3/botocore exception."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"{url}: {what}: {code or status} {err.get('Message', '')}".rstrip()
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
            return StoreAccessDenied(message + " (check the credentials and the IAM policy in policies/iam/)")
        if code == "NoSuchBucket":
            return StoreConfigError(message + " (create the bucket, or fix the store URL)", "no_such_bucket")
        if code in _CHECKSUM_CODES:
            return StoreUnavailable(message, "checksum")
        if code in _UNAVAILABLE_CODES:
            return StoreUnavailable(message, _UNAVAILABLE_CODES[code])
        if status >= 500:
            return StoreUnavailable(message, "server_error")
        return StoreUnavailable(message, "client_error")
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return StoreAccessDenied(f"{url}: {what}: no AWS credentials found (set AWS_ACCESS_KEY_ID...)", "credentials")
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return StoreUnavailable(f"{url}: {what}: timed out ({exc})", "timeout")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectionClosedError | bx.HTTPClientError):
        return StoreUnavailable(f"{url}: {what}: cannot connect ({exc})", "connect")
    if isinstance(exc, bx.BotoCoreError):
        return StoreUnavailable(f"{url}: {what}: {exc}", "client_error")
    raise exc


def _status(exc: Exception) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store(Store):
    """Objects in an S3 bucket under ``prefix``; one boto3 client shared by all threads."""

    page_size = 1000  # keys per ListObjectsV2 page (the S3 maximum)

    def __init__(
        self,
        url: str,
        bucket: str,
        prefix: str,
        *,
        addressing_style: str = "auto",
        timeout: float = 10.0,
        max_connections: int = 10,
        attempts: int = 2,
    ) -> None:
        super().__init__(url)
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix
        session = boto3.session.Session()
        config = Config(
            s3={"addressing_style": addressing_style},
            retries={"mode": "standard", "total_max_attempts": attempts},
            connect_timeout=min(timeout, 5.0),
            read_timeout=timeout,
            max_pool_connections=max_connections,
        )
        self.client: Any = session.client("s3", config=config, region_name=session.region_name or "us-east-1")
        self.client.meta.events.register("before-send.s3", self._on_send)

    def _on_send(self, event_name: str = "", **_: Any) -> None:
        self._count(event_name.rsplit(".", 1)[-1])

    def _key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def _put_args(self, key: str, body: bytes, retention: Retention | None) -> dict[str, Any]:
        """PutObject arguments: JSON, a SHA-256 checksum (also the header S3 demands with Object Lock
        headers) and, with ``retention``, the Object Lock mode and date."""
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "Body": body,
            "ContentType": "application/json",
            "ChecksumAlgorithm": "SHA256",
            "ChecksumSHA256": base64.b64encode(hashlib.sha256(body).digest()).decode("ascii"),
        }
        if retention is not None:
            args["ObjectLockMode"] = retention.mode
            args["ObjectLockRetainUntilDate"] = retention.until()
        return args

    def _put_if_absent(self, key: str, body: bytes, retention: Retention | None) -> bool:
        try:
            self.client.put_object(IfNoneMatch="*", **self._put_args(key, body, retention))
        except Exception as exc:
            if _status(exc) == 412 or _error_code(exc) == "PreconditionFailed":
                return False
            raise _classify(exc, self.url, f"put {key}") from None
        return True

    def put(self, key: str, body: bytes, retention: Retention | None = None) -> None:
        try:
            self.client.put_object(**self._put_args(key, body, retention))
        except Exception as exc:
            raise _classify(exc, self.url, f"put {key}") from None

    def read(self, key: str, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES, version_id: str | None = None) -> Blob | None:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Range": f"bytes=0-{max_bytes}"}
        if version_id is not None:
            args["VersionId"] = version_id
        try:
            response = self.client.get_object(**args)
        except Exception as exc:
            code = _error_code(exc)
            if _status(exc) == 404 or code in ("NoSuchKey", "NoSuchVersion", "404"):
                return None
            if _status(exc) == 416 or code == "InvalidRange":  # a range of an empty object
                return Blob(b"", version_id)
            raise _classify(exc, self.url, f"get {key}") from None
        body = response["Body"]
        try:
            total = str(response.get("ContentRange", "")).rpartition("/")[2]
            length = int(response.get("ContentLength", 0) or 0)
            if (total.isascii() and total.isdigit() and int(total) > max_bytes) or length > max_bytes:
                raise _too_large(self.url, key, total if total.isascii() and total.isdigit() else length, max_bytes)
            data = bytes(body.read(max_bytes + 1))
        except ObjectRefused:
            raise
        except Exception as exc:
            raise _classify(exc, self.url, f"get {key}") from None
        finally:
            body.close()
        if len(data) > max_bytes:
            raise _too_large(self.url, key, f"more than {max_bytes}", max_bytes)
        found = response.get("VersionId")
        return Blob(data, str(found) if found else None)

    def list_versions(self, prefix: str) -> list[VersionEntry] | None:
        entries: list[VersionEntry] = []
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix), "MaxKeys": self.page_size}
        try:
            while True:
                page = self.client.list_object_versions(**args)
                for marker, items in ((False, page.get("Versions", [])), (True, page.get("DeleteMarkers", []))):
                    for item in items:
                        modified = item.get("LastModified")
                        entries.append(
                            VersionEntry(
                                key=str(item["Key"])[len(self.prefix) :],
                                version_id=str(item.get("VersionId")),
                                is_latest=bool(item.get("IsLatest")),
                                is_delete_marker=marker,
                                etag=str(item.get("ETag", "")),
                                last_modified=modified.timestamp() if modified else 0.0,
                                size=int(item.get("Size", 0) or 0),
                            )
                        )
                if not page.get("IsTruncated"):
                    break
                args["KeyMarker"] = page.get("NextKeyMarker")
                args["VersionIdMarker"] = page.get("NextVersionIdMarker")
                if not args["KeyMarker"]:
                    break
                if not args["VersionIdMarker"]:
                    del args["VersionIdMarker"]
        except Exception as exc:
            raise _classify(exc, self.url, f"list versions under {prefix}") from None
        return entries

    def list_keys(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[str]:
        keys: list[str] = []
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after is not None:
            args["StartAfter"] = self._key(start_after)
        try:
            while limit is None or len(keys) < limit:
                args["MaxKeys"] = self.page_size if limit is None else min(self.page_size, limit - len(keys))
                page = self.client.list_objects_v2(**args)
                keys.extend(item["Key"][len(self.prefix) :] for item in page.get("Contents", []))
                if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                    break
                args["ContinuationToken"] = page["NextContinuationToken"]
        except Exception as exc:
            raise _classify(exc, self.url, f"list {prefix}") from None
        return keys

    def versions(self, key: str) -> list[Version]:
        full = self._key(key)
        try:
            page = self.client.list_object_versions(Bucket=self.bucket, Prefix=full)
        except Exception as exc:
            raise _classify(exc, self.url, f"list versions of {key}") from None
        found = [
            (item.get("LastModified"), Version(str(item.get("VersionId")), bool(item.get("IsLatest")), marker))
            for marker, items in ((False, page.get("Versions", [])), (True, page.get("DeleteMarkers", [])))
            for item in items
            if item.get("Key") == full
        ]
        found.sort(key=lambda pair: (not pair[1].is_latest, -(pair[0].timestamp() if pair[0] else 0)))
        return [version for _, version in found]

    def object_lock_enabled(self) -> bool:
        try:
            answer = self.client.get_object_lock_configuration(Bucket=self.bucket)
        except Exception as exc:
            if _error_code(exc) in ("ObjectLockConfigurationNotFoundError", "ObjectLockConfigurationNotFound"):
                return False
            raise _classify(exc, self.url, "get the bucket's Object Lock configuration") from None
        return answer.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


# --- URLs ---------------------------------------------------------------------------------------------


def open_store(
    url: str,
    *,
    addressing_style: str = "auto",
    timeout: float = 10.0,
    max_connections: int = 10,
    attempts: int = 2,
) -> Store:
    """The store named by ``url``; raises StoreConfigError for an unusable URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise StoreConfigError(f"{url}: a file store URL is file:///absolute/dir")
        return FileStore(url, urllib.parse.unquote(parsed.path))
    if parsed.scheme != "s3":
        raise StoreConfigError(f"{url}: unknown store scheme; use s3://bucket/prefix or file:///dir")
    if not parsed.netloc:
        raise StoreConfigError(f"{url}: no bucket; use s3://bucket/prefix")
    options = urllib.parse.parse_qs(parsed.query)
    unknown = sorted(set(options) - {"addressing_style"})
    if unknown:
        raise StoreConfigError(f"{url}: unknown option {unknown[0]!r}; the only one is addressing_style")
    style = options.get("addressing_style", [addressing_style])[-1]
    if style not in ("auto", "path", "virtual"):
        raise StoreConfigError(f"{url}: addressing_style must be auto, path or virtual")
    prefix = parsed.path.strip("/")
    return S3Store(
        url,
        parsed.netloc,
        f"{prefix}/" if prefix else "",
        addressing_style=style,
        timeout=timeout,
        max_connections=max_connections,
        attempts=attempts,
    )
