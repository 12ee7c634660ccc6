"""The offline asset cache: processes that build the same assets at once (the ranks of one
torchrun) all get one complete build, and a builder waits for the one already building."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BUILD = """
import json, sys
from trainer.assets import ensure_tiny_assets
from trainer.config import TinyAssets
spec = TinyAssets(cache_dir=sys.argv[1], vocab_size=300, hidden_size=16, num_layers=1, num_heads=2,
                  intermediate_size=32, num_prompts=8)
paths = ensure_tiny_assets(spec)
print(json.dumps(paths.__dict__))
"""
ROOT = Path(__file__).resolve().parents[2]


def builder(cache: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", BUILD, str(cache)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def waiting_on_a_lock(pid: int) -> bool:
    """True while ``pid`` is blocked on a flock (a ``->`` line of /proc/locks)."""
    return any("->" in line and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines())


def test_builders_side_by_side_share_one_complete_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = [builder(cache) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err.decode()[-2000:] for _, err in outputs]
    [paths] = {out.decode().strip() for out, _ in outputs}
    built = json.loads(paths)
    assert json.loads(Path(built["model_dir"], "config.json").read_text())["model_type"] == "llama"
    assert Path(built["tokenizer_dir"], "tokenizer.json").is_file()
    [build_dir] = [d for d in cache.iterdir() if d.is_dir()]
    assert (build_dir / "assets.json").is_file()


def test_a_builder_waits_for_the_one_building_and_keeps_its_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = builder(cache)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()[-2000:]
    build_dir = Path(json.loads(out)["model_dir"]).parent
    marker = build_dir / "assets.json"
    saved = marker.read_bytes()
    marker.unlink()  # incomplete again: the next builder must build, once it holds the lock
    with open(str(build_dir) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a rank that is building
        second = builder(cache)
        deadline = time.monotonic() + 120
        while not waiting_on_a_lock(second.pid):
            assert second.poll() is None, second.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the second builder never waited on the lock"
            time.sleep(0.05)
        (build_dir / "sentinel").write_text("built by the lock holder")
        marker.write_bytes(saved)  # the holder's build completes
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err.decode()[-2000:]
    assert (build_dir / "sentinel").is_file()  # found complete after the wait: not rebuilt
