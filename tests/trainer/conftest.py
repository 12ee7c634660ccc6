from __future__ import annotations

import pytest
import yaml
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
