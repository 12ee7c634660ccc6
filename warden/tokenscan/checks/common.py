"""Helpers the checks share: walking JSON keys, naming files. Pure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from warden.tokenscan.snapshot import JsonDoc, Snapshot

MAX_DEPTH = 12


def walk_keys(obj: Any, recursive: bool = True, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, str, Any]]:
    """(dotted key path, key, value) of every key of ``obj``; nested dicts and lists of dicts
    too when ``recursive`` (``text_config.auto_map``, ``templates[1].name``)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, str(key), value
            if recursive:
                yield from walk_keys(value, True, path, depth + 1)
    elif isinstance(obj, list) and recursive and depth:
        for i, value in enumerate(obj):
            yield from walk_keys(value, True, f"{prefix}[{i}]", depth + 1)


def doc_keys(doc: JsonDoc) -> Iterator[tuple[str, str, Any]]:
    """Keys of a parsed document: all levels for config-like files, the top level for data files."""
    yield from walk_keys(doc.data, recursive=doc.config)


def strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string inside ``value`` (dict values and keys, list items)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from strings_in(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v, depth + 1)


def basename(rel: str) -> str:
    return os.path.basename(rel)


def named(snap: Snapshot, *names: str) -> Iterator[JsonDoc]:
    """Parsed JSON objects whose file name (at any depth) is one of ``names``."""
    for doc in snap.configs():
        if basename(doc.rel) in names:
            yield doc


def short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
