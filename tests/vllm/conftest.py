"""Fixtures for the vLLM rollout engine tests.

Tests that need vLLM call ``require_vllm()`` fixture first: without vLLM they skip (the
main ``make test`` environment has no vllm), except in CI's vllm stage
(``WARDEN_VLLM_STAGE=1``, set by ``make test-vllm``), where a missing vllm is a failure.
"""

from __future__ import annotations

import os

import pytest
import yaml
from support import TEST_CONFIG, merge

# The trainer tests' tiny config with the vllm engine and no checkpoints.
VLLM_CONFIG = merge(
    TEST_CONFIG,
    {"rollout": {"engine": "vllm", "enforce_eager": True}, "checkpoint": {"every_steps": 0}, "max_steps": 4},
)


@pytest.fixture
def require_vllm():
    """Skips without vLLM; fails instead in the vllm CI stage (WARDEN_VLLM_STAGE=1).

    This folder is itself importable as a namespace package ``vllm`` (tests/ is on sys.path),
    so only a module with a ``__file__`` counts as the real vLLM.
    """
    if os.environ.get("WARDEN_VLLM_STAGE") == "1":
        import vllm  # a missing vllm is an error in the stage that exists to run these tests

        assert getattr(vllm, "__file__", None), f"vllm is not installed (found only {vllm.__path__})"
        return vllm
    vllm = pytest.importorskip("vllm", reason="the vllm extra is not installed here (make test-vllm runs these)")
    if getattr(vllm, "__file__", None) is None:
        pytest.skip("the vllm extra is not installed here (make test-vllm runs these)")
    return vllm


@pytest.fixture(scope="session")
def vllm_assets(tmp_path_factory):
    """The tiny offline Llama, tokenizer and prompts, built once for the session."""
    from trainer.assets import ensure_tiny_assets
    from trainer.config import TinyAssets

    cache = tmp_path_factory.mktemp("vllm-tiny-assets")
    spec = TinyAssets(cache_dir=str(cache), **VLLM_CONFIG["model"]["tiny"])
    return cache, ensure_tiny_assets(spec)


@pytest.fixture
def vllm_config(vllm_assets, tmp_path):
    """vllm_config(extra) -> TrainerConfig for the tiny model with the vllm engine, merged with ``extra``."""
    from trainer.config import load_config

    cache, _ = vllm_assets

    def build(extra=None, name="vllm.yaml"):
        raw = merge(VLLM_CONFIG, {"model": {"tiny": {"cache_dir": str(cache)}}})
        raw = merge(raw, extra or {})
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        return load_config(str(path))

    return build
