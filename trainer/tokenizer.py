"""The trainer's one tokenizer-loading function, fail-closed.

Before anything is imported from the directory: no ``auto_map`` in its JSON configs, a
``tokenizer_class`` exactly on the whitelist, no ``TRUST_REMOTE_CODE`` in the
environment. Then ``trust_remote_code=False``, ``local_files_only=True``,
``HF_HUB_OFFLINE=1`` and an absolute path; the loaded class is checked again.
(The tokenscan sidecar issue adds its full scan here.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from sidecars.errors import ViolationError

CONFIG_FILES = ("tokenizer_config.json", "config.json", "processor_config.json", "preprocessor_config.json")


class UnsafeTokenizer(ViolationError):
    """The tokenizer directory fails a guard; the message names the file and key."""


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise UnsafeTokenizer(f"{path}: not valid JSON ({exc}); refusing to load") from None
    return obj if isinstance(obj, dict) else None


def check_tokenizer_dir(path: str, allowed_classes: Iterable[str]) -> None:
    """Raises UnsafeTokenizer when ``path`` must not be loaded."""
    allowed = set(allowed_classes)
    if not os.path.isabs(path):
        raise UnsafeTokenizer(f"{path}: tokenizer path must be absolute")
    if os.environ.get("TRUST_REMOTE_CODE"):
        raise UnsafeTokenizer("TRUST_REMOTE_CODE is set in the environment; unset it, remote code is never run")
    for name in CONFIG_FILES:
        where = os.path.join(path, name)
        cfg = _read_json(where)
        if cfg is None:
            continue
        if "auto_map" in cfg:
            raise UnsafeTokenizer(f"{where}: auto_map: custom code references are refused; remove the key")
        cls = cfg.get("tokenizer_class")
        if cls is not None and cls not in allowed:
            raise UnsafeTokenizer(
                f"{where}: tokenizer_class: {cls!r} is not on the whitelist ({', '.join(sorted(allowed))})"
            )


def load_tokenizer(path: str, allowed_classes: Iterable[str]) -> Any:
    """Loads a tokenizer through the guard. Raises UnsafeTokenizer."""
    allowed = tuple(allowed_classes)
    check_tokenizer_dir(path, allowed)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    name = type(tokenizer).__name__
    if name not in allowed:
        raise UnsafeTokenizer(f"{path}: loaded class {name} is not on the whitelist")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
