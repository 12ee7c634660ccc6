"""The offline asset cache: processes that build the same assets at once (the ranks of one
torchrun) all get a complete build, built once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def test_builders_side_by_side_share_one_complete_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-c", BUILD, str(cache)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err.decode()[-2000:] for _, err in outputs]
    [paths] = {out.decode().strip() for out, _ in outputs}
    built = json.loads(paths)
    config = json.loads(Path(built["model_dir"], "config.json").read_text())
    assert config["model_type"] == "llama"
    assert Path(built["tokenizer_dir"], "tokenizer.json").is_file()
    [build_dir] = [d for d in cache.iterdir() if d.is_dir()]
    assert (build_dir / "assets.json").is_file()
