"""TRL for the integration tests: imported so that ``tests/vllm`` (a folder of Warden's vLLM tests,
which a ``tests`` entry on ``sys.path`` makes a PEP 420 namespace package named ``vllm``) is not taken
for an installed vLLM.

TRL 1.16's ``_is_package_available`` treats any importable name as installed and then fails to parse
the version of a namespace package ("Invalid version: 'N/A'") while importing ``GRPOTrainer``;
transformers' own check already treats such a namespace package as absent, and so does this one.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _namespace_only(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin in (None, "namespace") and spec.submodule_search_locations is not None


def import_trl() -> Any:
    """The ``trl`` module with its GRPO trainer importable under pytest's ``sys.path``."""
    import trl.import_utils as utils

    original = utils._is_package_available
    if not getattr(original, "warden_namespace_aware", False):

        def available(pkg_name: str, return_version: bool = False) -> Any:
            if _namespace_only(pkg_name):
                return (False, "N/A") if return_version else False
            return original(pkg_name, return_version)

        available.warden_namespace_aware = True  # type: ignore[attr-defined]
        utils._is_package_available = available
    import trl

    return trl
