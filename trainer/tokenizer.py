"""The trainer's one tokenizer-loading function, fail-closed.

:func:`load_tokenizer` refuses before anything is imported from the directory when
``TRUST_REMOTE_CODE`` is set in the environment, when the path is not absolute, or when
the full tokenscan scan (``warden.tokenscan``: auto_map, code files, whitelists, path
keys, links, dangerous keys, chat templates, pickles, sentencepiece, special tokens...)
reports a finding at or above the policy's ``fail_on`` severity or cannot complete. Then
it loads with ``trust_remote_code=False``, ``local_files_only=True``, ``HF_HUB_OFFLINE=1``
and the absolute path, checks the loaded class against the whitelist, and compares the
SHA-256 manifest of the directory's tokenizer files taken before the scan with one
taken after loading (a file swapped meanwhile is a time-of-check/time-of-use refusal).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from warden.errors import ViolationError, WardenError
from warden.tokenscan import Manifest, TokenscanPolicy, coerce_policy, scan_directory
from warden.tokenscan.chat_template import stop_worker
from warden.tokenscan.manifest import describe_diff
from warden.tokenscan.scanner import directory_manifest
from warden.tokenscan.tokenizer_behaviour import stop_worker as stop_tokenizer_worker

WEIGHT_EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")
MAX_LISTED = 8


class UnsafeTokenizer(ViolationError):
    """The tokenizer directory fails a guard; the message names the file and key."""


def guard_policy(allowed_classes: Iterable[str], policy: TokenscanPolicy | str | None = None) -> TokenscanPolicy:
    """``policy`` (a TokenscanPolicy, a YAML path, or None for the built-in one) whose class
    whitelist is narrowed to ``allowed_classes`` (a class must be on both lists)."""
    base = coerce_policy(policy)
    allowed = tuple(allowed_classes)
    if policy is None:
        return replace(base, allowed_tokenizer_classes=allowed)
    both = tuple(c for c in base.allowed_tokenizer_classes if c in allowed)
    return replace(base, allowed_tokenizer_classes=both)


def _tokenizer_manifest(path: str, policy: TokenscanPolicy) -> Manifest:
    try:
        return directory_manifest(path, policy, exclude_extensions=WEIGHT_EXTENSIONS)
    except (OSError, WardenError) as exc:
        raise UnsafeTokenizer(f"{path}: cannot take the manifest before loading ({exc}); refusing to load") from None


def _preconditions(path: str) -> None:
    if "TRUST_REMOTE_CODE" in os.environ:
        raise UnsafeTokenizer("TRUST_REMOTE_CODE is set in the environment; unset it, remote code is never run")
    if not os.path.isabs(path):
        raise UnsafeTokenizer(f"{path}: tokenizer path must be absolute")


def check_tokenizer_dir(path: str, allowed_classes: Iterable[str], policy: TokenscanPolicy | str | None = None) -> None:
    """Raises UnsafeTokenizer when ``path`` must not be loaded (see the module docstring)."""
    _preconditions(path)
    effective = guard_policy(allowed_classes, policy)
    try:
        result = scan_directory(path, effective, with_manifest=False)
    except (RecursionError, MemoryError) as exc:  # scan_directory contains these; belt and braces
        raise UnsafeTokenizer(f"{path}: the scan could not finish ({type(exc).__name__}); refusing to load") from None
    blocking = result.blocking(effective.fail_severity)
    if blocking:
        listed = "; ".join(f"{f.id} {f.rule.name} at {f.location}: {f.message}" for f in blocking[:MAX_LISTED])
        more = f" (+{len(blocking) - MAX_LISTED} more)" if len(blocking) > MAX_LISTED else ""
        raise UnsafeTokenizer(
            f"{path}: refusing to load, {len(blocking)} finding(s) at or above {effective.fail_on}: {listed}{more}. "
            f"Details and fixes: warden scan tokenizer {path}"
        )
    if result.errors:
        raise UnsafeTokenizer(f"{path}: scan incomplete ({'; '.join(result.errors[:3])}); refusing to load")


def load_tokenizer(path: str, allowed_classes: Iterable[str], policy: TokenscanPolicy | str | None = None) -> Any:
    """Loads a tokenizer through the guard. Raises UnsafeTokenizer (a ViolationError)."""
    allowed = tuple(allowed_classes)
    effective = guard_policy(allowed, policy)
    _preconditions(path)
    before = _tokenizer_manifest(path, effective)
    try:
        check_tokenizer_dir(path, allowed, effective)
    finally:
        stop_worker()  # no idle template or tokenizer sandbox process left beside the trainer
        stop_tokenizer_worker()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    cls = type(tokenizer)
    if cls.__name__ not in effective.allowed_tokenizer_classes or not cls.__module__.startswith("transformers."):
        raise UnsafeTokenizer(f"{path}: loaded class {cls.__module__}.{cls.__name__} is not on the whitelist")
    after = _tokenizer_manifest(path, effective)
    if after.digest != before.digest:
        raise UnsafeTokenizer(
            f"{path}: files changed while the tokenizer was being checked and loaded ({describe_diff(before, after)}); "
            "refusing to use it"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
