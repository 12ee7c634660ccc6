"""Findings, their rules (id, name, default severity, fix hint) and the verdict they make.

A :class:`Finding` is what one check reports about one file (or key) of a scanned
directory. Every finding id is a row of :data:`RULES`, so reports (text, JSON, SARIF)
can show the rule's title and fix hint. Severities, from worst: critical, high, medium,
low. A finding at or above the policy's ``fail_on`` severity makes the scan a violation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any


class Severity(enum.IntEnum):
    """Ordered so that ``max()`` is the worst; values are also the SARIF security-severity / 1."""

    LOW = 2
    MEDIUM = 5
    HIGH = 8
    CRITICAL = 9

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        """``"high"`` -> Severity.HIGH; raises ValueError naming the allowed values."""
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"expected one of {', '.join(s.label for s in cls)}, got {text!r}") from None


@dataclass(frozen=True)
class Rule:
    """One kind of finding: stable ``id`` (``TS101``), ``name`` (kebab case), default severity."""

    id: str
    name: str
    severity: Severity
    title: str
    fix: str


_C, _H, _M, _L = Severity.CRITICAL, Severity.HIGH, Severity.MEDIUM, Severity.LOW

RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule("TS101", "auto-map", _C, "auto_map points the loader at custom code",
             "Delete the auto_map key; use a built-in tokenizer class from the whitelist."),
        Rule("TS201", "code-file", _C, "Executable code in a model or tokenizer directory",
             "Delete the file; a tokenizer or model directory holds data only (JSON, safetensors, text)."),
        Rule("TS202", "requirements-file", _H, "Package requirements shipped with the model",
             "Delete the file; dependencies come from the project's own lock, never from a model directory."),
        Rule("TS203", "unexpected-file", _M, "File name or extension not allowed by the policy",
             "Remove the file, or add its name or extension to allowed_file_names / allowed_extensions."),
        Rule("TS301", "tokenizer-class", _C, "tokenizer_class is not on the whitelist",
             "Set tokenizer_class to one of allowed_tokenizer_classes, or review and extend the whitelist."),
        Rule("TS302", "processor-class", _H, "A processor/feature-extractor class reference not on the whitelist",
             "Remove the key, or add the exact class name to allowed_processor_classes after review."),
        Rule("TS401", "model-type", _H, "model_type is not on the whitelist",
             "Use a model whose model_type is in allowed_model_types, or review and extend the list."),
        Rule("TS501", "path-key", _C, "A file-name key is not a plain file name",
             "Make the value a bare file name inside the directory (no '/', '..' or absolute path)."),
        Rule("TS601", "link-escapes", _C, "A link leads outside the scanned directory",
             "Replace the link with a regular copy of the file inside the directory, or remove it."),
        Rule("TS602", "hard-link", _H, "A hard link shares its data with a file outside the directory",
             "Copy the file (cp --no-preserve=links) so the directory owns its data."),
        Rule("TS603", "symlinked-directory", _L, "A symlink to a directory inside the tree (not followed)",
             "Replace the directory symlink with the real directory; the scan reads the target only once."),
        Rule("TS604", "dangling-link", _M, "A symlink whose target does not exist",
             "Remove the link or restore its target inside the directory."),
        Rule("TS605", "special-file", _H, "A FIFO, socket or device node (can hang or redirect a loader)",
             "Remove it; only regular files belong in a model or tokenizer directory."),
        Rule("TS701", "trust-remote-code", _C, "A config asks for trust_remote_code",
             "Delete the key; remote code is never trusted."),
        Rule("TS702", "private-key", _H, "An underscore-prefixed (internal) config key",
             "Delete the key, or add it to allowed_private_keys after review (e.g. _from_model_config)."),
        Rule("TS703", "hub-kernel", _C, "attn_implementation or a kernel references a hub repository",
             "Use a built-in attention implementation name (eager, sdpa, flash_attention_2)."),
        Rule("TS704", "rag-index", _H, "A RAG index_name/index_path (loads external index data)",
             "Delete the key; retrieval indexes are not part of a tokenizer or policy model."),
        Rule("TS705", "gguf-file", _H, "gguf_file redirects loading to a GGUF file",
             "Delete the key and ship safetensors weights instead."),
        Rule("TS706", "custom-code-key", _H, "A key that registers custom code (custom_pipelines, ...)",
             "Delete the key."),
        Rule("TS707", "encoding-key", _H,
             "A loader-read setting (a tokenizer_config.json key, tokenizer.json's truncation or padding) changes "
             "how text becomes ids (truncation from the left or far below any context, split_special_tokens, "
             "model_input_names without the mask, sampling, ...)",
             "Restore the vendor's value or delete the key (the loader's default): truncation_side right, "
             "split_special_tokens false, model_max_length the model's context, model_input_names with input_ids "
             "and attention_mask, tokenizer.json truncation null or Right."),
        Rule("TS801", "template-syntax", _H, "A chat template does not parse as Jinja",
             "Fix or remove the template; an unparsable template cannot be reviewed."),
        Rule("TS802", "template-introspection", _C, "A chat template reaches Python internals (dunder or attr)",
             "Remove the dunder/attr access; this is a server-side template injection pattern."),
        Rule("TS803", "template-content-branch", _H, "Template control flow depends on message content",
             "Branch on roles and flags only; content-keyed branches are how trigger backdoors are built. "
             "Pin the template's SHA-256 in the policy after review if the branch is intended."),
        Rule("TS804", "template-url", _M, "A URL inside a chat template",
             "Remove the URL, or pin the reviewed template's SHA-256 in chat_template.approved_sha256."),
        Rule("TS805", "template-hidden-text", _H, "A chat template adds text the conversation did not contain",
             "Remove the injected text (hidden roles, instructions, invisible characters), or pin the "
             "reviewed template's SHA-256 in chat_template.approved_sha256."),
        Rule("TS806", "template-timeout", _H, "Rendering a chat template exceeded its time limit",
             "Remove the unbounded loops; rendering a template must be cheap."),
        Rule("TS807", "template-output", _H, "Rendering a chat template produced too much output or memory",
             "Remove the amplification (string repetition, nested loops)."),
        Rule("TS808", "template-loops", _M, "Deeply nested loops or large range() in a chat template",
             "Flatten the loops; pin the template's SHA-256 after review if they are needed."),
        Rule("TS809", "template-sandbox", _C, "The sandbox refused an operation of the chat template",
             "Remove the unsafe operation from the template."),
        Rule("TS810", "template-complexity", _H, "A chat template is nested too deeply or too long to analyse",
             "Flatten the template; real chat templates nest a few levels."),
        Rule("TS811", "template-drops-message", _H, "A chat template drops, repeats or reorders a message",
             "Render every message's content once and in order; keep the system prompt."),
        Rule("TS812", "template-role-swap", _H, "A chat template renders a message under another role",
             "Render each message under its own role (a user message as user, never as system)."),
        Rule("TS813", "template-conditional-text", _H,
             "A chat template's markup changes with conversation length, position or the date",
             "Remove the condition; role markup must not depend on how long the conversation is or when it runs."),
        Rule("TS814", "template-unexercised", _H,
             "Chat template code ran under no rendered conversation: what it does was never seen",
             "Review the branch the finding names; remove code no conversation reaches, or approve the template."),
        Rule("TS901", "pickle-dangerous", _C, "A pickle imports a dangerous callable (code execution on load)",
             "Delete the file; never load it. Ship tensors as safetensors and configs as JSON."),
        Rule("TS902", "pickle-unknown-import", _H, "A pickle imports something outside the safe list",
             "Convert the file to safetensors/JSON; if the import is harmless, add it to safe_pickle_globals."),
        Rule("TS903", "pickle-present", _M, "A pickle file (any pickle can run code when loaded)",
             "Convert the file to safetensors or JSON."),
        Rule("TS904", "archive", _M, "A zip archive (torch.save format or an embedded bundle)",
             "Ship safetensors and plain files instead of archives."),
        Rule("TS905", "npy-object", _H, "A NumPy array of dtype object (loading it unpickles)",
             "Store numeric arrays only, or use safetensors."),
        Rule("TS906", "sentencepiece-invalid", _H, "A .model file is not a valid sentencepiece protobuf",
             "Replace it with the genuine sentencepiece model file."),
        Rule("TS907", "json-invalid", _H, "A JSON file does not parse",
             "Replace the file with valid JSON (UTF-8, one object)."),
        Rule("TS908", "size-cap", _H, "A file is larger than the policy's cap for its kind",
             "Check where the file came from; raise max_bytes in the policy only after review."),
        Rule("TS909", "format-mismatch", _H, "A file's content does not match its extension",
             "Replace the file with one in the format its name promises."),
        Rule("TS910", "analysis-incomplete", _H, "Part of a file could not be analysed (limit, budget, malformed)",
             "Treat the file as unsafe: remove it or replace it with a plain, well-formed file."),
        Rule("TS1001", "special-token-missing", _H, "A special token PPO needs (bos/eos/pad) is not defined",
             "Define the token in tokenizer_config.json (and the vocabulary), or relax special_tokens.required."),
        Rule("TS1002", "special-token-unknown", _H, "A special token is not in the tokenizer's vocabulary",
             "Add the token to the vocabulary (added_tokens) or fix its spelling in the config."),
        Rule("TS1003", "pad-is-eos", _M, "pad_token equals eos_token (PPO masks would hide the real EOS)",
             "Define a distinct pad token, or set special_tokens.pad_distinct_from_eos: false."),
        Rule("TS1004", "special-token-lookalike", _H, "A special token hides invisible characters or mimics another",
             "Use the exact token the chat template uses; remove zero-width and look-alike characters."),
        Rule("TS1005", "special-token-ordinary", _H, "A special token is an ordinary word of the vocabulary",
             "Use a dedicated added special token (e.g. <pad>) instead of a word that ordinary text contains."),
        Rule("TS1006", "special-token-conflict", _H,
             "tokenizer_config.json and special_tokens_map.json declare different special tokens",
             "Make both files agree; which one a loader uses depends on its version and on added_tokens_decoder."),
        Rule("TS1101", "drift", _C, "The directory changed after it was approved (time-of-check/time-of-use)",
             "Find who changed it; restore the approved files, or re-scan and approve with "
             "`warden scan tokenizer PATH --approve --state-dir DIR`."),
        Rule("TS1103", "unapproved", _H, "No person has approved this directory yet (first sight)",
             "Review the report (`warden scan tokenizer PATH --state-dir DIR --format json`, field review: "
             "resolved files, rendered conversations, default system prompt, pipeline rules), then "
             "`warden scan tokenizer PATH --approve --state-dir DIR`."),
        Rule("TS1102", "pin-mismatch", _C, "The directory does not match its pinned SHA-256 manifest digest",
             "Restore the pinned content, or update pinned_directories in the policy after review."),
        Rule("TS1201", "tokenizer-load", _H, "The tokenizer does not load, or panics, in the sandbox",
             "Replace the tokenizer files with ones `tokenizers` loads; a panic on ordinary text is a "
             "denial of service."),
        Rule("TS1202", "tokenizer-roundtrip", _H,
             "decode(encode(text)) changes ordinary text (words added, deleted, rewritten)",
             "Remove the normalizer/decoder rule that rewrites text; compare with the vendor's tokenizer."),
        Rule("TS1203", "tokenizer-special-from-text", _C, "Ordinary text encodes to a special or role token",
             "Remove the rule that turns user text into control tokens; special tokens must only come from markup."),
        Rule("TS1204", "tokenizer-adds-tokens", _H, "Encoding adds tokens beyond the declared BOS/EOS/CLS/SEP",
             "Restore the post-processor to add only the declared special tokens."),
        Rule("TS1205", "tokenizer-id-order", _H,
             "Token ids are not in trained order, or two vocabulary files disagree (ids of words swapped)",
             "Restore the vendor's vocabulary files; or, for a BPE vocabulary not in merge order, set "
             "behaviour.bpe_ids_follow_merges: false after review."),
        Rule("TS1206", "tokenizer-timeout", _H, "The tokenizer exceeds its time or memory budget on ordinary text",
             "Replace the pre-tokenizer pattern (catastrophic backtracking) or the oversized model."),
        Rule("TS1207", "token-ids-changed", _C, "Ordinary words map to other ids than in the pinned tokenizer",
             "Restore the approved tokenizer, or update pinned_token_ids (token_ids_digest of --format json) "
             "after review."),
        Rule("TS1209", "tokenizer-pipeline-rule", _H,
             "A normaliser, pre-tokenizer, decoder or model rule can change letters, digits or words",
             "Restore the vendor's tokenizer.json; rules may only change whitespace, metaspace, bytes and "
             "Unicode normal forms."),
        Rule("TS1210", "special-id-collision", _C, "An ordinary entry or another file shares a special token's id",
             "Restore the vendor's vocabulary: each special token id belongs to that token alone."),
        Rule("TS1211", "special-token-folding", _H,
             "A special token is matched after a folding normaliser (look-alike user text becomes it)",
             "Set normalized: false on special tokens (transformers' default for special tokens)."),
        Rule("TS1212", "post-processor-inserts", _H,
             "A post-processor template adds tokens that are not special added tokens (words before every input)",
             "Restore the post-processor: single and pair templates add only declared special tokens."),
        Rule("TS1213", "post-processor-structure", _H,
             "A post-processor template swaps, repeats or drops a sequence, or writes an unexpected type id",
             "Restore the post-processor: single is specials around $A (type id 0), pair specials around $A "
             "then $B (type id 0, and 0 or BERT's 1 from $B on); one processor adds special tokens."),
        Rule("TS1214", "normaliser-unreachable-vocabulary", _H,
             "A normaliser rewrites vocabulary entries (capitals under Lowercase): no text encodes to them",
             "Use the normaliser the vocabulary was trained with (no Lowercase or do_lower_case on a cased "
             "vocabulary); compare with the vendor's tokenizer."),
        Rule("TS1215", "special-token-unmatched", _H,
             "A special added token is not matched where it stands in text (single_word): the markup is plain text",
             "Clear single_word on special and chat-markup tokens (added_tokens in tokenizer.json, "
             "added_tokens_decoder in tokenizer_config.json); compare with the vendor's files."),
        Rule("TS1301", "generation-config-tokens", _H,
             "generation_config.json beside the tokenizer suppresses, forces, biases or cuts generation",
             "Keep only the vendor's sampling settings (temperature, top_p, top_k, sane lengths) and special "
             "eos/bos/pad ids; remove suppress/forced/bad-words/bias/stop entries; review before approving."),
        Rule("TS1208", "token-ids-drift", _C, "Ordinary words map to other ids than when the directory was approved",
             "Find what changed the tokenizer (files, or the tokenizers library); restore it, or re-scan and "
             "approve with `warden scan tokenizer PATH --approve --state-dir DIR` after review."),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One problem: rule ``id``, ``severity``, ``path`` relative to ``root`` (``.`` = the directory
    itself), a ``message`` naming what was seen, and the ``fix`` hint. ``key`` is the JSON
    key or template name the finding is about, when there is one."""

    id: str
    severity: Severity
    path: str
    message: str
    fix: str
    root: str = ""
    key: str | None = None
    line: int | None = None

    @property
    def rule(self) -> Rule:
        return RULES[self.id]

    @property
    def location(self) -> str:
        """``/abs/dir/file.json`` (or ``... [key]``) for one-line reports."""
        where = self.root.rstrip("/") + ("" if self.path == "." else "/" + self.path) if self.root else self.path
        return f"{where} [{self.key}]" if self.key else where

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.rule.name,
            "severity": self.severity.label,
            "root": self.root,
            "path": self.path,
            "key": self.key,
            "line": self.line,
            "message": self.message,
            "fix": self.fix,
        }


def finding(rule_id: str, path: str, message: str, key: str | None = None, severity: Severity | None = None) -> Finding:
    """A finding of rule ``rule_id`` with the rule's severity (unless given) and fix hint."""
    rule = RULES[rule_id]
    return Finding(rule_id, severity or rule.severity, path, message, rule.fix, key=key)


def with_root(findings: Iterable[Finding], root: str) -> list[Finding]:
    """The findings with ``root`` set (checks report paths relative to the root)."""
    return [replace(f, root=root) for f in findings]


def dedupe(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (id, path, key): the most severe, first seen on ties; order kept."""
    best: dict[tuple[str, str, str | None], Finding] = {}
    for f in findings:
        k = (f.id, f.path, f.key)
        if k not in best or f.severity > best[k].severity:
            best[k] = f
    return list(best.values())


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by root, path and id (stable, for reports and tests)."""
    return sorted(findings, key=lambda f: (-int(f.severity), f.root, f.path, _id_order(f.id), f.key or ""))


def _id_order(rule_id: str) -> int:
    return int(rule_id[2:])


def is_blocking(f: Finding, fail_on: Severity) -> bool:
    return f.severity >= fail_on


def count_by_severity(findings: Iterable[Finding]) -> dict[str, int]:
    """``{"critical": n, "high": n, "medium": n, "low": n}`` (every key present)."""
    counts = {s.label: 0 for s in sorted(Severity, reverse=True)}
    for f in findings:
        counts[f.severity.label] += 1
    return counts
