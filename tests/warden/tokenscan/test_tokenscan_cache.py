"""Issue 18 speed: a rescan of unchanged directories reuses their verdicts (no parse, no sandbox
request), and never reuses one when anything it depends on changed: a file's content (even
rewritten with its size and mtime restored), the policy; nor one that a crash or a budget cut
short, nor one of files changed so recently that a change could hide in one timestamp tick."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.warden.tokenscan.corpus import distinct_copies, requests
from warden.tokenscan import analysis
from warden.tokenscan import chat_template as ct
from warden.tokenscan import manifest as mf
from warden.tokenscan import scanner as sc
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.manifest import HashCache
from warden.tokenscan.policy import default_policy

POLICY = default_policy()


@pytest.fixture
def settled_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled (their change is not within a tick of now)."""
    monkeypatch.setattr(mf, "RACY_NS", 0)


def test_warm_rescans_of_50_distinct_tokenizers_make_no_sandbox_request(tokenscan_corpus, tmp_path, settled_now):
    dirs = distinct_copies(tokenscan_corpus.benign, tmp_path, 50)
    sc.default_resources().clear()  # memo, judged, behaviour, scans: another test may have scanned the same contents
    ct._CACHE.clear()
    before = requests()
    cold = sc.scan_paths(dirs, POLICY, with_manifest=True)
    assert all(s.findings == [] and not s.errors for s in cold)
    assert requests()[0] - before[0] == 50  # each distinct tokenizer was exercised once
    assert requests()[1] - before[1] == 2 * 50  # each distinct template: its battery, its generated conversations
    sc.default_resources().memo.clear()  # the parsed documents are not what a warm rescan needs
    sc.default_resources().judged.clear()
    sc.default_resources().behaviour.clear()
    cache = HashCache()
    for _ in range(2):
        warm = sc.scan_paths(dirs, POLICY, with_manifest=True, hash_cache=cache)
        assert requests() == (before[0] + 50, before[1] + 2 * 50)
        assert [(s.findings, s.token_ids_digest, s.files, s.manifest) for s in warm] == [
            (c.findings, c.token_ids_digest, c.files, c.manifest) for c in cold
        ]
    assert all(s.token_ids_digest for s in warm)


def _rewrite_keeping_size_and_mtime(path: Path, data: dict) -> None:
    st = path.stat()
    body = json.dumps(data, ensure_ascii=False).encode()
    assert len(body) <= st.st_size
    path.write_bytes(body + b" " * (st.st_size - len(body)))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


@pytest.mark.parametrize("hash_cache", [None, HashCache()], ids=["rehash", "stat-cache"])
def test_a_tokenizer_rewritten_in_place_is_judged_again(fresh_benign, settled_now, hash_cache):
    """Same size, same mtime, same inode: the ctime (set by the kernel) changes, the digest
    changes, the stored clean verdict is not used."""
    assert sc.scan_directory(str(fresh_benign), POLICY, hash_cache=hash_cache).findings == []
    before = requests()
    assert sc.scan_directory(str(fresh_benign), POLICY, hash_cache=hash_cache).findings == []
    assert requests() == before  # the clean verdict was stored, and reused
    sc.default_resources().behaviour.clear()  # the other parameter's run exercised the same new content
    path = fresh_benign / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    tok["normalizer"] = {"type": "Replace", "pattern": {"String": " not"}, "content": ""}
    _rewrite_keeping_size_and_mtime(path, tok)
    ids = {f.id for f in sc.scan_directory(str(fresh_benign), POLICY, hash_cache=hash_cache).findings}
    assert "TS1202" in ids
    assert requests()[0] == before[0] + 1  # the new content was exercised
    again = {f.id for f in sc.scan_directory(str(fresh_benign), POLICY, hash_cache=hash_cache).findings}
    assert again == ids  # a stored verdict with findings stays a verdict with findings


def test_a_changed_policy_is_judged_again(fresh_benign, settled_now):
    assert sc.scan_directory(str(fresh_benign), POLICY).findings == []
    strict = default_policy(allowed_tokenizer_classes=("NoSuchTokenizer",))
    assert sc.scan_directory(str(fresh_benign), strict).findings != []
    assert sc.scan_directory(str(fresh_benign), POLICY).findings == []
    before = requests()
    assert sc.scan_directory(str(fresh_benign), strict).findings != []
    assert requests() == before  # both verdicts are kept, each under its own policy


def test_no_verdict_is_stored_for_a_crash_a_racy_file_or_a_scan_without_manifest(fresh_benign, monkeypatch):
    root = str(fresh_benign)
    key_of = lambda: sc.verdict_key(sc.build_snapshot(root, POLICY), POLICY)  # noqa: E731
    key = key_of()
    assert key is not None and sc.default_resources().scans.peek(key) is None
    sc.scan_directory(root, POLICY)  # the files were written just now: racily clean
    assert sc.default_resources().scans.peek(key) is None
    monkeypatch.setattr(mf, "RACY_NS", 0)
    sc.scan_directory(root, POLICY, with_manifest=False)  # no digest of every file, no key
    assert sc.default_resources().scans.peek(key) is None
    monkeypatch.setattr(tbe, "run", lambda *a, **k: {"status": "crashed", "message": "test"})
    sc.default_resources().behaviour.clear()
    sc.scan_directory(root, POLICY)
    assert sc.default_resources().scans.peek(key) is None
    monkeypatch.undo()
    monkeypatch.setattr(mf, "RACY_NS", 0)
    sc.default_resources().behaviour.clear()
    sc.scan_directory(root, POLICY)
    assert sc.default_resources().scans.peek(key) is not None


def test_racily_clean_files_are_not_remembered_by_the_hash_cache(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one")
    cache = HashCache()
    mf.hash_file(str(path), cache)
    assert len(cache) == 0  # changed just now: hashed again next time
    assert mf.settled((0, 0, 0, 0, 0), 1 + mf.RACY_NS) and not mf.settled((0, 0, 0, 0, 1), 1 + mf.RACY_NS)


def test_verdict_key_covers_the_tree_the_contents_and_the_policy(fresh_benign):
    root = str(fresh_benign)
    base = sc.verdict_key(sc.build_snapshot(root, POLICY), POLICY)
    assert base == sc.verdict_key(sc.build_snapshot(root, POLICY), POLICY)
    assert sc.verdict_key(sc.build_snapshot(root, POLICY, with_manifest=False), POLICY) is None
    strict = default_policy(fail_on="low")
    assert sc.verdict_key(sc.build_snapshot(root, strict), strict) != base
    os.symlink("/etc/passwd", fresh_benign / "link")  # a link to outside is listed, not hashed
    with_link = sc.verdict_key(sc.build_snapshot(root, POLICY), POLICY)
    assert with_link not in (None, base)
    os.unlink(fresh_benign / "link")
    (fresh_benign / "tokenizer_config.json").write_text("{}")
    assert sc.verdict_key(sc.build_snapshot(root, POLICY), POLICY) not in (None, base)


def test_worker_pool_size_follows_the_cpus(monkeypatch):
    for cpus, size in ((1, 1), (2, 1), (4, 2), (16, 4), (128, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert ct.pool_size() == size


def test_worker_pool_spreads_overlapping_requests_and_waits_when_all_are_busy():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    class Fake:
        def __init__(self) -> None:
            self.requests, self.release = 0, threading.Event()

        def call(self, request, memory, timeout, on_sent=None):
            self.requests += 1
            if on_sent is not None:
                on_sent()
            self.release.wait(10)
            return {"status": "ok", "id": request["id"]}

    pool = ct._WorkerPool(2, tbe.CHILD, None, ())
    fakes = [Fake(), Fake()]
    pool.workers = fakes  # type: ignore[assignment]
    while not pool.idle.empty():
        pool.idle.get_nowait()
    for fake in fakes:
        pool.idle.put(fake)  # type: ignore[arg-type]
    sent = [threading.Event() for _ in range(3)]
    with ThreadPoolExecutor(3) as threads:
        first = threads.submit(pool.call, {"id": 0}, 1, 1.0, sent[0].set)
        assert sent[0].wait(5)
        second = threads.submit(pool.call, {"id": 1}, 1, 1.0, sent[1].set)
        assert sent[1].wait(5)
        assert [f.requests for f in fakes] == [1, 1]  # two requests in flight, one per worker
        third = threads.submit(pool.call, {"id": 2}, 1, 1.0, sent[2].set)
        assert sent[2].wait(5)  # all busy: told at once, so the caller parses meanwhile
        for fake in fakes:
            fake.release.set()
        assert [f.result()["id"] for f in (first, second, third)] == [0, 1, 2]
    assert pool.requests == 3


def test_a_pool_of_two_real_tokenizer_workers_gives_the_answers_of_one(tokenscan_corpus, tmp_path, monkeypatch):
    dirs = distinct_copies(tokenscan_corpus.benign, tmp_path, 8)
    sc.default_resources().behaviour.clear()
    one = [(s.findings, s.token_ids_digest) for s in sc.scan_paths(dirs, POLICY, with_manifest=False)]
    pool = ct._WorkerPool(2, tbe.CHILD, tbe.CHILD_ENV, ("tokenizers", "sentencepiece"))
    monkeypatch.setattr(tbe, "_WORKERS", pool)
    sc.default_resources().behaviour.clear()
    try:
        two = [(s.findings, s.token_ids_digest) for s in sc.scan_paths(dirs, POLICY, with_manifest=False)]
    finally:
        pool.stop()
    assert two == one and all(digest for _findings, digest in two)
    assert pool.requests == 8 and all(w.proc is None for w in pool.workers)


EVIL_CONFIG = {"auto_map": {"AutoModel": "evil.M"}}  # TS101: code from the repository runs on load


class ParentSwap:
    """The reviewer's race, made deterministic: ``root/sub`` is a directory that an attacker
    swaps with ``rename(2)`` between two copies, benign (A: ``{}``) and malicious (B: TS101).
    The files' own inode, ctime and link count do not change; only their parent does."""

    def __init__(self, base: Path) -> None:
        self.root, self.a, self.b = base / "root", base / "stash-a", base / "stash-b"
        for d in (self.root, self.a, self.b):
            d.mkdir()
        (self.a / "config.json").write_text("{}")
        (self.b / "config.json").write_text(json.dumps(EVIL_CONFIG))
        for p in (self.a / "config.json", self.b / "config.json"):
            os.utime(p, (1, 1))
        os.rename(self.b, self.root / "sub")  # B in place

    def put(self, which: str) -> None:
        """Puts copy ``which`` ("A" or "B") at ``root/sub``."""
        current = "B" if self.a.exists() else "A"
        if current != which:
            os.rename(self.root / "sub", self.b if current == "B" else self.a)
            os.rename(self.a if which == "A" else self.b, self.root / "sub")


def _hooks(swap: ParentSwap, order: str) -> dict[str, object]:
    """Scanner functions wrapped so that each step sees the copy ``order`` names for it."""
    walk, hash_, analyse = analysis.walk, analysis.hash_listing, analysis.analyse

    def listing(root: str) -> object:
        out = walk(root)
        swap.put("A")  # the listing saw B; the stat before hashing sees A
        return out

    def hashing(snap, files, cache) -> None:
        swap.put("B")
        hash_(snap, files, cache)
        swap.put("A")  # the hash read B; the reader and the stat after the checks see A

    def reading(*args):
        swap.put("A")
        try:
            return analyse(*args)
        finally:
            swap.put("B")  # only the reader saw A; the listing, both stats and the hash saw B

    def reading_b(*args):
        swap.put("B")
        try:
            return analyse(*args)
        finally:
            swap.put("A")  # only the reader saw B

    if order == "hash-B-read-A":
        return {"walk": listing, "hash_listing": hashing}
    if order == "read-A-only":
        return {"analyse": reading}
    swap.put("A")
    return {"analyse": reading_b}


@pytest.mark.parametrize("order", ["hash-B-read-A", "read-A-only", "read-B-only"])
@pytest.mark.parametrize("cached", [False, True], ids=["rehash", "stat-cache"])
def test_a_parent_directory_swapped_under_the_scan_stores_no_verdict(tmp_path, settled_now, monkeypatch, order, cached):
    """The listing and the hashing see one copy of ``sub/``, the analysis reads the other: the
    scan's own result stands, nothing is stored, and the next scan of the malicious copy raises
    its finding (before the fix, the clean verdict of A was stored under B's key and served)."""
    swap = ParentSwap(tmp_path)
    root, hash_cache = str(swap.root), HashCache() if cached else None
    sc.default_resources().scans.clear()
    for name, hook in _hooks(swap, order).items():
        monkeypatch.setattr(analysis, name, hook)
    raced = sc.scan_directory(root, POLICY, hash_cache=hash_cache)
    monkeypatch.undo()
    monkeypatch.setattr(mf, "RACY_NS", 0)
    expected = {"TS101"} if order == "read-B-only" else set()  # what the reader read
    assert {f.id for f in raced.findings} == expected and not raced.errors
    assert len(sc.default_resources().scans) == 0  # nothing is stored for a scan that read other files than it hashed
    swap.put("B")
    again = sc.scan_directory(root, POLICY, hash_cache=hash_cache)
    assert {f.id for f in again.findings} == {"TS101"} and again.outcome(sc.Severity.HIGH) == 1
    assert sc.scan_directory(root, POLICY, hash_cache=hash_cache).findings == again.findings  # stored now
    assert len(sc.default_resources().scans) == 1
    swap.put("A")
    assert sc.scan_directory(root, POLICY, hash_cache=hash_cache).findings == []


def test_a_file_changed_while_it_is_hashed_is_not_trusted(tmp_path, settled_now, monkeypatch):
    """The ``fstat`` of the descriptor hashed, after the read, differs from before it: the digest
    may be of no version of the file; it is neither remembered nor used for a verdict."""
    path = tmp_path / "config.json"
    path.write_text("{}")
    os.utime(path, (1, 1))
    cache = HashCache()
    real_fstat, calls = os.fstat, []

    def fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        calls.append(fd)
        if len(calls) == 2:  # the fstat after the read: a write landed meanwhile (new ctime)
            names = ("st_mode", "st_dev", "st_ino", "st_size", "st_mtime_ns")
            return SimpleNamespace(**{n: getattr(st, n) for n in names}, st_ctime_ns=st.st_ctime_ns + 1)
        return st

    monkeypatch.setattr(mf.os, "fstat", fstat)
    _sha, size, key = mf.hash_file_keyed(str(path), cache)
    assert key is None and len(cache) == 0 and size == 2
    monkeypatch.undo()
    monkeypatch.setattr(mf, "RACY_NS", 0)
    assert mf.hash_file_keyed(str(path), cache)[2] is not None and len(cache) > 0


@pytest.mark.parametrize("status", ["changed", "crashed"])
def test_a_tokenizer_the_child_saw_changed_is_retried_not_remembered(fresh_benign, settled_now, monkeypatch, status):
    """The child refuses content that is not the digest's ("changed"), or crashed: reported by
    this scan, kept in no cache (the answer, its judgement, the verdict), so the next scan
    exercises the tokenizer again and judges its real answer."""
    root = str(fresh_benign)
    for memo in (sc.default_resources().judged, sc.default_resources().behaviour, sc.default_resources().scans):
        memo.clear()
    monkeypatch.setattr(tbe, "run", lambda *a, **k: {"status": status, "message": "test"})
    assert sc.scan_directory(root, POLICY).findings  # the child could not load what was hashed
    assert len(sc.default_resources().scans) == 0 and len(sc.default_resources().behaviour) == 0
    monkeypatch.undo()
    monkeypatch.setattr(mf, "RACY_NS", 0)
    assert sc.scan_directory(root, POLICY).findings == []
    assert len(sc.default_resources().scans) == 1
