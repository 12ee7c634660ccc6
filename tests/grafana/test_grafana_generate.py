"""Dashboards are code: grafana/generate.py reproduces the committed files byte for byte."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support import ROOT

GRAFANA = Path(ROOT) / "grafana"


def run_generate(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = where / "generate.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_grafana_generate_check_matches_committed_files():
    result = run_generate(GRAFANA, "--check")
    assert result.returncode == 0, result.stderr


def test_grafana_render_is_byte_stable_and_matches(generator):
    first, second = generator.render(), generator.render()
    assert first == second
    for path, text in first.items():
        assert path.read_bytes() == text.encode(), f"{path} is stale: run python grafana/generate.py"
        assert text.endswith("}\n") or text.endswith("]\n")


def test_grafana_dashboard_dir_holds_only_generated_files(generator):
    """The provider loads every file there, so nothing hand-made or left over may sit beside them."""
    generated = sorted(name for name in generator.DASHBOARDS)
    assert sorted(p.name for p in (GRAFANA / "dashboards").iterdir()) == generated


def test_grafana_check_names_a_stale_file_and_regenerate_fixes_it(tmp_path):
    copy = tmp_path / "grafana"
    shutil.copytree(GRAFANA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    board = copy / "dashboards" / "trainer.json"
    board.write_text(board.read_text().replace('"Reward"', '"Rewards"', 1))
    (copy / "metrics-used.json").unlink()

    result = run_generate(copy, "--check")
    assert result.returncode == 1
    assert "dashboards/trainer.json" in result.stderr and "metrics-used.json" in result.stderr
    assert "overview.json" not in result.stderr

    assert run_generate(copy).returncode == 0
    assert run_generate(copy, "--check").returncode == 0
    assert board.read_bytes() == (GRAFANA / "dashboards" / "trainer.json").read_bytes()
    assert not list(copy.rglob(".*.tmp"))


def test_grafana_expand_variables(generator):
    expr = 'rate(x{instance=~"$instance", job="${job}"}[$__rate_interval]) + increase(y[${__range}])'
    assert generator.expand_variables(expr) == 'rate(x{instance=~"x", job="x"}[5m]) + increase(y[5m])'
