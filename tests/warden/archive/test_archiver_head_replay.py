"""The rollback check's shortcut: when an old head version must be read, and when not (pure)."""

from __future__ import annotations

from warden.archive.store import VersionEntry
from warden.archive.verify import may_be_a_replay


def _version(vid: str, etag: str) -> VersionEntry:
    return VersionEntry(
        key="h", version_id=vid, is_latest=False, is_delete_marker=False, etag=etag, last_modified=0.0, size=1
    )


def test_a_head_with_a_fresh_md5_etag_cannot_be_a_replay():
    versions = [_version("3", '"c"'), _version("2", '"c"'), _version("1", '"b"'), _version("0", '"a"')]
    assert not may_be_a_replay(versions, 0, "c")  # identical re-puts right before it are fine


def test_an_etag_seen_before_may_be_a_replay():
    versions = [_version("3", '"a"'), _version("2", '"b"'), _version("1", '"a"')]
    assert may_be_a_replay(versions, 0, "a")  # the bytes of version 1 again, after version 2


def test_an_etag_that_is_not_the_md5_of_the_bytes_may_be_a_replay():
    assert may_be_a_replay([_version("3", '"f00-1"'), _version("2", '"b"')], 0, "a")  # multipart
    assert may_be_a_replay([_version("1", '"a"')], 0, None)  # nothing known about the bytes
