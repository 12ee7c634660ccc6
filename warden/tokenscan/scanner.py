"""Scans one directory: list (no following) -> hash -> read and sniff -> templates -> checks.

:func:`scan_directory` does the I/O and builds a :class:`~.snapshot.Snapshot`, then runs
every check of :data:`~.checks.CHECKS` over it. It never raises for a problem of the
directory itself: an unreadable root or file makes the result *incomplete* (``errors``),
everything else is a finding. Exit-code semantics live in :meth:`DirectoryScan.outcome`.

Caches (in-process, thread-safe, single flight): by content digest, :data:`MEMO` (parsed JSON,
vocabulary sets, battery renders: bounded by estimated bytes), :data:`JUDGED` (what was found
in one content: bounded by count) and :data:`BEHAVIOUR` (the tokenizer child's answers); by
directory, :data:`SCANS` (the verdict of a complete scan, under :func:`verdict_key`: a rescan
of an unchanged directory lists and hashes it, or stats it with a hash cache, and reads,
parses and exercises nothing). A verdict is stored only for the bytes analysed: every read of
the analysis goes through one descriptor per file (:mod:`.reads`), and :func:`reusable` requires
its stat key to be the listing's and the hashed descriptor's, and its whole reads the manifest's
digests (a directory swapped under the scan gets its own result, and nothing is stored).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from warden.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_VIOLATION
from warden.tokenscan import chat_template as ct
from warden.tokenscan import template_battery as tb
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.checks import CHECKS
from warden.tokenscan.findings import Finding, Severity, dedupe, finding, sort_findings, with_root
from warden.tokenscan.gguf import GGUFError, read_strings
from warden.tokenscan.manifest import HashCache, Manifest, ManifestError, build_manifest, settled, stat_key
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.reads import Opened
from warden.tokenscan.snapshot import FileFacts, JsonDoc, Snapshot, TemplateSource
from warden.tokenscan.sniff import Budget, sniff_file
from warden.tokenscan.spm import ProtobufError, parse_sentencepiece
from warden.tokenscan.tree import Entry, TreeError, walk


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
    token_ids_digest: str | None = None

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
            "token_ids_digest": self.token_ids_digest,
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


def _parse_json(rel: str, data: bytes) -> JsonDoc:
    try:
        return JsonDoc(rel, json.loads(data))
    except (ValueError, RecursionError) as exc:
        return JsonDoc(rel, error=str(exc)[:200] or type(exc).__name__)


class _Memo:
    """Results keyed by content digest (parse once: 50 copies of a tokenizer cost one parse).
    Values are shared between snapshots and never mutated by the checks. Single flight:
    concurrent scans asking for the same key wait for the one computing it, so directories
    scanned in parallel (:func:`scan_paths`) still parse, load and render each content once.
    Least recently used first out, bounded by count (``size``) and by ``weight`` (estimated
    bytes in memory; a value heavier than ``max_weight`` is returned but not kept)."""

    def __init__(self, size: int, max_weight: int) -> None:
        self.items: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self.size, self.max_weight, self.weight = size, max_weight, 0
        self.lock = threading.Lock()
        self.pending: dict[tuple[str, str], threading.Event] = {}

    def get(self, kind: str, digest: str, make: Any, keep: Any = None, weight: Any = 0) -> Any:
        """The value for (kind, digest), made by ``make()`` once; ``keep(value)`` False means it
        is returned but not remembered (a crashed sandbox: the next scan retries). ``weight``:
        bytes, or a function of the value giving them."""
        key = (kind, digest)
        while True:
            with self.lock:
                if key in self.items:
                    self.items.move_to_end(key)
                    return self.items[key][0]
                waiting = self.pending.get(key)
                if waiting is None:
                    self.pending[key] = threading.Event()
                    break
            waiting.wait()  # the maker stored it, or failed: then this caller makes it
        stored = False
        try:
            value = make()
            stored = keep is None or bool(keep(value))
            weight = weight(value) if callable(weight) else weight
        finally:
            with self.lock:
                if stored and weight <= self.max_weight:
                    self.items[key] = (value, weight)
                    self.weight += weight
                    while len(self.items) > self.size or self.weight > self.max_weight:
                        self.weight -= self.items.popitem(last=False)[1][1]
                self.pending.pop(key).set()
        return value

    def put(self, kind: str, digest: str, value: Any, weight: int = 0) -> None:
        """Remembers ``value`` (replacing any stored one), within the bounds."""
        self.drop(kind, digest)
        self.get(kind, digest, lambda: value, weight=weight)

    def __len__(self) -> int:
        return len(self.items)

    def peek(self, kind: str, digest: str) -> Any:
        """The stored value, or None (never waits, never makes)."""
        with self.lock:
            item = self.items.get((kind, digest))
        return None if item is None else item[0]

    def drop(self, kind: str, digest: str) -> None:
        with self.lock:
            item = self.items.pop((kind, digest), None)
            self.weight -= item[1] if item else 0

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.weight = 0


# The caches by content, split by what a value weighs. Big values (parsed JSON, vocabulary
# sets, battery renders) are bounded by their estimated bytes: 50 distinct 32k-vocab
# tokenizers are ~100 MiB of JSON, ~600 MiB parsed, so not all of them are kept, and a warm
# rescan does not need them (see SCANS). Small values (verdicts: issues found in one content,
# a few hundred bytes each) are bounded by count only, generously.
MEMO = _Memo(size=1024, max_weight=256 << 20)  # json, vocab, keys, render
JUDGED = _Memo(size=8192, max_weight=1 << 62)  # order, vocabs, battery, judge: weight 0, count bound
MEMO_MIN_BYTES = 64 << 10  # smaller files parse faster than they hash
JSON_WEIGHT = 6  # a parsed JSON document takes about this many times its source bytes
SET_ENTRY_WEIGHT = 100  # bytes per entry of a set of short strings (the entry, the string object)


class _ByteBudget:
    """Bytes of large files that concurrent scans (:func:`scan_paths`) may hold parsed at once:
    a parsed JSON document takes several times its size, so eight scans of 64 MiB files must
    not run together. A scan takes its share before it reads anything (so it never waits for
    the budget while holding a share another scan waits on); a scan alone always runs."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    def admits(self, amount: int) -> bool:
        return self.used == 0 or self.used + amount <= self.limit

    def acquire(self, amount: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.admits(amount))
            self.used += amount

    def release(self, amount: int) -> None:
        with self.cond:
            self.used -= amount
            self.cond.notify_all()


PARSE_BUDGET = _ByteBudget(128 << 20)


def _parse_bytes(files: Iterable[tuple[str, str, str | None]], policy: TokenscanPolicy) -> int:
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


def _parse_json_cached(rel: str, data: bytes, digest: str) -> JsonDoc:
    """The parse of ``data`` (whose SHA-256 is ``digest``), shared by every copy of a large file."""
    if len(data) < MEMO_MIN_BYTES:
        return _parse_json(rel, data)
    doc = MEMO.get("json", digest, lambda: _parse_json(rel, data), weight=JSON_WEIGHT * len(data))
    return JsonDoc(rel, doc.data, doc.error)


ANALYSIS_ERRORS = (ValueError, RecursionError, MemoryError, struct.error, EOFError, LookupError, TypeError)


class _Reader:
    """Reads the snapshot's content facts, collecting incomplete-scan errors. The format of
    every file is decided by its content, never by its name alone."""

    def __init__(self, snap: Snapshot, policy: TokenscanPolicy, deadline: float) -> None:
        self.snap, self.policy, self.deadline = snap, policy, deadline
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
                doc = _parse_json_cached(rel, data, digest)
            if ext == ".json" or doc.error is None:
                self.snap.json[rel] = doc
                if os.path.basename(rel) == "tokenizer.json" and doc.error is None:
                    self.snap.tokenizer_files[rel] = ("tokenizer", path, self.snap.digests[rel], size)
                return facts
        if kind == "gguf":
            return self._gguf(f, facts)
        if rel == "vocab.txt" and kind == "text":
            data, self.snap.digests[rel] = f.read(size + 1)
            self.snap.vocab_lines[rel] = tuple(data.decode("utf-8", "replace").split("\n"))
            return facts
        if ext == ".jinja" or (kind == "text" and _looks_like_template(f.head(4096))):
            self.jinja.append((rel, None, f.read(size + 1)[0].decode("utf-8", "replace")))
        elif ext == ".model" and kind != "text":
            try:
                data, digest = f.read(size + 1)
                self.pieces.update(parse_sentencepiece(data).pieces)
                self.snap.tokenizer_files[rel] = ("sentencepiece", path, digest, size)
            except ProtobufError as exc:
                return replace(facts, spm_error=str(exc))
        return facts

    def _exercise_early(self, kind: str, path: str, digest: str, size: int) -> None:
        """Sends the tokenizer child its request now (the config files were read first, see
        :func:`_read_order`); :func:`_start_exercises` later gets the same request's future."""
        if self.policy.behaviour.enabled and time.monotonic() <= self.deadline:
            _exercise(kind, path, digest, size, _config_tokens(self.snap), self.policy)

    def _known_json(self, rel: str, size: int) -> JsonDoc | None:
        """The parse of a large JSON file whose digest the manifest just computed, when a scan
        already parsed that content (no second read and hash of a multi-MiB tokenizer.json)."""
        known = self.snap.manifest.files.get(rel) if self.snap.manifest else None
        if known is None or known.size != size or size < MEMO_MIN_BYTES:
            return None
        doc = MEMO.peek("json", known.sha256)
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


def _looks_like_template(head: bytes) -> bool:
    return b"{%" in head and b"messages" in head


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


SPECIAL_NAMES = ("bos", "eos", "pad", "unk", "cls", "sep")


def _config_tokens(snap: Snapshot) -> dict[str, str | None]:
    """The special tokens the config files declare (tokenizer_config.json, then
    special_tokens_map.json): what the tokenizer child is asked about. Known before
    tokenizer.json is parsed, so the child can load it while this process parses it."""
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    tokens = {n: _token(config.get(f"{n}_token")) or _token(smap.get(f"{n}_token")) for n in SPECIAL_NAMES}
    extra = [t for t in (_token(t) for t in _list(config.get("additional_special_tokens"))) if t]
    return tokens | {f"additional[{i}]": t for i, t in enumerate(extra)}


def _special_tokens(snap: Snapshot) -> None:
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    for name in SPECIAL_NAMES:
        snap.special_tokens[name] = _token(config.get(f"{name}_token")) or _token(smap.get(f"{name}_token"))
    extra = [_token(t) for t in _list(config.get("additional_special_tokens"))]
    tok = snap.top("tokenizer.json") or {}
    extra += [_token(t) for t in _list(tok.get("added_tokens")) if isinstance(t, dict) and t.get("special")]
    snap.extra_special = tuple(t for t in extra if t)


def _tokenizer_vocab(tok: dict[str, Any]) -> frozenset[str]:
    vocab: set[str] = set()
    raw = _dict(tok.get("model")).get("vocab")
    if isinstance(raw, dict):
        vocab.update(map(str, raw))
    elif isinstance(raw, list):
        vocab.update(str(p[0]) for p in raw if isinstance(p, list) and p)
    vocab.update(t for t in (_token(a) for a in _list(tok.get("added_tokens"))) if t)
    return frozenset(vocab)


def _set_weight(value: frozenset[str]) -> int:
    return SET_ENTRY_WEIGHT * len(value)


def _vocabulary(snap: Snapshot, pieces: set[str]) -> None:
    parts: list[frozenset[str]] = [frozenset(pieces)] if pieces else []
    tok = snap.top("tokenizer.json")
    if tok is not None:
        digest = snap.digests.get("tokenizer.json", "")
        parts.append(MEMO.get("vocab", digest, lambda: _tokenizer_vocab(tok), weight=_set_weight))
    for name in ("vocab.json", "added_tokens.json"):
        doc = snap.top(name)
        if doc is not None:
            make = lambda d=doc: frozenset(map(str, d))  # noqa: E731
            parts.append(MEMO.get("keys", snap.digests.get(name, ""), make, weight=_set_weight))
    decoder = (snap.top("tokenizer_config.json") or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict):
        parts.append(frozenset(t for t in (_token(v) for v in decoder.values()) if t))
    # one part (the usual tokenizer.json) is used as is: no copy of a 150k-entry set per scan
    snap.vocabulary = None if not parts else parts[0] if len(parts) == 1 else frozenset().union(*parts)


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


def _specials(snap: Snapshot) -> tuple[str, ...]:
    return tuple(v for v in snap.special_tokens.values() if v) + snap.extra_special


def _not_crashed(answer: dict[str, Any]) -> bool:
    return answer.get("status") != "crashed"


def _lasting(answer: dict[str, Any]) -> bool:
    """Whether a tokenizer child's answer is about the content it was asked about, for good: not a
    crash, nor a file that was not the content of the digest any more when the child read it."""
    return answer.get("status") not in ("crashed", "changed")


def _render(snap: Snapshot, policy: TokenscanPolicy) -> None:
    """Renders templates that parsed and show no introspection with the battery of
    conversations, in the sandbox child, and judges the renders."""
    cp = policy.chat_template
    limits = ct.RenderLimits(cp.render_timeout_seconds, cp.output_cap, cp.memory_cap)
    context: dict[str, Any] = {f"{k}_token": v or "" for k, v in snap.special_tokens.items()}
    context |= {"add_generation_prompt": True, "documents": None}
    renders = tb.battery_renders(context)
    for i, t in enumerate(snap.templates):
        if t.text and time.monotonic() > snap.deadline:
            snap.unanalysed.append((t.rel, f"template {t.key or ''} not rendered: scan time budget spent".strip()))
            continue
        if not t.text or t.pinned or any(x.kind in ("syntax", "introspection", "complexity") for x in t.issues):
            continue
        try:
            rkey = hashlib.sha256(json.dumps([t.digest, context, limits.__dict__], sort_keys=True).encode()).hexdigest()
            battery = lambda text=t.text: ct.run_battery(text, renders, limits)  # noqa: E731
            answer = MEMO.get("render", rkey, battery, keep=_not_crashed, weight=lambda a: len(json.dumps(a)))
        except OSError as exc:
            snap.errors.append(f"chat template sandbox could not start: {exc.strerror or exc}")
            return
        if not _not_crashed(answer):
            snap.transient.append(f"{t.rel}: template sandbox crashed")
        result = ct.RenderResult(str(answer["status"]), "", str(answer.get("message", "")))
        key = t.digest + json.dumps([_specials(snap), cp.max_literal_chars, context], sort_keys=True)
        judged = lambda a=answer: tuple(tb.judge(renders, a, _specials(snap), cp.max_literal_chars))  # noqa: E731
        issues = JUDGED.get("battery", key, judged) if answer["status"] == "ok" else ()
        snap.templates[i] = replace(t, render=result, behaviour=tuple(issues))


def _declared_tokens(snap: Snapshot) -> dict[str, str | None]:
    tokens = dict(snap.special_tokens)
    tokens |= {f"additional[{i}]": t for i, t in enumerate(snap.extra_special)}
    return tokens


# tokenizer child answers (futures: in flight or done), by content and tokens: tens of KB each
# (the corpus's ids and pieces), so 256 of them
BEHAVIOUR = _Memo(size=256, max_weight=1 << 62)
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tokenscan-tokenizer")  # most wait on the worker
SEND_WAIT_SECONDS = 0.2  # bounded: a saturated pool only delays the overlap


def _exercise_key(kind: str, digest: str, tokens: dict[str, str | None]) -> str:
    return hashlib.sha256((digest + json.dumps([kind, tokens], sort_keys=True)).encode()).hexdigest()


def _exercise(
    kind: str, path: str, digest: str, size: int, tokens: dict[str, str | None], policy: TokenscanPolicy
) -> Future[dict[str, Any]]:
    """The tokenizer child's answer for the file at ``path``, as a future shared by every scan
    of the same content (``digest``) and tokens; the child re-checks the digest."""
    bp = policy.behaviour

    def send() -> Future[dict[str, Any]]:
        sent = threading.Event()
        req = tbe.request(kind, path, digest, size, tokens)
        future = _POOL.submit(tbe.run, req, bp.memory_cap, bp.timeout_seconds, sent.set)
        # the caller goes on to json.loads, which holds the GIL for its whole parse: let the
        # pool thread write the request first, so the child loads while this process parses
        sent.wait(SEND_WAIT_SECONDS)
        return future

    return BEHAVIOUR.get(kind, _exercise_key(kind, digest, tokens), send)  # type: ignore[no-any-return]


def _start_exercises(snap: Snapshot, policy: TokenscanPolicy) -> dict[str, Future[dict[str, Any]]]:
    """Sends every tokenizer to its child now, so the child works while this process analyses
    and renders the templates; :func:`_tokenizer_behaviour` collects the answers."""
    if not policy.behaviour.enabled or time.monotonic() > snap.deadline:
        return {}
    tokens = _config_tokens(snap)
    return {
        rel: _exercise(kind, path, digest, size, tokens, policy)
        for rel, (kind, path, digest, size) in sorted(snap.tokenizer_files.items())
    }


def _tokenizer_behaviour(snap: Snapshot, policy: TokenscanPolicy, running: dict[str, Future[dict[str, Any]]]) -> None:
    """Static invariants of tokenizer.json and the behaviour of every tokenizer found
    (``running``: the child requests :func:`_start_exercises` sent)."""
    tokens = _declared_tokens(snap)
    declared = {k: v for k, v in tokens.items() if v}
    tok = snap.top("tokenizer.json")
    added = [t for t in (_token(a) for a in _list((tok or {}).get("added_tokens"))) if t]
    out = snap.tokenizer_issues
    if tok is not None:
        out += [("tokenizer.json", i) for i in tbe.special_token_problems(declared, added)]
        out += [("tokenizer.json", i) for i in tbe.ordinary_special_tokens(declared, added)]
        model = _dict(tok.get("model"))
        digest = snap.digests.get("tokenizer.json", "")
        order = JUDGED.get("order", digest, lambda: tbe.merge_order_problem(model) or tbe.score_order_problem(model))
        out += [("tokenizer.json", i) for i in tbe.rewrite_rules(tok)]
        problem = order if policy.behaviour.bpe_ids_follow_merges else None
        if problem:
            out.append(("tokenizer.json", tbe.TokenizerIssue("order", problem)))
        out += [("tokenizer.json", tbe.TokenizerIssue("order", d)) for d in _vocab_disagreements(snap, model)]
    if not policy.behaviour.enabled:
        return
    for rel, (kind, _path, digest, _size) in sorted(snap.tokenizer_files.items()):
        if rel not in running:
            snap.unanalysed.append((rel, "tokenizer not exercised: scan time budget spent"))
            continue
        try:
            answer = running[rel].result()
        except OSError as exc:
            BEHAVIOUR.drop(kind, _exercise_key(kind, digest, _config_tokens(snap)))
            snap.errors.append(f"tokenizer sandbox could not start: {exc.strerror or exc}")
            return
        if not _lasting(answer):  # reported now, retried by the next scan
            BEHAVIOUR.drop(kind, _exercise_key(kind, digest, _config_tokens(snap)))
            snap.transient.append(f"{rel}: tokenizer sandbox {answer.get('status')}")
        if snap.token_ids_digest is None or rel == "tokenizer.json":
            snap.token_ids_digest = tbe.ids_digest(answer)
        key = digest + json.dumps([kind, rel, tokens], sort_keys=True)
        judged = lambda a=answer, r=rel: tuple(tbe.judge(a, tokens, r))  # noqa: E731
        out += [(rel, i) for i in JUDGED.get("judge", key, judged, keep=lambda _v, a=answer: _lasting(a))]


def _vocab_disagreements(snap: Snapshot, model: dict[str, Any]) -> list[str]:
    """tokenizer.json's vocabulary against the slow tokenizer's vocab.json / vocab.txt beside it
    (cached by the digests of the two files)."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return []
    others: dict[str, Any] = {}
    if (doc := snap.top("vocab.json")) is not None:
        others["vocab.json"] = lambda d=doc: d
    if "vocab.txt" in snap.vocab_lines:
        others["vocab.txt"] = lambda lines=snap.vocab_lines["vocab.txt"]: tbe.vocab_txt_ids(lines)
    out = []
    for label, mapping in others.items():
        key = snap.digests.get("tokenizer.json", "") + label + snap.digests.get(label, "")
        found = JUDGED.get("vocabs", key, lambda m=mapping, n=label: tbe.vocab_disagreement(vocab, m(), n))
        if found:
            out.append(found)
    return out


def _manifest_files(snap: Snapshot, policy: TokenscanPolicy) -> list[tuple[str, str, str | None]]:
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
) -> Snapshot:
    """Everything the checks need from ``path``. Raises TreeError for an unusable root.

    With ``held`` (a list), the scan takes its share of :data:`PARSE_BUDGET` before it reads
    and parses, and appends it there: the caller releases it once it no longer needs the
    snapshot."""
    deadline = time.monotonic() + policy.scan_budget_seconds  # files, renders and tokenizers share it
    snap, files = _listing(path, policy)
    if _wants_manifest(snap, policy, with_manifest):
        _hash(snap, files, hash_cache)
    return _analyse(snap, files, policy, deadline, held)


def _listing(path: str, policy: TokenscanPolicy) -> tuple[Snapshot, list[tuple[str, str, str | None]]]:
    """The snapshot's tree and the files to read. Raises TreeError."""
    root = os.path.abspath(path)
    root_real, entries = walk(root)
    snap = Snapshot(root, root_real, entries)
    snap.errors += [f"{root}/{e.rel}: {e.error}" for e in entries if e.error]
    return snap, _manifest_files(snap, policy)


def _wants_manifest(snap: Snapshot, policy: TokenscanPolicy, with_manifest: bool) -> bool:
    return with_manifest or bool(policy.pinned_digest(snap.root) or policy.pinned_digest(snap.root_real))


def _hash(snap: Snapshot, files: list[tuple[str, str, str | None]], hash_cache: HashCache | None) -> None:
    try:
        snap.manifest = build_manifest(snap.root, files, hash_cache)
    except ManifestError as exc:
        snap.errors.append(str(exc))


def _analyse(
    snap: Snapshot,
    files: list[tuple[str, str, str | None]],
    policy: TokenscanPolicy,
    deadline: float,
    held: list[int] | None,
) -> Snapshot:
    """Reads, parses, renders and exercises what :func:`_listing` found."""
    if held is not None:
        share = _parse_bytes(files, policy)
        PARSE_BUDGET.acquire(share)
        held.append(share)
    if files:  # the sandbox interpreters start while this process reads and parses
        ct.prestart_worker(policy.chat_template.memory_cap)
        if policy.behaviour.enabled:
            tbe.prestart_worker(policy.behaviour.memory_cap)
    reader = _Reader(snap, policy, deadline)
    for rel, open_at, _link in sorted(files, key=_read_order):
        reader.file(rel, open_at)
    _special_tokens(snap)
    _vocabulary(snap, reader.pieces)
    snap.deadline = deadline
    running = _start_exercises(snap, policy)
    _collect_templates(snap, reader, policy)
    _render(snap, policy)
    _tokenizer_behaviour(snap, policy, running)
    return snap


def _read_order(item: tuple[str, str, str | None]) -> tuple[bool, str]:
    """Tokenizer files last: the configs that declare the special tokens are read first."""
    name = os.path.basename(item[0])
    return name == "tokenizer.json" or name.endswith(".model"), item[0]


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
    return sort_findings(with_root(_with_lines(dedupe(found), snap, policy), snap.root))


_LINE_IN_DETAIL = re.compile(r"\(line (\d+)\)")


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


def scan_directory(
    path: str, policy: TokenscanPolicy, with_manifest: bool = True, hash_cache: HashCache | None = None
) -> DirectoryScan:
    """Scans ``path``; never raises for problems of the directory (see the module docstring)."""
    held: list[int] = []
    try:
        return _scan_directory(path, policy, with_manifest, hash_cache, held)
    finally:
        PARSE_BUDGET.release(sum(held))


def _scan_directory(
    path: str, policy: TokenscanPolicy, with_manifest: bool, hash_cache: HashCache | None, held: list[int]
) -> DirectoryScan:
    start = time.perf_counter()
    deadline = time.monotonic() + policy.scan_budget_seconds
    root = os.path.abspath(path)
    try:
        snap, files = _listing(root, policy)
        seen: dict[str, tuple[int, ...]] | None = None  # the files' stat_keys before hashing
        now = 0
        if _wants_manifest(snap, policy, with_manifest):
            now, seen = time.time_ns(), stat_keys(files)
            _hash(snap, files, hash_cache)
        key = verdict_key(snap, policy) if hashed_as_listed(snap, seen) else None
        known: ScanVerdict | None = SCANS.peek("scan", key) if key else None
        if known is not None:  # nothing the verdict depends on changed: no read, parse or sandbox
            return known.scan(root, snap.manifest, time.perf_counter() - start)
        snap = _analyse(snap, files, policy, deadline, held)
    except TreeError as exc:
        return DirectoryScan(root, errors=[str(exc)], duration_seconds=time.perf_counter() - start)
    except (RecursionError, MemoryError) as exc:  # a defect, but never a traceback for a hostile input
        hit = finding("TS910", ".", f"analysis stopped: {type(exc).__name__}", severity=Severity.HIGH)
        return DirectoryScan(root, with_root([hit], root), duration_seconds=time.perf_counter() - start)
    result = DirectoryScan(root, run_checks(snap, policy), list(snap.errors), manifest=snap.manifest)
    result.token_ids_digest = snap.token_ids_digest
    result.files = len(snap.facts)
    result.bytes = sum(f.size for f in snap.facts.values())
    if key and seen is not None and reusable(snap, seen, stat_keys(files), now):
        verdict = ScanVerdict(tuple(result.findings), result.token_ids_digest, result.files, result.bytes)
        SCANS.put("scan", key, verdict, verdict.weight())
    result.duration_seconds = time.perf_counter() - start
    return result


# The verdicts of whole directories, by the digest of everything a verdict depends on
# (:func:`verdict_key`): a rescan of an unchanged directory (the sidecar's usual case) hashes
# or stats its files and returns the stored findings. Small (a few hundred bytes per directory
# without findings): 4096 directories, and at most 32 MiB of findings.
SCANS = _Memo(size=4096, max_weight=32 << 20)
VERDICT_FORMAT = 1  # bump when what a verdict holds, or what its key covers, changes


@dataclass(frozen=True)
class ScanVerdict:
    """What :class:`DirectoryScan` reports that follows from the directory's content alone."""

    findings: tuple[Finding, ...]
    token_ids_digest: str | None
    files: int
    bytes: int

    def weight(self) -> int:
        return 256 + sum(256 + len(f.message) + len(f.fix) + len(f.path) + len(f.key or "") for f in self.findings)

    def scan(self, root: str, manifest: Manifest | None, seconds: float) -> DirectoryScan:
        out = DirectoryScan(root, list(self.findings), [], self.files, self.bytes, seconds, manifest)
        out.token_ids_digest = self.token_ids_digest
        return out


def policy_fingerprint(policy: TokenscanPolicy) -> str:
    """Every field of the policy, canonically (any change to the policy changes it)."""
    return json.dumps(_plain(policy), sort_keys=True)


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data: dataclasses and mappings as objects, sequences as lists
    (sets sorted), scalars as they are, anything else by its repr."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=json.dumps)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def verdict_key(snap: Snapshot, policy: TokenscanPolicy) -> str | None:
    """The digest of every input of a scan's verdict: the tree as listed (names, kinds, link
    targets, sizes, inodes, link counts), the SHA-256 of every file read, the policy and the
    versions of the corpus and of this key. None without a complete manifest."""
    if snap.manifest is None or snap.errors:
        return None
    blob = json.dumps(
        [
            VERDICT_FORMAT,
            tbe.CORPUS_VERSION,
            snap.root,
            snap.root_real,
            [list(vars(e).values()) for e in snap.entries],
            snap.manifest.to_dict()["files"],
            policy_fingerprint(policy),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def stat_keys(files: Iterable[tuple[str, str, str | None]]) -> dict[str, tuple[int, ...]] | None:
    """:func:`~.manifest.stat_key` of every file to read, or None when one cannot be stat'ed."""
    out: dict[str, tuple[int, ...]] = {}
    for rel, path, _link in files:
        try:
            out[rel] = stat_key(os.stat(path, follow_symlinks=False))
        except OSError:
            return None
    return out


def hashed_as_listed(snap: Snapshot, listed: dict[str, tuple[int, ...]] | None) -> bool:
    """Whether every file hashed is the one listed: the ``fstat`` of the descriptor hashed equals
    the file's stat key after the listing (``listed``), unchanged while it was hashed, and (for a
    regular file) the listing's own device, inode and size. Else the directory changed during
    the scan: no verdict is looked up or stored for it (the reasons go to ``snap.transient``)."""
    if snap.manifest is None or listed is None:
        return False
    changed = {rel for rel, key in listed.items() if snap.manifest.keys.get(rel) != key}
    changed |= {e.rel for e in snap.entries if e.rel in listed and e.kind == "file" and _moved(e, listed[e.rel])}
    why = [f"{rel}: changed during the scan" for rel in sorted(changed)]
    snap.transient += [w for w in why if w not in snap.transient]
    return not changed


def _moved(e: Entry, key: tuple[int, ...]) -> bool:
    """Whether stat key ``key`` is of another file than the listing's entry ``e``."""
    return key[:3] != (e.dev, e.ino, e.size)


def reusable(
    snap: Snapshot, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]] | None, now_ns: int
) -> bool:
    """Whether a scan's verdict may be stored under its :func:`verdict_key`: complete (no error,
    nothing left unanalysed or cut short by a budget, no sandbox crash), every file analysed
    exactly as listed and hashed, and no file changed so recently that a change could hide in
    one timestamp tick.

    "As listed and hashed": every descriptor the analysis read (:class:`~.reads.ReadLog`) has
    the file's stat key from after the listing (``before``), which is the stat key of the
    descriptor hashed, and every whole read has the manifest's digest; and no file changed from
    before its hashing to after the checks (``after``). A directory swapped under the scan (a
    parent renamed between the hashing and the reading) fails this: the scan's result stands,
    nothing is stored."""
    if snap.errors or snap.unanalysed or snap.transient or after != before or snap.manifest is None:
        return False
    if not hashed_as_listed(snap, before) or not snap.reads.keys.keys() <= before.keys():
        return False
    files = snap.manifest.files
    return all(
        settled(k, now_ns) and rel in files and snap.reads.matches(rel, k, files[rel].sha256)
        for rel, k in before.items()
    )


SCAN_THREADS = 8


def scan_paths(
    paths: Iterable[str], policy: TokenscanPolicy, with_manifest: bool = True, hash_cache: HashCache | None = None
) -> list[DirectoryScan]:
    """Scans each of ``paths`` (results in order). Up to :data:`SCAN_THREADS` directories are
    scanned at once, so one directory's wait for a sandbox child overlaps the hashing and
    parsing of the next; identical contents are still parsed, loaded and rendered once."""
    items = list(paths)
    if len(items) < 2:
        return [scan_directory(p, policy, with_manifest, hash_cache) for p in items]
    with ThreadPoolExecutor(min(SCAN_THREADS, len(items)), thread_name_prefix="tokenscan-scan") as pool:
        return list(pool.map(lambda p: scan_directory(p, policy, with_manifest, hash_cache), items))


def worst_outcome(scans: Iterable[DirectoryScan], fail_on: Severity) -> int:
    """1 if any scan found a violation, else 3 if any was incomplete, else 0."""
    codes = {s.outcome(fail_on) for s in scans}
    return EXIT_VIOLATION if EXIT_VIOLATION in codes else (EXIT_INCOMPLETE if EXIT_INCOMPLETE in codes else EXIT_OK)
