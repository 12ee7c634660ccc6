"""Fixtures of the Grafana tests: the committed dashboards and the generator module (its SDK-model check)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import IN_CI, ROOT

GRAFANA = Path(ROOT) / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"


def need(message: str) -> None:
    """Fails under CI=true, skips elsewhere."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def promql() -> ModuleType:
    """The ``promql_parser`` module (PyPI ``promql-parser``)."""
    try:
        import promql_parser
    except ImportError:
        need("promql-parser is not installed (pip install promql-parser; it is in the test extra)")
    return promql_parser


@pytest.fixture(scope="session")
def generator() -> ModuleType:
    """``grafana/generate.py`` imported as a module (it is a script, not a package); it needs the
    ``dashboards`` extra (grafana-foundation-sdk)."""
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        need("grafana-foundation-sdk is not installed (pip install -e '.[dashboards]'; it is in the dev extra)")
    spec = importlib.util.spec_from_file_location("warden_grafana_generate", GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def dashboards() -> dict[str, dict[str, Any]]:
    """The committed dashboards by file name."""
    files = sorted(DASHBOARD_DIR.glob("*.json"))
    assert files, f"no dashboards in {DASHBOARD_DIR}"
    return {f.name: json.loads(f.read_text()) for f in files}
