"""What scans in one process share: the caches, the parse budget and the tokenizer-request pool.

A :class:`ScanResources` is made by the caller (a test, a benchmark, a service that wants its
own) or, for callers that pass none, once per process by :func:`default_resources` on first
use. Importing this module builds nothing: no cache, no pool, no thread.

The caches (:class:`~warden.caches.LRUCache`, thread-safe, single flight where values are
made), by content digest: ``memo`` (parsed JSON, vocabulary sets, battery renders: bounded by
estimated bytes), ``judged`` (what was found in one content: bounded by count) and ``behaviour``
(the tokenizer child's answers, as futures); by directory, ``scans`` (the verdict of a complete
scan under :func:`~.verdict.verdict_key`: a rescan of an unchanged directory lists and hashes
it, or stats it with a hash cache, and reads, parses and exercises nothing).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from warden.caches import LRUCache

# The caches by content, split by what a value weighs. Big values (parsed JSON, vocabulary
# sets, battery renders) are bounded by their estimated bytes: 50 distinct 32k-vocab
# tokenizers are ~100 MiB of JSON, ~600 MiB parsed, so not all of them are kept, and a warm
# rescan does not need them (see ``scans``). Small values (verdicts: issues found in one
# content, a few hundred bytes each) are bounded by count only, generously.
MEMO_ENTRIES, MEMO_BYTES = 1024, 256 << 20  # json, vocab, keys, render
JUDGED_ENTRIES = 8192  # order, vocabs, battery, judge: count bound only
# tokenizer child answers (futures: in flight or done), by content and tokens: tens of KB each
# (the corpus's ids and pieces), so 256 of them
BEHAVIOUR_ENTRIES = 256
# The verdicts of whole directories: small (a few hundred bytes per directory without
# findings): 4096 directories, and at most 32 MiB of findings.
SCANS_ENTRIES, SCANS_BYTES = 4096, 32 << 20
PARSE_BUDGET_BYTES = 128 << 20
TOKENIZER_THREADS = 8  # threads sending tokenizer requests: most wait on a sandbox worker


class ByteBudget:
    """Bytes of large files that concurrent scans (:func:`~.scanner.scan_paths`) may hold parsed
    at once: a parsed JSON document takes several times its size, so eight scans of 64 MiB files
    must not run together. A scan takes its share before it reads anything (so it never waits
    for the budget while holding a share another scan waits on); a scan alone always runs."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    def admits(self, amount: int) -> bool:
        return self.used == 0 or self.used + amount <= self.limit

    def acquire(self, amount: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.admits(amount))
            self.used += amount

    def release(self, amount: int) -> None:
        with self.cond:
            self.used -= amount
            self.cond.notify_all()


def _memo() -> LRUCache[tuple[str, str], Any]:
    return LRUCache(MEMO_ENTRIES, MEMO_BYTES)


def _judged() -> LRUCache[tuple[str, str], Any]:
    return LRUCache(JUDGED_ENTRIES)


def _behaviour() -> LRUCache[tuple[str, str], Any]:
    return LRUCache(BEHAVIOUR_ENTRIES)


def _scans() -> LRUCache[str, Any]:
    return LRUCache(SCANS_ENTRIES, SCANS_BYTES)


@dataclass
class ScanResources:
    """The caches, parse budget and tokenizer-request pool that scans share (see the module
    docstring). Values in the caches are shared between snapshots and never mutated by the
    checks. The pool's threads start on the first tokenizer request, not before."""

    memo: LRUCache[tuple[str, str], Any] = field(default_factory=_memo)
    judged: LRUCache[tuple[str, str], Any] = field(default_factory=_judged)
    behaviour: LRUCache[tuple[str, str], Any] = field(default_factory=_behaviour)
    scans: LRUCache[str, Any] = field(default_factory=_scans)
    parse_budget: ByteBudget = field(default_factory=lambda: ByteBudget(PARSE_BUDGET_BYTES))
    tokenizer_threads: int = TOKENIZER_THREADS
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def tokenizer_pool(self) -> ThreadPoolExecutor:
        """The threads that send tokenizer requests to the sandbox workers (made on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.tokenizer_threads, thread_name_prefix="tokenscan-tokenizer")
            return self._pool

    def clear(self) -> None:
        """Forgets every cached parse, answer, judgement and verdict (a cold scanner)."""
        for cache in (self.memo, self.judged, self.behaviour, self.scans):
            cache.clear()

    def close(self) -> None:
        """Waits for the pool's requests and stops its threads; the next request starts a new pool."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


_default: ScanResources | None = None
_default_lock = threading.Lock()


def default_resources() -> ScanResources:
    """The process-wide :class:`ScanResources` of callers that pass none, made on the first call."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ScanResources()
        return _default
