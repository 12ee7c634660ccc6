"""`warden demo`, the README's first command, end to end (short run)."""

from __future__ import annotations

import re

import pytest
from support import run_warden

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_demo_runs_the_whole_mission_and_explains_it(tmp_path):
    result = run_warden("demo", "--run-dir", str(tmp_path / "demo"), "--steps", "6", timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "step 6 |" in out and "status completed" in out
    assert re.search(r"signatures\s+(\d+)/\1 checkpoints signed and verified", out), out[-2000:]
    assert re.search(
        r"archive\s+6 records archived to .*audit of step \d+: verified; chain of the run: verified", out
    ), out[-2000:]
    assert re.search(r"tokenizer\s+clean: ", out)
    assert re.search(r"paths\s+2/2 watched paths healthy", out)
    assert re.search(r"alerts\s+", out) and "Where to look next:" in out
    assert "warden events tail --run-dir" in out
