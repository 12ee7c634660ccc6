"""bench/bench_hashing.py without its optional comparisons installed: one line each, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_blake3_and_model_signing_leave_their_rows_out_with_a_line(tmp_path):
    # blake3 and model_signing are installed here, so modules of those names that fail to import
    # (what an absent package does) are put first on sys.path: a stand-in for uninstalling them.
    hidden = tmp_path / "hidden"
    (hidden / "model_signing").mkdir(parents=True)
    (hidden / "blake3.py").write_text("raise ModuleNotFoundError(\"No module named 'blake3'\")\n")
    (hidden / "model_signing" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'model_signing'\")\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden), str(REPO)])}
    args = ["--size-mb", "8", "--repeat", "1", "--workers", "2", "--shard-sizes", "2097152", "--tmp", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_hashing.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert "blake3 is not installed (No module named 'blake3'; pip install blake3): the blake3 row left out" in out
    assert "model_signing.hashing is not installed" in out and "its API rows left out" in out
    assert "blake3" not in done.stdout  # the table has no blake3 row
    assert "warden hash, files " in done.stdout and "warden verify, files " in done.stdout
