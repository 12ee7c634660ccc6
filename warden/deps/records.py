"""The RECORD check: every row with a strong hash owns its path and is hashed again (filehash.py)
unless the cache vouches for it, and a distribution verified clean is remembered whole, by its
RECORD's sha256, the policy and a fingerprint of its files' stat identities (cache.dist_state),
so an unchanged distribution costs one comparison and its RECORD is not even parsed."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from collections.abc import Sequence

from warden.deps.cache import IntegrityCache
from warden.deps.drift import matches_any
from warden.deps.filehash import HashJob
from warden.deps.installed import InstalledDist, RecordEntry
from warden.deps.integrity_common import (
    IntegrityOptions,
    IntegrityStats,
    glob_matcher,
    lstat_or_none,
    relative,
    special_finding,
    tampered_finding,
)
from warden.deps.model import Finding
from warden.deps.walk import kind_of, stat_fingerprint
from warden.errors import quote_untrusted


def _inside(path: str, roots: Sequence[str]) -> bool:
    return path.startswith(_prefixes(tuple(roots)))


@functools.lru_cache(maxsize=16)
def _prefixes(roots: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(root + os.sep for root in roots)


def _legacy_findings(dist: InstalledDist, walked: dict[str, os.stat_result], allow: Sequence[str]) -> list[Finding]:
    """A distribution without RECORD hashes (no RECORD, or an egg-info) owns nothing it could prove."""
    legacy = dist.meta_dir.endswith(".egg-info")
    if legacy and matches_any(dist.canonical, allow):
        return []
    kind = "egg_info" if legacy else "no_record"
    message = dist.problem or f"{dist.meta_dir}: no RECORD"
    if legacy:
        message += "; not on integrity.egg_info_allow"
    return [Finding("integrity", kind, dist.canonical, message, True, {"meta_dir": dist.meta_dir})]


@functools.lru_cache(maxsize=64)
def _is_normal(root: str) -> bool:
    return os.sep == "/" and root == os.path.normpath(root)


def _joined(root: str, rel: str) -> str:
    """``normpath(join(root, rel))``, without the cost for a plain relative RECORD path."""
    plain = rel and rel[0] not in "./" and "/." not in rel and "//" not in rel and not rel.endswith("/")
    if plain and _is_normal(root):
        return f"{root}/{rel}"
    return os.path.normpath(os.path.join(root, rel))


def _unhashed_ok(dist: InstalledDist, path: str, allow: Sequence[str]) -> bool:
    rel = relative(path, dist.site_packages)
    if rel.endswith(".pyc") and not path.rpartition(os.sep)[0].endswith(os.sep + "__pycache__"):
        return False  # a sourceless .pyc beside the package is imported: it needs a hash
    return glob_matcher(tuple(allow))(rel) is not None


def _benign_absent(dist: InstalledDist, path: str, options: IntegrityOptions) -> bool:
    """Whether a RECORD row without a hash may be absent: a ``__pycache__`` pyc on ``unhashed_allow``
    (pip lists them without hashes; nothing is imported from an absent pyc)."""
    return path.endswith(".pyc") and _unhashed_ok(dist, path, options.unhashed_allow)


def _cached_ok(entry: RecordEntry, st: os.stat_result | None, cached: str | None) -> bool:
    """Whether a row's file (walked, so inside the roots) is a regular file whose stat identity
    (warden.safeio.stat_identity: cache.py says why ctime) is the one it had when it was last
    hashed to exactly the row's sha256 (``cached``: the cache's entry for the path, the text
    cache.put_digest writes, built inline here: this runs once per row). Anything else goes the
    long way (_row)."""
    return (
        st is not None
        and cached is not None
        and entry.digest is not None
        and entry.digest.startswith("sha256=")
        and stat.S_ISREG(st.st_mode)
        and (entry.size is None or entry.size == st.st_size)
        and cached == f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {entry.digest}"
    )


def _policy_tag(options: IntegrityOptions) -> str:
    """What a distribution's clean verdict depends on besides its files: the rows allowed without a hash."""
    return hashlib.sha256("\0".join(options.unhashed_allow).encode()).hexdigest()[:16]


def fingerprint(hashed: str, other: str, walked: dict[str, os.stat_result]) -> str | None:
    """walk.stat_fingerprint of the NUL-joined ``hashed`` paths, given that each ``other`` path was
    walked too (their content is not what the fingerprint vouches for: .pyc rows are checked
    against their source, RECORD by its digest); None otherwise. Each hashed path was a regular
    file when the distribution was remembered, and the mode is in the fingerprint."""
    if other and not all(map(walked.__contains__, other.split("\0"))):
        return None
    return stat_fingerprint(hashed.split("\0") if hashed else (), walked)


def remember_clean(
    dists: Sequence[InstalledDist],
    walked: dict[str, os.stat_result],
    options: IntegrityOptions,
    cache: IntegrityCache,
    findings: Sequence[Finding],
    unreadable: Sequence[str],
) -> None:
    """After hashing: remembers each distribution whose every row is verified (a regular file whose
    cached digest, for its current stat, is the row's sha256) or an allowed unhashed row present
    under the roots, with its paths and their fingerprint (dist_state). One not clean is not
    remembered, so it is judged row by row again. The fingerprint is of the walk's stats, which is
    sound because a digest is cached only under the stat of the descriptor it was read from and
    only once settled (filehash.hash_all); a file that changed during the audit leaves ``unreadable``
    non-empty, and then nothing is remembered."""
    if unreadable or any(f.kind in ("missing_file", "special_file") for f in findings):
        return  # a partial walk or hash is not a verdict to keep
    tag = _policy_tag(options)
    dirty = {str(f.details.get("dist")) for f in findings if f.details.get("dist")}
    for dist in dists:
        if (
            dist.record is None
            or not dist.record_sha256
            or dist.meta_dir.endswith(".egg-info")
            or dist.canonical in dirty
            or cache.dist_state(dist.meta_dir, dist.record_sha256, tag) is not None
        ):
            continue
        paths = _clean_paths(dist, walked, options, cache)
        if paths is not None:
            joined, rest = "\0".join(paths[0]), "\0".join(paths[1])
            print_ = fingerprint(joined, rest, walked)
            if print_ is not None:
                cache.put_dist(dist.meta_dir, dist.record_sha256, tag, joined, rest, print_)


def _clean_paths(
    dist: InstalledDist, walked: dict[str, os.stat_result], options: IntegrityOptions, cache: IntegrityCache
) -> tuple[list[str], list[str]] | None:
    """(hashed paths, allowed unhashed paths) of a distribution whose every row is one or the other
    (remember_clean), else None."""
    hashed: list[str] = []
    other: list[str] = []
    for entry in dist.record or ():
        path = _joined(dist.site_packages, entry.path)
        st = walked.get(path)
        if st is None and not entry.digest and _benign_absent(dist, path, options):
            continue  # a purged pyc: if it comes back, bytecode.py checks it against its source
        if st is None:
            return None  # missing, or outside the roots (lstat-ed each audit by _row)
        if _cached_ok(entry, st, cache.entry(path)):
            hashed.append(path)
        elif entry.digest is None and _unhashed_ok(dist, path, options.unhashed_allow):
            other.append(path)
        else:
            return None
    return hashed, other


def record_jobs(
    dists: Sequence[InstalledDist],
    walked: dict[str, os.stat_result],
    roots: Sequence[str],
    options: IntegrityOptions,
    stats: IntegrityStats,
    cache: IntegrityCache,
) -> tuple[list[HashJob], list[Finding], set[str]]:
    """Hash jobs for RECORD rows with a digest whose file changed since it was hashed (every row
    on a full pass), findings needing no hashing, and the owned paths.

    A row owns its path only if it carries a strong hash (or the policy's ``unhashed_allow``
    names it): a row without one would otherwise switch the check off for that file."""
    jobs: list[HashJob] = []
    findings: list[Finding] = []
    owned: set[str] = set()
    tag = _policy_tag(options)
    for dist in dists:
        if _remembered(dist, walked, options, stats, cache, tag, owned):
            continue
        cache.drop_dist(dist.meta_dir)  # judged again below; remembered again once clean (remember_clean)
        if dist.record is None or dist.meta_dir.endswith(".egg-info"):
            findings.extend(_legacy(dist, walked, options, owned))
            continue
        site = dist.site_packages
        for entry in dist.record:
            path = _joined(site, entry.path)
            if not options.full_pass and _cached_ok(entry, walked.get(path), cache.entry(path)):
                stats.files_listed += 1
                stats.files_cached += 1
                owned.add(path)
                continue
            job, finding = _row(dist, entry, path, walked, roots, options, stats)
            if finding is not None:
                findings.append(finding)
            if job is not None:
                jobs.append(job)
            if finding is None or finding.kind != "unhashed":
                owned.add(path)
    return jobs, findings, owned


def _remembered(
    dist: InstalledDist,
    walked: dict[str, os.stat_result],
    options: IntegrityOptions,
    stats: IntegrityStats,
    cache: IntegrityCache,
    tag: str,
    owned: set[str],
) -> bool:
    """Whether ``dist`` was remembered clean and its files' fingerprint is unchanged (not on a full
    pass); then its paths are owned and counted as cached, its RECORD never parsed."""
    state = None if options.full_pass else cache.dist_state(dist.meta_dir, dist.record_sha256, tag)
    if state is None or fingerprint(state[0], state[1], walked) != state[2]:
        return False
    hashed = state[0].split("\0") if state[0] else []
    stats.dists_cached += 1
    stats.files_listed += len(hashed)
    stats.files_cached += len(hashed)
    owned.update(hashed)
    owned.update(state[1].split("\0") if state[1] else ())
    return True


def _legacy(
    dist: InstalledDist, walked: dict[str, os.stat_result], options: IntegrityOptions, owned: set[str]
) -> list[Finding]:
    """A distribution without RECORD hashes owns its metadata directory; an allowed egg-info also
    owns what it lists, by name."""
    found = _legacy_findings(dist, walked, options.egg_info_allow)
    owned.update(p for p in walked if p.startswith(dist.meta_dir + os.sep) or p == dist.meta_dir)
    if not found:  # an allowed egg-info owns what it lists, by name
        owned.update(os.path.normpath(os.path.join(dist.site_packages, e.path)) for e in dist.record or ())
    return found


def _row(
    dist: InstalledDist,
    entry: RecordEntry,
    path: str,
    walked: dict[str, os.stat_result],
    roots: Sequence[str],
    options: IntegrityOptions,
    stats: IntegrityStats,
) -> tuple[HashJob | None, Finding | None]:
    inside = _inside(path, roots)
    st = walked.get(path) if inside else lstat_or_none(path)
    if st is None and not entry.digest and _benign_absent(dist, path, options):
        return None, None  # a __pycache__ pyc purged (py3clean, image slimming): Python writes it again
    if st is None:
        if inside:
            message = f"{path}: listed in {dist.name} {dist.version} RECORD but missing"
            return None, Finding("integrity", "missing_file", path, message, True, {"dist": dist.canonical})
        stats.outside_missing += 1
        return None, None
    algo = (entry.digest or "").partition("=")[0]
    if not entry.digest or algo not in hashlib.algorithms_guaranteed or algo in ("md5", "sha1"):
        if not entry.digest and _unhashed_ok(dist, path, options.unhashed_allow):
            return None, None
        why = "has no hash" if not entry.digest else f"has a weak or unknown hash {quote_untrusted(algo, 20)!r}"
        message = f"{path}: its row in {dist.name} {dist.version} RECORD {why}, so nothing vouches for its content"
        return None, Finding("integrity", "unhashed", path, message, True, {"dist": dist.canonical})
    stats.files_listed += 1
    kind = kind_of(st.st_mode)
    if kind not in ("file", "symlink"):
        return None, special_finding(path, kind)
    if entry.size is not None and entry.size != st.st_size and kind == "file":
        return None, tampered_finding(path, dist, f"size {st.st_size} differs from RECORD's {entry.size}")
    return HashJob(path, entry.digest, algo, dist, st), None
