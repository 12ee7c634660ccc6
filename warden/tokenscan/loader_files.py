"""The files a loader reads from a directory, resolved as transformers 4.50+ and 5.x do (pure).

:func:`resolve` takes a listing (relative names) and the parsed ``tokenizer_config.json`` of each
folder, and returns one :class:`LoaderFile` per file some supported loader would open. Written
from transformers' ``PreTrainedTokenizerBase.from_pretrained`` (5.x, read in this project's
environment) and its documented 4.50+ behaviour; where the two differ both are listed:

- a tokenizer lives in the root or in any folder below it (``from_pretrained(path,
  subfolder="tokenizer")``, diffusers' ``tokenizer_2/``): every folder holding a tokenizer file
  is a root of its own;
- ``tokenizer_config.json``, ``special_tokens_map.json``, ``added_tokens.json``,
  ``chat_template.jinja``, ``chat_template.json`` (processors), ``additional_chat_templates/*.jinja``,
  ``config.json`` and ``generation_config.json`` (read by the pipeline beside the tokenizer);
- the fast tokenizer: ``tokenizer.json``, or the ``fast_tokenizer_files`` entry
  ``tokenizer.<version>.json`` of the newest version not above the loader's;
- vocabularies of slow tokenizers and converters: ``vocab.json``, ``merges.txt``, ``vocab.txt``,
  any ``*.model`` (sentencepiece, ``tiktoken.model``), ``tekken.json`` (converted when no
  ``tokenizer.json`` is there);
- 4.x only: ``vocab_file``, ``merges_file``, ``tokenizer_file`` values of the config that name a
  file of the listing (4.x let the config's value win; 5.x ignores them).

``special_tokens_map.json`` precedence: without ``added_tokens_decoder`` in the config, its
values replace the config's (both versions' legacy path); :func:`special_token_sources` says
which file wins for each token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

LOADER_VERSIONS = ((4, 50, 0), (4, 57, 0), (5, 0, 0), (5, 24, 0))  # transformers versions resolved
"""The oldest and newest of each supported major: a ``fast_tokenizer_files`` redirect is resolved
for every one, so a file only some loader reads is still scanned."""

CONFIG_FILES = {
    "tokenizer_config.json": "config",
    "special_tokens_map.json": "config",
    "added_tokens.json": "added_tokens",
    "config.json": "config",
    "generation_config.json": "generation",
    "chat_template.json": "template_json",
    "chat_template.jinja": "template",
    "processor_config.json": "config",
    "preprocessor_config.json": "config",
}
VOCAB_FILES = {"vocab.json": "vocab_json", "merges.txt": "merges", "vocab.txt": "vocab_txt", "tekken.json": "tekken"}
MARKERS = frozenset({"tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "vocab.json",
                     "vocab.txt", "tekken.json", "added_tokens.json"})  # fmt: skip
TEMPLATE_DIR = "additional_chat_templates"
CONFIG_PATH_KEYS = ("vocab_file", "merges_file", "tokenizer_file")
_VERSIONED = re.compile(r"^tokenizer\.(.*)\.json\Z")


@dataclass(frozen=True)
class LoaderFile:
    """``rel``: the file; ``role``: config, added_tokens, generation, template, template_json,
    tokenizer, vocab_json, merges, vocab_txt, tekken, model (``*.model``); ``loaders``: the
    transformers versions that read it (``4.50``...)."""

    rel: str
    role: str
    loaders: tuple[str, ...]


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    try:
        return tuple(int(p) for p in parts[:3]) if parts and len(parts) <= 4 else None
    except ValueError:
        return None


def fast_tokenizer_file(entries: Any, loader: tuple[int, ...]) -> str:
    """The file a loader of version ``loader`` reads for ``fast_tokenizer_files`` (transformers'
    ``get_fast_tokenizer_file``: the newest ``tokenizer.<v>.json`` with ``v`` not above it)."""
    chosen, best = "tokenizer.json", None
    for name in entries if isinstance(entries, list) else []:
        m = _VERSIONED.match(name) if isinstance(name, str) else None
        v = _version(m.group(1)) if m else None
        if v is not None and v <= loader and (best is None or v >= best):
            chosen, best = name, v
    return chosen


def tokenizer_roots(names: Iterable[str]) -> list[str]:
    """Folders ("" for the root) holding a tokenizer file; a root's own template folder is not one."""
    roots = set()
    for rel in names:
        folder, name = os.path.split(rel)
        if name in MARKERS or name.endswith(".model") or _VERSIONED.match(name):
            roots.add(folder)
    return sorted(roots)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def resolve(names: Iterable[str], configs: Mapping[str, Any]) -> list[LoaderFile]:
    """The files some loader reads (present in ``names``), per tokenizer root. ``configs``: rel ->
    the parsed ``tokenizer_config.json`` (a dict) of any root that has one."""
    listing = set(names)
    by_folder: dict[str, list[str]] = {}
    for rel in sorted(listing):  # one pass: each root looks only at its own folders
        by_folder.setdefault(os.path.dirname(rel), []).append(rel)
    every = tuple(".".join(map(str, v[:2])) for v in LOADER_VERSIONS)
    out: dict[tuple[str, str], set[str]] = {}

    def add(rel: str, role: str, loaders: Iterable[str] = every) -> None:
        if rel in listing:
            out.setdefault((rel, role), set()).update(loaders)

    for folder in tokenizer_roots(listing):
        config = configs.get(_join(folder, "tokenizer_config.json"))
        config = config if isinstance(config, dict) else {}
        for name, role in CONFIG_FILES.items():
            add(_join(folder, name), role)
        for rel in by_folder.get(_join(folder, TEMPLATE_DIR), []):
            if rel.endswith(".jinja"):
                add(rel, "template")
        fast: dict[str, set[str]] = {}
        for v in LOADER_VERSIONS:
            fast.setdefault(fast_tokenizer_file(config.get("fast_tokenizer_files"), v), set()).add(
                ".".join(map(str, v[:2]))
            )
        for name, loaders in fast.items():
            add(_join(folder, name), "tokenizer", loaders)
        has_fast = any(_join(folder, name) in listing for name in fast)
        for name, role in VOCAB_FILES.items():
            if name != "tekken.json" or not has_fast:
                add(_join(folder, name), role)
        for rel in by_folder.get(folder, []):
            if rel.endswith(".model"):
                add(rel, "model")
        for key in CONFIG_PATH_KEYS:  # 4.x let the config name its files
            value = config.get(key)
            if isinstance(value, str) and value:
                rel = os.path.normpath(_join(folder, value))
                role = {"tokenizer_file": "tokenizer", "merges_file": "merges"}.get(key) or VOCAB_FILES.get(
                    os.path.basename(rel), "vocab_json" if rel.endswith(".json") else "model"
                )
                add(rel, role, [v for v in every if v.startswith("4.")])
    return [LoaderFile(rel, role, tuple(sorted(v))) for (rel, role), v in sorted(out.items())]


SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def special_token_sources(config: Mapping[str, Any] | None, smap: Mapping[str, Any] | None) -> dict[str, str]:
    """Which file's value the loader uses for each special token both files set: without
    ``added_tokens_decoder`` in the config, ``special_tokens_map.json`` replaces the config's
    values (transformers' legacy path, 4.50+ and 5.x); with it, the config's stand."""
    config, smap = config or {}, smap or {}
    winner = "tokenizer_config.json" if "added_tokens_decoder" in config else "special_tokens_map.json"
    return {k: winner for k in SPECIAL_KEYS if k in config and k in smap}
