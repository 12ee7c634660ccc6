"""What the scanner read from one directory; the input of every check (checks do no I/O).

Built by :mod:`.scanner`. ``json`` holds every parsed ``.json`` file; config-like files
(everything but vocabularies and weight indexes) get recursive key checks. Templates are
collected from ``*.jinja`` files and ``chat_template`` values inside JSON.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from warden.tokenscan.chat_template import RenderResult, TemplateIssue
from warden.tokenscan.manifest import Manifest
from warden.tokenscan.pipeline_rules import looks_like_tokenizer
from warden.tokenscan.reads import ReadLog
from warden.tokenscan.sniff import Sniff
from warden.tokenscan.template_battery import BehaviourIssue
from warden.tokenscan.tokenizer_behaviour import TokenizerIssue
from warden.tokenscan.tree import Entry

DATA_JSON_NAMES = frozenset({"tokenizer.json", "vocab.json", "added_tokens.json"})
TOKENIZER_FILES = frozenset({"tokenizer_config.json", "tokenizer.json", "tokenizer.model", "special_tokens_map.json"})
# Names a loader reads as configuration: always config, whatever their content looks like.
LOADER_CONFIG_NAMES = frozenset(
    {"tokenizer_config.json", "special_tokens_map.json", "config.json", "generation_config.json", "chat_template.json"}
)


def is_config_json(rel: str) -> bool:
    """Config-like JSON (recursive key checks) vs. data JSON whose keys are tokens or tensor names."""
    name = os.path.basename(rel)
    return name not in DATA_JSON_NAMES and not name.endswith(".index.json")


@dataclass(frozen=True)
class JsonDoc:
    rel: str
    data: Any = None
    error: str | None = None

    @property
    def config(self) -> bool:
        """Config-like, by name and then by content: a ``tokenizers`` serialisation under another
        name (a ``fast_tokenizer_files`` target such as ``tokenizer.4.57.0.json``) is data, like
        ``tokenizer.json``; a name the loader reads as configuration stays config whatever it holds."""
        if os.path.basename(self.rel) in LOADER_CONFIG_NAMES:
            return True
        if self.error is None and looks_like_tokenizer(self.data):
            return False
        return is_config_json(self.rel)


@dataclass(frozen=True)
class FileFacts:
    """``over_cap``: the cap a file exceeds (its content was then not parsed); ``spm_error``:
    why a ``.model`` file is not a sentencepiece model."""

    rel: str
    size: int
    sniff: Sniff | None = None
    over_cap: int | None = None
    spm_error: str | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class TemplateSource:
    """One chat template: file ``rel``, ``key`` inside a JSON file (None for a .jinja file)."""

    rel: str
    key: str | None
    text: str
    digest: str
    pinned: bool = False
    issues: tuple[TemplateIssue, ...] = ()
    render: RenderResult | None = None
    behaviour: tuple[BehaviourIssue, ...] = ()
    default_system: str = ""  # what the template adds before a conversation without a system message
    renders: tuple[tuple[str, str], ...] = ()  # (conversation, render) for the review report


@dataclass
class Snapshot:
    root: str
    root_real: str
    entries: list[Entry]
    facts: dict[str, FileFacts] = field(default_factory=dict)
    json: dict[str, JsonDoc] = field(default_factory=dict)
    templates: list[TemplateSource] = field(default_factory=list)
    vocabulary: frozenset[str] | None = None
    special_tokens: dict[str, str | None] = field(default_factory=dict)
    extra_special: tuple[str, ...] = ()
    manifest: Manifest | None = None
    errors: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    tokenizer_files: dict[str, tuple[str, str, str, int]] = field(default_factory=dict)  # kind, path, sha256, size
    tokenizer_issues: list[tuple[str, TokenizerIssue]] = field(default_factory=list)
    pipeline_issues: dict[str, list[Any]] = field(default_factory=dict)  # rel -> its PipelineIssues (judged once)
    unanalysed: list[tuple[str, str]] = field(default_factory=list)  # (file, why): TS910
    token_ids_digest: str | None = None  # ids of the corpus under tokenizer.json (else the .model)
    vocab_lines: dict[str, tuple[str, ...]] = field(default_factory=dict)  # vocab.txt: id = line number
    deadline: float = float("inf")
    transient: list[str] = field(default_factory=list)  # why this scan's verdict must not be reused
    reads: ReadLog = field(default_factory=ReadLog)  # what the analysis read (see .reads)

    @property
    def has_tokenizer(self) -> bool:
        return any(os.path.basename(e.rel) in TOKENIZER_FILES for e in self.entries)

    def configs(self) -> Iterator[JsonDoc]:
        """Parsed JSON documents whose top level is an object, sorted by path."""
        for rel in sorted(self.json):
            doc = self.json[rel]
            if isinstance(doc.data, dict):
                yield doc

    def top(self, name: str) -> dict[str, Any] | None:
        """The parsed top-level object of ``name`` at the root, when present."""
        doc = self.json.get(name)
        return doc.data if doc and isinstance(doc.data, dict) else None
