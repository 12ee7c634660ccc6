"""Issue 18 speed: a rescan of unchanged directories reuses their verdicts (no parse, no sandbox
request), and never reuses one when anything it depends on changed: a file's content (even
rewritten with its size and mtime restored), the policy; nor one that a crash or a budget cut
short, nor one of files changed so recently that a change could hide in one timestamp tick."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from warden.tokenscan import chat_template as ct
from warden.tokenscan import manifest as mf
from warden.tokenscan import scanner as sc
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.manifest import HashCache
from warden.tokenscan.policy import default_policy

POLICY = default_policy()


def requests() -> tuple[int, int]:
    """Sandbox requests sent so far: (tokenizer child, template child)."""
    return tbe._WORKERS.requests, ct._WORKER.requests


@pytest.fixture
def settled_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled (their change is not within a tick of now)."""
    monkeypatch.setattr(mf, "RACY_NS", 0)


def distinct_copies(benign: Path, root: Path, count: int) -> list[str]:
    """``count`` copies of ``benign`` whose tokenizer.json and template differ in bytes (trailing
    whitespace, a Jinja comment), so no two share a content cache entry."""
    text = (benign / "tokenizer.json").read_text(encoding="utf-8")
    template = (benign / "chat_template.jinja").read_text(encoding="utf-8")
    out = []
    for i in range(count):
        d = root / f"tok-{i:03d}"
        shutil.copytree(benign, d)
        (d / "tokenizer.json").write_text(text + " " * (i + 1), encoding="utf-8")
        (d / "chat_template.jinja").write_text(template + f"{{# copy {i} #}}", encoding="utf-8")
        out.append(str(d))
    return out


def test_warm_rescans_of_50_distinct_tokenizers_make_no_sandbox_request(tokenscan_corpus, tmp_path, settled_now):
    dirs = distinct_copies(tokenscan_corpus.benign, tmp_path, 50)
    for memo in (sc.MEMO, sc.JUDGED, sc.BEHAVIOUR, sc.SCANS):
        memo.clear()  # another test may have scanned the same contents
    ct._CACHE.items.clear()
    before = requests()
    cold = sc.scan_paths(dirs, POLICY, with_manifest=True)
    assert all(s.findings == [] and not s.errors for s in cold)
    assert requests()[0] - before[0] == 50  # each distinct tokenizer was exercised once
    assert requests()[1] - before[1] == 50  # each distinct template rendered once
    sc.MEMO.clear()  # the parsed documents are not what a warm rescan needs
    sc.JUDGED.clear()
    sc.BEHAVIOUR.clear()
    cache = HashCache()
    for _ in range(2):
        warm = sc.scan_paths(dirs, POLICY, with_manifest=True, hash_cache=cache)
        assert requests() == (before[0] + 50, before[1] + 50)
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
    sc.BEHAVIOUR.clear()  # the other parameter's run exercised the same new content
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
    assert key is not None and sc.SCANS.peek("scan", key) is None
    sc.scan_directory(root, POLICY)  # the files were written just now: racily clean
    assert sc.SCANS.peek("scan", key) is None
    monkeypatch.setattr(mf, "RACY_NS", 0)
    sc.scan_directory(root, POLICY, with_manifest=False)  # no digest of every file, no key
    assert sc.SCANS.peek("scan", key) is None
    monkeypatch.setattr(tbe, "run", lambda *a, **k: {"status": "crashed", "message": "test"})
    sc.BEHAVIOUR.clear()
    sc.scan_directory(root, POLICY)
    assert sc.SCANS.peek("scan", key) is None
    monkeypatch.undo()
    monkeypatch.setattr(mf, "RACY_NS", 0)
    sc.BEHAVIOUR.clear()
    sc.scan_directory(root, POLICY)
    assert sc.SCANS.peek("scan", key) is not None


def test_racily_clean_files_are_not_remembered_by_the_hash_cache(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one")
    cache = HashCache()
    mf.hash_file(str(path), cache)
    assert not cache.items  # changed just now: hashed again next time
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
    sc.BEHAVIOUR.clear()
    one = [(s.findings, s.token_ids_digest) for s in sc.scan_paths(dirs, POLICY, with_manifest=False)]
    pool = ct._WorkerPool(2, tbe.CHILD, tbe.CHILD_ENV, ("tokenizers", "sentencepiece"))
    monkeypatch.setattr(tbe, "_WORKERS", pool)
    sc.BEHAVIOUR.clear()
    try:
        two = [(s.findings, s.token_ids_digest) for s in sc.scan_paths(dirs, POLICY, with_manifest=False)]
    finally:
        pool.stop()
    assert two == one and all(digest for _findings, digest in two)
    assert pool.requests == 8 and all(w.proc is None for w in pool.workers)
