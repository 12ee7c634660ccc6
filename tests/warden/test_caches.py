"""warden.caches.LRUCache: bounded by count and by estimated bytes, least recently used first
out, thread-safe, single flight."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from warden.caches import LRUCache


def test_eviction_by_count_forgets_the_least_recently_used():
    cache: LRUCache[str, int] = LRUCache(3)
    for i, key in enumerate("abcd"):
        assert cache.put(key, i)
    assert cache.keys() == ["b", "c", "d"] and len(cache) == 3
    assert cache.get("a") is None and "a" not in cache
    assert cache.get("b") == 1


def test_recency_order_follows_get_and_put_but_not_peek_or_contains():
    cache: LRUCache[str, int] = LRUCache(3)
    for i, key in enumerate("abc"):
        cache.put(key, i)
    assert cache.get("a") == 0  # a is now the most recently used
    assert cache.keys() == ["b", "c", "a"]
    assert cache.peek("b") == 1 and "b" in cache  # neither refreshes b
    assert cache.keys() == ["b", "c", "a"]
    cache.put("c", 20)  # replacing a value uses it
    assert cache.keys() == ["b", "a", "c"] and cache.peek("c") == 20 and len(cache) == 3
    cache.put("d", 3)
    assert cache.keys() == ["a", "c", "d"]  # b, least recently used, went first
    assert cache.get("zz", -1) == -1 and cache.peek("zz", -2) == -2


def test_eviction_by_bytes_and_a_value_over_the_bound_is_not_kept():
    cache: LRUCache[str, str] = LRUCache(100, max_bytes=100)
    assert cache.put("a", "x", 40) and cache.put("b", "y", 40)
    assert cache.nbytes == 80
    assert cache.put("c", "z", 40)  # 120 > 100: a goes
    assert cache.keys() == ["b", "c"] and cache.nbytes == 80
    cache.get("b")
    assert cache.put("d", "w", 60)  # c is the least recently used now: it goes, b stays
    assert cache.keys() == ["b", "d"] and cache.nbytes == 100
    assert cache.put("e", "v", 70)  # b, then d: 70 alone fits
    assert cache.keys() == ["e"] and cache.nbytes == 70
    assert not cache.put("huge", "h", 101)  # heavier than the whole bound: returned False, not kept
    assert "huge" not in cache and cache.keys() == ["e"]
    assert cache.put("e", "v2", 10) and cache.nbytes == 10  # a replaced value's bytes are its new ones
    assert not cache.put("e", "v3", 500) and "e" not in cache and cache.nbytes == 0


def test_count_only_cache_ignores_sizes():
    cache: LRUCache[int, int] = LRUCache(2)
    assert cache.put(1, 1, 1 << 60) and cache.put(2, 2, 1 << 60)
    assert cache.keys() == [1, 2]


def test_pop_and_clear_keep_the_byte_count_right():
    cache: LRUCache[str, int] = LRUCache(10, max_bytes=1000)
    cache.put("a", 1, 100)
    cache.put("b", 2, 200)
    assert cache.pop("a") == 1 and cache.pop("a") is None and cache.nbytes == 200
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.keys() == []


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        LRUCache(0)
    with pytest.raises(ValueError):
        LRUCache(1, max_bytes=-1)


def test_get_or_make_makes_each_key_once_under_concurrency():
    cache: LRUCache[str, str] = LRUCache(8, max_bytes=100)
    made, gate = [], threading.Event()

    def make() -> str:
        gate.wait(5)
        made.append(1)
        return "parsed"

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(cache.get_or_make, "d1", make) for _ in range(6)]
        gate.set()
        assert [f.result() for f in futures] == ["parsed"] * 6
    assert made == [1]  # one make for six concurrent callers
    assert cache.get_or_make("big", lambda: "x", nbytes=60) == "x"
    assert cache.get_or_make("big2", lambda: "y", nbytes=lambda v: 60) == "y"  # over the bytes: the oldest goes
    assert cache.peek("big") is None and cache.peek("big2") == "y"
    answers: LRUCache[str, dict[str, str]] = LRUCache(8)
    crashed = {"status": "crashed"}
    assert answers.get_or_make("r", lambda: crashed, keep=lambda a: a["status"] != "crashed") is crashed
    assert "r" not in answers  # returned, not kept: the next call makes it again


def test_get_or_make_hands_a_failed_make_to_the_next_caller():
    cache: LRUCache[str, int] = LRUCache(4)
    started, release = threading.Event(), threading.Event()

    def failing() -> int:
        started.set()
        release.wait(5)
        raise RuntimeError("maker failed")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.get_or_make, "k", failing)
        assert started.wait(5)
        second = pool.submit(cache.get_or_make, "k", lambda: 7)  # waits for the first maker
        release.set()
        with pytest.raises(RuntimeError):
            first.result()
        assert second.result() == 7
    assert cache.get("k") == 7


def test_concurrent_use_keeps_the_bounds_and_the_accounting():
    cache: LRUCache[int, int] = LRUCache(50, max_bytes=2000)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                key = rng.randrange(200)
                op = rng.random()
                if op < 0.4:
                    cache.put(key, key, rng.randrange(100))
                elif op < 0.7:
                    value = cache.get(key)
                    assert value is None or value == key
                elif op < 0.9:
                    assert cache.get_or_make(key, lambda k=key: k, nbytes=rng.randrange(100)) == key
                else:
                    cache.pop(key)
                assert len(cache) <= 50 and cache.nbytes <= 2000
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert len(cache) == len(cache.keys()) <= 50
    assert cache.nbytes == sum(size for _value, size in cache._items.values()) <= 2000
