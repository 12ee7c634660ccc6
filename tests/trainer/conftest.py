from __future__ import annotations

import copy

import pytest
import yaml

TEST_CONFIG = {
    "version": 1,
    "run": {"seed": 3, "device": "cpu", "metrics_port": 0, "torch_threads": 1, "console": False},
    "model": {
        "tiny": {
            "vocab_size": 300,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 128,
            "num_prompts": 64,
        }
    },
    "reward": {"kind": "rule", "rule": "digits"},
    "rollout": {"n": 2, "max_new_tokens": 8, "progress": False},
    "algorithm": {"kl_coef": 0.001, "kl_kind": "k3"},
    "ppo": {
        "train_batch_size": 8,
        "mini_batch_size": 8,
        "micro_batch_size": 4,
        "epochs": 2,
        "actor_lr": 3.0e-3,
        "critic_lr": 3.0e-3,
    },
    "snapshot": {"top_k": 3},
    "checkpoint": {"every_steps": 2, "keep_last": 3},
    "max_steps": 4,
}


def merge(base, extra):
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


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
