"""One directory into a :class:`~.snapshot.Snapshot`: list (no following) -> hash -> read and
sniff -> templates -> tokenizers; then the checks of :data:`~.checks.CHECKS` over it.

:func:`listing`, :func:`hash_listing` and :func:`analyse` are the steps :func:`~.scanner.scan_directory`
takes (it looks a stored verdict up between the hashing and the analysis); :func:`build_snapshot`
takes all three. The caches and pools come from a :class:`~.resources.ScanResources`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import replace

from warden.tokenscan import chat_template as ct
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.checks import CHECKS
from warden.tokenscan.checks.pipeline import judge_pipelines
from warden.tokenscan.declared import special_tokens, vocabulary
from warden.tokenscan.exercise import collect_templates, render, start_exercises, tokenizer_behaviour
from warden.tokenscan.findings import Finding, dedupe, sort_findings, with_root
from warden.tokenscan.manifest import HashCache, Manifest, ManifestError, build_manifest
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.reader import Reader, parse_bytes
from warden.tokenscan.resources import ScanResources, default_resources
from warden.tokenscan.snapshot import Snapshot
from warden.tokenscan.tree import Entry, walk

Files = list[tuple[str, str, str | None]]  # (relative name, path to open, link target or None)


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


def manifest_files(snap: Snapshot, policy: TokenscanPolicy) -> Files:
    out = []
    for e in snap.entries:
        path = open_path(e, snap.root_real, policy)
        if path is not None:
            out.append((e.rel, path, e.target if e.kind == "symlink" else None))
    return out


def build_snapshot(
    path: str,
    policy: TokenscanPolicy,
    with_manifest: bool = True,
    hash_cache: HashCache | None = None,
    held: list[int] | None = None,
    resources: ScanResources | None = None,
) -> Snapshot:
    """Everything the checks need from ``path``. Raises TreeError for an unusable root.

    With ``held`` (a list), the scan takes its share of the resources' parse budget before it
    reads and parses, and appends it there: the caller releases it once it no longer needs the
    snapshot. ``resources``: the caches and pools to use (the process's default when None)."""
    deadline = time.monotonic() + policy.scan_budget_seconds  # files, renders and tokenizers share it
    snap, files = listing(path, policy)
    if wants_manifest(snap, policy, with_manifest):
        hash_listing(snap, files, hash_cache)
    return analyse(snap, files, policy, deadline, held, resources or default_resources())


def listing(path: str, policy: TokenscanPolicy) -> tuple[Snapshot, Files]:
    """The snapshot's tree and the files to read. Raises TreeError."""
    root = os.path.abspath(path)
    root_real, entries = walk(root)
    snap = Snapshot(root, root_real, entries)
    snap.errors += [f"{root}/{e.rel}: {e.error}" for e in entries if e.error]
    return snap, manifest_files(snap, policy)


def wants_manifest(snap: Snapshot, policy: TokenscanPolicy, with_manifest: bool) -> bool:
    return with_manifest or bool(policy.pinned_digest(snap.root) or policy.pinned_digest(snap.root_real))


def hash_listing(snap: Snapshot, files: Files, hash_cache: HashCache | None) -> None:
    """Sets ``snap.manifest`` to the SHA-256 manifest of ``files`` (or records why it cannot)."""
    try:
        snap.manifest = build_manifest(snap.root, files, hash_cache)
    except ManifestError as exc:
        snap.errors.append(str(exc))


def analyse(
    snap: Snapshot,
    files: Files,
    policy: TokenscanPolicy,
    deadline: float,
    held: list[int] | None,
    res: ScanResources,
) -> Snapshot:
    """Reads, parses, renders and exercises what :func:`listing` found."""
    if held is not None:
        share = parse_bytes(files, policy)
        res.parse_budget.acquire(share)
        held.append(share)
    if files:  # the sandbox interpreters start while this process reads and parses
        ct.prestart_worker(policy.chat_template.memory_cap)
        if policy.behaviour.enabled:
            tbe.prestart_worker(policy.behaviour.memory_cap)
    reader = Reader(snap, policy, deadline, res)
    for rel, open_at, _link in sorted(files, key=read_order):
        reader.file(rel, open_at)
    special_tokens(snap)
    vocabulary(snap, reader.pieces, res)
    snap.deadline = deadline
    running = start_exercises(snap, policy, res)
    collect_templates(snap, reader.jinja, policy)
    render(snap, policy, res)
    tokenizer_behaviour(snap, policy, running, res)
    judge_pipelines(snap, res.judged)
    return snap


def read_order(item: tuple[str, str, str | None]) -> tuple[bool, str]:
    """Tokenizer files last: the configs that declare the special tokens are read first."""
    name = os.path.basename(item[0])
    return bool(_TOKENIZER_NAME.match(name)) or name.endswith(".model"), item[0]


_TOKENIZER_NAME = re.compile(r"^tokenizer(?:\..+)?\.json\Z")  # tokenizer.json, tokenizer.4.0.json (redirects)


def directory_manifest(
    path: str, policy: TokenscanPolicy, exclude_extensions: Iterable[str] = (), hash_cache: HashCache | None = None
) -> Manifest:
    """The manifest of ``path`` (files whose extension is in ``exclude_extensions`` left out).

    Raises TreeError or ManifestError (both mean: could not be completed)."""
    root = os.path.abspath(path)
    root_real, entries = walk(root)
    skip = {e.lower() for e in exclude_extensions}
    snap = Snapshot(root, root_real, entries)
    files = [f for f in manifest_files(snap, policy) if os.path.splitext(f[0])[1].lower() not in skip]
    return build_manifest(root, files, hash_cache)


def run_checks(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    found: list[Finding] = []
    for _name, check in CHECKS:
        found += check(snap, policy)
    return sort_findings(with_root(_with_lines(dedupe(found), snap, policy), snap.root))


_LINE_IN_DETAIL = re.compile(r"\(line ([0-9]+)\)")


def _with_lines(found: list[Finding], snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    """Findings with the line of their key (JSON) or template line (.jinja) where one exists."""
    texts: dict[str, str] = {}
    out = []
    for f in found:
        line = None
        if f.path.endswith(".jinja") and (m := _LINE_IN_DETAIL.search(f.message)):
            line = int(m.group(1))
        elif f.key and f.path in snap.json:
            if f.path not in texts:
                texts[f.path] = _text_of(snap, f.path, policy)
            line = key_line(texts[f.path], re.split(r"[.\[]", f.key, maxsplit=1)[0])
        out.append(replace(f, line=line) if line else f)
    return out


def _text_of(snap: Snapshot, rel: str, policy: TokenscanPolicy) -> str:
    """The text of ``rel`` (read again, recorded like every read of the analysis), or ""."""
    try:
        with snap.reads.open(rel, os.path.join(snap.root_real, rel)) as f:
            return f.read(min(f.size + 1, policy.cap_for(rel) or (64 << 20)))[0].decode("utf-8", "replace")
    except OSError:
        return ""


def key_line(text: str, key: str) -> int | None:
    """1-based line of the first ``"key":`` in JSON ``text``, or None."""
    m = re.search(re.escape(json.dumps(key)) + r"\s*:", text)
    return text.count("\n", 0, m.start()) + 1 if m else None
