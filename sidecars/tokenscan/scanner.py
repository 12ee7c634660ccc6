"""Scans one directory: list (no following) -> hash -> read and sniff -> templates -> checks.

:func:`scan_directory` does the I/O and builds a :class:`~.snapshot.Snapshot`, then runs
every check of :data:`~.checks.CHECKS` over it. It never raises for a problem of the
directory itself: an unreadable root or file makes the result *incomplete* (``errors``),
everything else is a finding. Exit-code semantics live in :meth:`DirectoryScan.outcome`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sidecars.tokenscan import chat_template as ct
from sidecars.tokenscan.checks import CHECKS
from sidecars.tokenscan.findings import Finding, Severity, dedupe, sort_findings, with_root
from sidecars.tokenscan.manifest import HashCache, Manifest, ManifestError, build_manifest
from sidecars.tokenscan.policy import TokenscanPolicy
from sidecars.tokenscan.snapshot import FileFacts, JsonDoc, Snapshot, TemplateSource
from sidecars.tokenscan.sniff import open_regular, sniff_file
from sidecars.tokenscan.spm import ProtobufError, parse_sentencepiece
from sidecars.tokenscan.tree import Entry, TreeError, walk

EXIT_OK, EXIT_VIOLATION, EXIT_INCOMPLETE = 0, 1, 3


@dataclass
class DirectoryScan:
    """The result for one directory. ``errors`` non-empty means the scan is incomplete."""

    root: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    duration_seconds: float = 0.0
    manifest: Manifest | None = None

    def blocking(self, fail_on: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity >= fail_on]

    def outcome(self, fail_on: Severity) -> int:
        """1 when a finding is at or above ``fail_on``, else 3 when incomplete, else 0."""
        if self.blocking(fail_on):
            return EXIT_VIOLATION
        return EXIT_INCOMPLETE if self.errors else EXIT_OK

    def to_dict(self, fail_on: Severity) -> dict[str, Any]:
        return {
            "path": self.root,
            "outcome": {0: "clean", 1: "violation", 3: "incomplete"}[self.outcome(fail_on)],
            "findings": [f.to_dict() for f in self.findings],
            "errors": list(self.errors),
            "files": self.files,
            "bytes": self.bytes,
            "duration_seconds": round(self.duration_seconds, 6),
            "manifest_digest": self.manifest.digest if self.manifest else None,
        }


def open_path(e: Entry, root_real: str, policy: TokenscanPolicy) -> str | None:
    """Where to read an entry's content, or None when it must not be read."""
    if e.error:
        return None
    if e.kind == "file":
        return os.path.join(root_real, e.rel)
    allowed = e.inside or (e.hf_blob and policy.allow_hf_cache_blobs)
    if e.kind == "symlink" and e.target_kind == "file" and e.real and allowed:
        return e.real
    return None


def _read(path: str, limit: int) -> bytes:
    with open_regular(path) as fh:
        return fh.read(limit)


def _parse_json(rel: str, data: bytes) -> JsonDoc:
    try:
        return JsonDoc(rel, json.loads(data))
    except (ValueError, RecursionError) as exc:
        return JsonDoc(rel, error=str(exc)[:200] or type(exc).__name__)


class _Reader:
    """Reads the snapshot's content facts, collecting incomplete-scan errors."""

    def __init__(self, snap: Snapshot, policy: TokenscanPolicy) -> None:
        self.snap, self.policy = snap, policy
        self.jinja: list[tuple[str, str | None, str]] = []
        self.pieces: set[str] = set()

    def file(self, rel: str, path: str) -> None:
        try:
            size = os.stat(path).st_size
            cap = self.policy.cap_for(rel)
            over = cap if cap is not None and size > cap else None
            facts = FileFacts(rel, size, sniff_file(path, size, self.policy.pickle_cap), over)
            if over is None:
                facts = self._parse(rel, path, size, facts)
        except OSError as exc:
            self.snap.errors.append(f"{path}: cannot read ({exc.strerror or exc})")
            return
        self.snap.facts[rel] = facts

    def _parse(self, rel: str, path: str, size: int, facts: FileFacts) -> FileFacts:
        ext = os.path.splitext(rel)[1].lower()
        if ext == ".json":
            self.snap.json[rel] = _parse_json(rel, _read(path, size + 1))
        elif ext == ".jinja":
            self.jinja.append((rel, None, _read(path, size + 1).decode("utf-8", "replace")))
        elif ext == ".model" and (facts.sniff is None or facts.sniff.kind != "text"):
            try:
                self.pieces.update(parse_sentencepiece(_read(path, size + 1)).pieces)
            except ProtobufError as exc:
                return FileFacts(rel, size, facts.sniff, None, str(exc))
        return facts


def _json_templates(doc: JsonDoc) -> list[tuple[str, str | None, Any]]:
    if not isinstance(doc.data, dict) or "chat_template" not in doc.data:
        return []
    value = doc.data["chat_template"]
    if isinstance(value, list):
        return [
            (doc.rel, f"chat_template[{_name(v, i)}]", v.get("template") if isinstance(v, dict) else v)
            for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        return [(doc.rel, f"chat_template[{k}]", v) for k, v in value.items()]
    return [(doc.rel, "chat_template", value)]


def _name(item: Any, index: int) -> str:
    return str(item.get("name", index)) if isinstance(item, dict) else str(index)


def _token(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _special_tokens(snap: Snapshot) -> None:
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    for name in ("bos", "eos", "pad", "unk"):
        snap.special_tokens[name] = _token(config.get(f"{name}_token")) or _token(smap.get(f"{name}_token"))
    extra = [_token(t) for t in _list(config.get("additional_special_tokens"))]
    tok = snap.top("tokenizer.json") or {}
    extra += [_token(t) for t in _list(tok.get("added_tokens")) if isinstance(t, dict) and t.get("special")]
    snap.extra_special = tuple(t for t in extra if t)


def _vocabulary(snap: Snapshot, pieces: set[str]) -> None:
    vocab: set[str] = set(pieces)
    found = bool(pieces)
    tok = snap.top("tokenizer.json")
    if tok is not None:
        found = True
        raw = _dict(tok.get("model")).get("vocab")
        if isinstance(raw, dict):
            vocab.update(map(str, raw))
        elif isinstance(raw, list):
            vocab.update(str(p[0]) for p in raw if isinstance(p, list) and p)
        vocab.update(t for t in (_token(a) for a in _list(tok.get("added_tokens"))) if t)
    for name in ("vocab.json", "added_tokens.json"):
        doc = snap.top(name)
        if doc is not None:
            found = True
            vocab.update(map(str, doc))
    decoder = (snap.top("tokenizer_config.json") or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict):
        vocab.update(t for t in (_token(v) for v in decoder.values()) if t)
    snap.vocabulary = frozenset(vocab) if found else None


def _collect_templates(snap: Snapshot, reader: _Reader, policy: TokenscanPolicy) -> None:
    cp = policy.chat_template
    cap = policy.cap_for("x.jinja")
    sources: list[tuple[str, str | None, Any]] = list(reader.jinja)
    for doc in snap.configs():
        sources += _json_templates(doc)
    for rel, key, text in sources:
        if not isinstance(text, str):
            issue = ct.TemplateIssue("syntax", f"chat template is a {type(text).__name__}, not a string")
            snap.templates.append(TemplateSource(rel, key, "", "", issues=(issue,)))
            continue
        digest = ct.template_digest(text)
        if digest in cp.approved_sha256:
            snap.templates.append(TemplateSource(rel, key, text, digest, pinned=True))
        elif cap is not None and len(text.encode("utf-8", "replace")) > cap:
            issue = ct.TemplateIssue("size", f"{len(text)} characters, over the .jinja cap of {cap} bytes")
            snap.templates.append(TemplateSource(rel, key, "", digest, issues=(issue,)))
        else:
            issues = ct.analyze(text, cp.max_loop_depth, cp.max_range, cp.max_literal_chars)
            snap.templates.append(TemplateSource(rel, key, text, digest, issues=tuple(issues)))


def _render(snap: Snapshot, policy: TokenscanPolicy) -> None:
    """Renders templates that parsed and show no introspection, in the sandbox child."""
    todo = [
        i
        for i, t in enumerate(snap.templates)
        if t.text and not t.pinned and not any(x.kind in ("syntax", "introspection") for x in t.issues)
    ]
    if not todo:
        return
    cp = policy.chat_template
    limits = ct.RenderLimits(cp.render_timeout_seconds, cp.output_cap, cp.memory_cap)
    context: dict[str, Any] = {f"{k}_token": v or "" for k, v in snap.special_tokens.items()}
    context |= {"add_generation_prompt": True, "tools": None, "documents": None}
    try:
        results = ct.render_templates([snap.templates[i].text for i in todo], context, limits)
    except OSError as exc:
        snap.errors.append(f"chat template sandbox could not start: {exc.strerror or exc}")
        return
    for i, result in zip(todo, results, strict=True):
        t = snap.templates[i]
        if result.status == "crashed":
            snap.errors.append(f"{snap.root}/{t.rel}: {result.message}")
        snap.templates[i] = TemplateSource(t.rel, t.key, t.text, t.digest, t.pinned, t.issues, result)


def _manifest_files(snap: Snapshot, policy: TokenscanPolicy) -> list[tuple[str, str, str | None]]:
    out = []
    for e in snap.entries:
        path = open_path(e, snap.root_real, policy)
        if path is not None:
            out.append((e.rel, path, e.target if e.kind == "symlink" else None))
    return out


def build_snapshot(
    path: str, policy: TokenscanPolicy, with_manifest: bool = True, hash_cache: HashCache | None = None
) -> Snapshot:
    """Everything the checks need from ``path``. Raises TreeError for an unusable root."""
    root = os.path.abspath(path)
    root_real, entries = walk(root)
    snap = Snapshot(root, root_real, entries)
    snap.errors += [f"{root}/{e.rel}: {e.error}" for e in entries if e.error]
    files = _manifest_files(snap, policy)
    if with_manifest or policy.pinned_digest(root) or policy.pinned_digest(root_real):
        try:
            snap.manifest = build_manifest(root, files, hash_cache)
        except ManifestError as exc:
            snap.errors.append(str(exc))
    reader = _Reader(snap, policy)
    for rel, open_at, _link in files:
        reader.file(rel, open_at)
    _special_tokens(snap)
    _vocabulary(snap, reader.pieces)
    _collect_templates(snap, reader, policy)
    _render(snap, policy)
    return snap


def directory_manifest(
    path: str, policy: TokenscanPolicy, exclude_extensions: Iterable[str] = (), hash_cache: HashCache | None = None
) -> Manifest:
    """The manifest of ``path`` (files whose extension is in ``exclude_extensions`` left out).

    Raises TreeError or ManifestError (both mean: could not be completed)."""
    root = os.path.abspath(path)
    root_real, entries = walk(root)
    skip = {e.lower() for e in exclude_extensions}
    snap = Snapshot(root, root_real, entries)
    files = [f for f in _manifest_files(snap, policy) if os.path.splitext(f[0])[1].lower() not in skip]
    return build_manifest(root, files, hash_cache)


def run_checks(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    found: list[Finding] = []
    for _name, check in CHECKS:
        found += check(snap, policy)
    return sort_findings(with_root(dedupe(found), snap.root))


def scan_directory(
    path: str, policy: TokenscanPolicy, with_manifest: bool = True, hash_cache: HashCache | None = None
) -> DirectoryScan:
    """Scans ``path``; never raises for problems of the directory (see the module docstring)."""
    start = time.perf_counter()
    root = os.path.abspath(path)
    try:
        snap = build_snapshot(root, policy, with_manifest, hash_cache)
    except TreeError as exc:
        return DirectoryScan(root, errors=[str(exc)], duration_seconds=time.perf_counter() - start)
    result = DirectoryScan(root, run_checks(snap, policy), list(snap.errors), manifest=snap.manifest)
    result.files = len(snap.facts)
    result.bytes = sum(f.size for f in snap.facts.values())
    result.duration_seconds = time.perf_counter() - start
    return result


def scan_paths(paths: Iterable[str], policy: TokenscanPolicy, with_manifest: bool = True) -> list[DirectoryScan]:
    return [scan_directory(p, policy, with_manifest) for p in paths]


def worst_outcome(scans: Iterable[DirectoryScan], fail_on: Severity) -> int:
    """1 if any scan found a violation, else 3 if any was incomplete, else 0."""
    codes = {s.outcome(fail_on) for s in scans}
    return EXIT_VIOLATION if EXIT_VIOLATION in codes else (EXIT_INCOMPLETE if EXIT_INCOMPLETE in codes else EXIT_OK)
