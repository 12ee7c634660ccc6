"""The scanner's caches and pools are a ScanResources: built by the caller or, once, on first
use; importing the scanner builds none of them and starts no thread."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from warden.tokenscan import manifest as mf
from warden.tokenscan import resources
from warden.tokenscan import scanner as sc
from warden.tokenscan.policy import default_policy

IMPORT_ONLY = """
import gc, threading
from concurrent.futures import ThreadPoolExecutor
before = threading.active_count()
import warden.tokenscan
import warden.tokenscan.scanner
from warden.tokenscan import resources
pools = sum(isinstance(o, ThreadPoolExecutor) for o in gc.get_objects())
made = sum(isinstance(o, resources.ScanResources) for o in gc.get_objects())
print(before, threading.active_count(), pools, made, resources._default is None)
"""


def test_importing_the_scanner_starts_no_thread_and_builds_no_pool_or_cache():
    result = subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1", "0", "0", "True"]


def test_the_default_is_made_once_on_first_use():
    first = resources.default_resources()
    assert resources.default_resources() is first and sc.default_resources() is first


def test_a_scan_uses_the_resources_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(mf, "RACY_NS", 0)  # the file below counts as settled: its verdict is stored
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    mine = resources.ScanResources()
    policy = default_policy()
    default_before = len(resources.default_resources().scans)
    first = sc.scan_directory(str(tmp_path), policy, resources=mine)
    assert len(mine.scans) == 1 and len(resources.default_resources().scans) == default_before
    (again,) = sc.scan_paths([str(tmp_path)], policy, resources=mine)  # served from the stored verdict
    assert (again.findings, again.files, again.manifest) == (first.findings, first.files, first.manifest)
    assert mine._pool is None  # no tokenizer was exercised: the request pool was never made
    mine.clear()
    assert len(mine.scans) == 0


def test_the_tokenizer_pool_is_made_on_first_use_and_closed():
    mine = resources.ScanResources(tokenizer_threads=2)
    assert mine._pool is None
    pool = mine.tokenizer_pool()
    assert mine.tokenizer_pool() is pool and pool.submit(lambda: 7).result() == 7
    mine.close()
    assert mine._pool is None
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 8)  # shut down; the next tokenizer_pool() call makes a new one
