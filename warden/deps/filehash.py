"""The hashing pass of the RECORD check: the rows records.py could not settle from the cache are
hashed in a thread pool (``hashlib`` releases the GIL), the largest files first, each read only as
the file the walk stat-ed (walk.safe_digest); a digest is cached only once the file had settled
(walk.settled)."""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass

from warden.deps.cache import IntegrityCache
from warden.deps.installed import InstalledDist
from warden.deps.integrity_common import (
    IntegrityOptions,
    IntegrityStats,
    oversized_finding,
    tampered_finding,
    workers,
)
from warden.deps.model import Finding
from warden.deps.walk import Oversized, map_in_threads, safe_digest, settled
from warden.safeio import stat_identity


@dataclass(frozen=True)
class HashJob:
    path: str
    expected: str
    algo: str
    owner: InstalledDist
    st: os.stat_result


def _mismatch(job: HashJob) -> Finding:
    if stat.S_ISLNK(job.st.st_mode):
        return tampered_finding(job.path, job.owner, "is a symbolic link where RECORD lists a file")
    return tampered_finding(job.path, job.owner, "content hash differs from RECORD")


def _job_size(job: HashJob) -> int:
    return int(job.st.st_size)


def hash_all(
    jobs: list[HashJob],
    cache: IntegrityCache,
    options: IntegrityOptions,
    stats: IntegrityStats,
    cancel: threading.Event,
) -> tuple[list[Finding], list[str]]:
    """Findings of the jobs whose digest is not the row's and the files that could not be read
    (or changed since the walk: walk.Changed). Updates ``cache`` and ``stats``."""
    findings: list[Finding] = []
    unreadable: list[str] = []
    todo: list[HashJob] = []
    for job in jobs:
        cached = None if options.full_pass else cache.digest(job.path, stat_identity(job.st), job.algo)
        if cached is None:
            todo.append(job)
            continue
        stats.files_cached += 1
        if cached != job.expected:
            findings.append(_mismatch(job))

    def one(job: HashJob) -> tuple[HashJob, str | None, str | None]:
        if cancel.is_set():
            return job, None, "cancelled"
        try:  # the walked file only (job.st): anything else raises walk.Changed
            return job, safe_digest(job.path, job.algo, job.st, options.budget), None
        except Oversized as exc:
            return job, None, f"oversized {exc.size}"
        except OSError as exc:
            return job, None, exc.strerror or str(exc)

    now = time.time_ns()  # before any read: walk.settled

    todo.sort(key=lambda j: -j.st.st_size)  # the largest first, each alone: the threads finish together
    for job, digest, error in map_in_threads(one, todo, workers(options.workers), "deps-hash", 32, _job_size):
        if digest is None and error and error.startswith("oversized ") and options.budget is not None:
            stats.oversized += 1
            findings.append(oversized_finding(job.path, int(error.split()[1]), options.budget.max_file_bytes))
            continue
        if digest is None:
            unreadable.append(f"{job.path}: {error}")
            continue
        stats.files_hashed += 1
        stats.bytes_hashed += job.st.st_size
        if settled(job.st, now):
            cache.put_digest(job.path, stat_identity(job.st), digest)
        if digest != job.expected:
            findings.append(_mismatch(job))
    return findings, unreadable
