from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml
from faults import mounted, need
from support import TEST_CONFIG, merge

# The trainer (torch, transformers) is the `train` extra; without it these tests skip, never error.
pytest.importorskip("torch", reason="needs the train extra: pip install 'warden[train]'")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One offline asset build shared by every trainer test."""
    from trainer.assets import ensure_tiny_assets
    from trainer.config import TinyAssets

    cache = tmp_path_factory.mktemp("tiny-assets")
    spec = TinyAssets(cache_dir=str(cache), **{k: v for k, v in TEST_CONFIG["model"]["tiny"].items()})
    return cache, ensure_tiny_assets(spec)


@pytest.fixture
def make_config(tiny_cache, tmp_path):
    """make_config(**sections) -> (TrainerConfig, path of the YAML it came from)."""
    from trainer.config import load_config

    cache, _ = tiny_cache

    def build(extra=None, name="test.yaml"):
        raw = merge(TEST_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}})
        raw = merge(raw, extra or {})
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        return load_config(str(path)), str(path)

    return build


@pytest.fixture
def small_fs(tmp_path):
    """small_fs(size) -> the path of a fresh tmpfs of ``size`` bytes (the kernel rounds up to pages), for a
    real ENOSPC. Each is unmounted at teardown (lazily if busy) and the teardown fails if one stays mounted.
    Needs mount(8) permission (root): skipped without it locally, failed under CI=true."""
    points: list[str] = []

    def make(size: int) -> str:
        point = os.path.realpath(tmp_path / f"small-fs-{len(points)}")  # mountinfo lists the real path
        os.mkdir(point)
        refused = _mount_tmpfs(point, size)
        need(refused is None, f"mount -t tmpfs not permitted here: {refused}")
        points.append(point)
        return point

    yield make
    left = [point for point in reversed(points) if not _unmount(point)]
    assert left == [], f"small_fs: still mounted after umount and umount -l: {left}"


def _mount_tmpfs(point: str, size: int) -> str | None:
    """Mounts a ``size``-byte tmpfs on ``point``; None when done, else why not."""
    mount = shutil.which("mount")
    if mount is None:
        return "no mount(8)"
    options = f"size={int(size)},mode=0755,nosuid,nodev"
    result = subprocess.run(
        [mount, "-t", "tmpfs", "-o", options, "tmpfs", point], capture_output=True, text=True, timeout=30
    )
    return None if result.returncode == 0 and mounted(point) else (result.stderr.strip() or "not in the mount table")


def _unmount(point: str) -> bool:
    """Unmounts ``point``; a busy mount (a test kept a file open) is detached lazily. True once it is gone."""
    for args in (["umount", point], ["umount", "-l", point]):
        if not mounted(point):
            return True
        subprocess.run(args, capture_output=True, timeout=30)
    return not mounted(point)
