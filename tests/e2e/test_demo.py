"""`warden demo`, the README's first command, end to end (short run)."""

from __future__ import annotations

import re
import shlex

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
    assert re.search(r"paths\s+3/3 watched paths healthy", out)
    assert re.search(
        r"staged alert\s+WardenPathUnreachable \(critical\) fired [\d.]+ s after .* was removed; "
        r"resolved [\d.]+ s after it was restored",
        out,
    ), out[-2000:]
    # Warden passes its own audit (the make venv against the development lock), and nothing but the
    # staged alert fired, which resolved (issue 32: WardenDepsDrift and WardenShadowAbsent fired).
    assert re.search(r"deps\s+clean: \d+ distributions checked against the lock; 0 drifting, 0 tampered", out)
    alerts_line = re.search(r"^\s+alerts\s+(.*)$", out, re.M)
    assert alerts_line and alerts_line.group(1) == "none fired (Watchdog heartbeat only)", out[-2000:]
    assert "Where to look next:" in out and "warden events tail --run-dir" in out
    # Every command the summary prints works after the demo has stopped its services.
    printed = re.findall(r"^\s+(?:journal|verify|audit|chain)\s+(warden .+?)\s*$", out, re.M)
    assert len(printed) == 4, printed
    for line in printed:
        after = run_warden(*shlex.split(line)[1:], timeout=120)
        assert after.returncode == 0, (line, after.stdout[-1000:], after.stderr[-1000:])
