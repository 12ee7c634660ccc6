"""Reads the files of a listing into a :class:`~.snapshot.Snapshot`: sniffed, parsed, collected.

Every read goes through one descriptor per file (:mod:`.reads`). The format of every file is
decided by its content, never by its name alone. Large JSON documents are parsed once per
content (the ``memo`` cache of :class:`~.resources.ScanResources`); a tokenizer.json is sent
to the tokenizer child before it is parsed here, so the two overlap.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import replace

from warden.tokenscan.charsmap import charsmap_problem
from warden.tokenscan.exercise import exercise
from warden.tokenscan.gguf import GGUFError, read_strings
from warden.tokenscan.pipeline_rules import looks_like_tokenizer
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.reads import Opened
from warden.tokenscan.resources import ScanResources
from warden.tokenscan.snapshot import FileFacts, JsonDoc, Snapshot
from warden.tokenscan.sniff import Budget, sniff_file
from warden.tokenscan.spm import ProtobufError, parse_sentencepiece
from warden.tokenscan.spm import order_problem as spm_order_problem
from warden.tokenscan.tokenizer_behaviour import TokenizerIssue

MEMO_MIN_BYTES = 64 << 10  # smaller files parse faster than they hash
JSON_WEIGHT = 6  # a parsed JSON document takes about this many times its source bytes
VOCAB_TEXT = frozenset({"vocab.txt", "merges.txt"})  # slow tokenizers' vocabularies, at any depth
_TIKTOKEN_LINE = re.compile(r"^[A-Za-z0-9+/=]+ [0-9]{1,9}\r?\Z")
ANALYSIS_ERRORS = (ValueError, RecursionError, MemoryError, struct.error, EOFError, LookupError, TypeError)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number (RFC 8259): the loader would read it as a float")


def _lone_surrogate(value: object, depth: int = 0) -> bool:
    """Whether a string (or key) under ``value`` holds a lone UTF-16 surrogate (no UTF-8 form)."""
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if depth > 200:
        return False
    if isinstance(value, list):
        return any(_lone_surrogate(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_lone_surrogate(k, depth + 1) or _lone_surrogate(v, depth + 1) for k, v in value.items())
    return False


def _parse_json(rel: str, data: bytes) -> JsonDoc:
    """``data`` parsed as strict JSON: NaN and Infinity refused, and text that has no UTF-8 form (a
    lone surrogate escape: what the tokenizer is handed then fails to encode) refused too."""
    try:
        doc = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        return JsonDoc(rel, error=str(exc)[:200] or type(exc).__name__)
    if _SURROGATE_ESCAPE.search(data) and _lone_surrogate(doc):
        return JsonDoc(rel, error="a string holds a lone UTF-16 surrogate escape (text with no UTF-8 form)")
    return JsonDoc(rel, doc)


def parse_bytes(files: Iterable[tuple[str, str, str | None]], policy: TokenscanPolicy) -> int:
    """What a scan of ``files`` may hold parsed: each file over :data:`MEMO_MIN_BYTES` and within
    its size cap (the caps bound what is parsed at all)."""
    total = 0
    for rel, path, _link in files:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        cap = policy.cap_for(rel)
        if size >= MEMO_MIN_BYTES and (cap is None or size <= cap):
            total += size
    return total


def _parse_json_cached(rel: str, data: bytes, digest: str, res: ScanResources) -> JsonDoc:
    """The parse of ``data`` (whose SHA-256 is ``digest``), shared by every copy of a large file."""
    if len(data) < MEMO_MIN_BYTES:
        return _parse_json(rel, data)
    doc = res.memo.get_or_make(("json", digest), lambda: _parse_json(rel, data), nbytes=JSON_WEIGHT * len(data))
    return JsonDoc(rel, doc.data, doc.error)


class Reader:
    """Reads the snapshot's content facts, collecting incomplete-scan errors. The format of
    every file is decided by its content, never by its name alone."""

    def __init__(self, snap: Snapshot, policy: TokenscanPolicy, deadline: float, res: ScanResources) -> None:
        self.snap, self.policy, self.deadline, self.res = snap, policy, deadline, res
        self.jinja: list[tuple[str, str | None, str]] = []
        self.pieces: set[str] = set()

    def file(self, rel: str, path: str) -> None:
        """Analyses file ``rel`` (at ``path``): opened once, every read of it through that descriptor
        and recorded in the snapshot's :class:`~.reads.ReadLog`."""
        try:
            with self.snap.reads.open(rel, path) as f:
                if time.monotonic() > self.deadline:
                    problem = f"scan time budget of {self.policy.scan_budget_seconds:g}s spent; not analysed"
                    self.snap.facts[rel] = FileFacts(rel, f.size, problems=(problem,))
                    self.snap.transient.append(f"{rel}: {problem}")
                    return
                self.snap.facts[rel] = self._facts(rel, path, f)
        except OSError as exc:
            self.snap.errors.append(f"{path}: cannot read ({exc.strerror or exc})")

    def _facts(self, rel: str, path: str, f: Opened) -> FileFacts:
        size = f.size
        cap = self.policy.cap_for(rel)
        over = cap if cap is not None and size > cap else None
        budget = Budget(self.policy.pickle_cap, min(self.deadline, time.monotonic() + self.policy.file_budget_seconds))
        try:
            facts = FileFacts(rel, size, sniff_file(path, size, self.policy.pickle_cap, budget, f.stream), over)
            if budget.spent():
                self.snap.transient.append(f"{rel}: file time budget spent")
            return facts if over is not None else self._parse(rel, path, f, facts)
        except ANALYSIS_ERRORS as exc:  # a hostile file must end in a finding, never a traceback
            return FileFacts(rel, size, None, over, problems=(f"content analysis failed: {type(exc).__name__}",))

    def _parse(self, rel: str, path: str, f: Opened, facts: FileFacts) -> FileFacts:
        ext = os.path.splitext(rel)[1].lower()
        kind = facts.sniff.kind if facts.sniff else None
        size = f.size
        if ext == ".json" or (ext != ".jinja" and kind == "text" and _starts_like_json(f.head(256))):
            doc = self._known_json(rel, size)
            if doc is None:
                data, digest = f.read(size + 1)
                self.snap.digests[rel] = digest
                if os.path.basename(rel) == "tokenizer.json":  # the child loads it while this parses it
                    self._exercise_early("tokenizer", path, digest, size)
                doc = _parse_json_cached(rel, data, digest, self.res)
            if ext == ".json" or doc.error is None:
                self.snap.json[rel] = doc
                # any tokenizers serialisation, whatever its name or folder (fast_tokenizer_files
                # redirects, subfolders): the loader may read it, so it is exercised too
                if doc.error is None and (os.path.basename(rel) == "tokenizer.json" or looks_like_tokenizer(doc.data)):
                    self.snap.tokenizer_files[rel] = ("tokenizer", path, self.snap.digests[rel], size)
                return facts
        if kind == "gguf":
            return self._gguf(f, facts)
        if os.path.basename(rel) in VOCAB_TEXT and kind == "text":
            data, self.snap.digests[rel] = f.read(size + 1)
            self.snap.vocab_lines[rel] = tuple(data.decode("utf-8", "replace").split("\n"))
            return facts
        if ext == ".jinja" or (kind == "text" and _looks_like_template(f.head(4096))):
            self.jinja.append((rel, None, f.read(size + 1)[0].decode("utf-8", "replace")))
        elif ext == ".model":  # whatever its first bytes look like: a truncated model may start as text
            return self._model(rel, path, f, facts)
        return facts

    def _model(self, rel: str, path: str, f: Opened, facts: FileFacts) -> FileFacts:
        """A ``.model``: a sentencepiece protobuf (validated, pieces in score order), or a
        ``tiktoken.model`` (base64 and rank per line, judged by the pipeline check); anything
        else is not a model (TS906), never clean."""
        data, digest = f.read(f.size + 1)
        self.snap.digests[rel] = digest
        try:
            model = parse_sentencepiece(data)
        except ProtobufError as exc:
            if _looks_like_tiktoken(data):
                self.snap.vocab_lines[rel] = tuple(data.decode("utf-8").split("\n"))
                return facts
            return replace(facts, spm_error=str(exc))
        self.pieces.update(model.pieces)
        self.snap.tokenizer_files[rel] = ("sentencepiece", path, digest, f.size)
        problem = spm_order_problem(model)
        if problem and self.policy.behaviour.bpe_ids_follow_merges:
            self.snap.tokenizer_issues.append((rel, TokenizerIssue("order", problem)))
        for blob in model.charsmaps:  # the normaliser rule of tokenizer.json's Precompiled (TS1209)
            if why := charsmap_problem(blob):
                self.snap.tokenizer_issues.append((rel, TokenizerIssue("rule", why)))
        return facts

    def _exercise_early(self, kind: str, path: str, digest: str, size: int) -> None:
        """Sends the tokenizer child its request now (the config files were read first, see
        :func:`~.analysis.read_order`); :func:`~.exercise.start_exercises` later gets the same
        request's future."""
        if self.policy.behaviour.enabled and time.monotonic() <= self.deadline:
            exercise(kind, path, digest, size, self.snap, self.policy, self.res)

    def _known_json(self, rel: str, size: int) -> JsonDoc | None:
        """The parse of a large JSON file whose digest the manifest just computed, when a scan
        already parsed that content (no second read and hash of a multi-MiB tokenizer.json)."""
        known = self.snap.manifest.files.get(rel) if self.snap.manifest else None
        if known is None or known.size != size or size < MEMO_MIN_BYTES:
            return None
        doc = self.res.memo.peek(("json", known.sha256))
        if doc is None:
            return None
        self.snap.digests[rel] = known.sha256
        return JsonDoc(rel, doc.data, doc.error)

    def _gguf(self, f: Opened, facts: FileFacts) -> FileFacts:
        try:
            with f.stream() as fh:
                found = read_strings(fh, f.size)
        except GGUFError as exc:
            return replace(facts, problems=(f"GGUF metadata unreadable: {exc}",))
        self.jinja += [(facts.rel, key, text) for key, text in sorted(found.items())]
        return facts


def _starts_like_json(head: bytes) -> bool:
    return head.lstrip()[:1] in (b"{", b"[")


def _looks_like_tiktoken(data: bytes) -> bool:
    """Every non-empty line is ``<base64> <int>`` (tiktoken's BPE file; its ranks are checked later)."""
    try:
        lines = [line for line in data.decode("utf-8").split("\n") if line.strip()]
    except UnicodeDecodeError:
        return False
    return bool(lines) and all(_TIKTOKEN_LINE.match(line) for line in lines)


def _looks_like_template(head: bytes) -> bool:
    return b"{%" in head and b"messages" in head
