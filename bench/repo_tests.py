"""Binds the name ``tests`` to this repository's ``tests/`` before a benchmark imports its builders.

``tests/`` is a namespace package (no ``__init__.py``; pytest imports it in importlib mode), and a
*regular* package of the same name anywhere on ``sys.path`` wins over a namespace package whatever
the order: verl 0.9.1's wheel installs one (``site-packages/tests``), so ``from tests.warden import
...`` found verl's tests instead of ours.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def use_repo_tests(root: str | Path) -> None:
    """Makes ``import tests...`` resolve below ``root/tests`` (idempotent)."""
    spec = importlib.machinery.PathFinder.find_spec("tests", [str(root)])
    if spec is None:
        raise SystemExit(f"{root}/tests: not found (run the benchmark from a checkout)")
    current = sys.modules.get("tests")
    if current is not None and list(getattr(current, "__path__", [])) == list(spec.submodule_search_locations or []):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["tests"] = module
