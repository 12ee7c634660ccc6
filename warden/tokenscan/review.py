"""The report a person reviews before approving a tokenizer directory (issue 33).

Approval is the decision; the scan's findings are evidence. :func:`review_of` gathers what a
person needs to decide, from the snapshot a scan built (pure, no I/O): every file of the
manifest with its SHA-256 (what ``--approve`` pins), the tokenizer files the loader reads and
as what, each chat template's digest, its default system prompt (the text it adds before a
conversation without a system message) and a few of its renders (the battery's and generated
conversations', contents replaced by placeholders), and the pipeline rules of ``tokenizer.json``
(normaliser, pre-tokenizer, decoder, post-processor, the added tokens).
"""

from __future__ import annotations

from typing import Any

from warden.tokenscan.snapshot import Snapshot

PIPELINE_KEYS = ("normalizer", "pre_tokenizer", "decoder", "post_processor")
MAX_ADDED = 200


def review_of(snap: Snapshot) -> dict[str, Any]:
    files = []
    if snap.manifest is not None:
        files = [{"path": rel, "sha256": d.sha256, "size": d.size} for rel, d in sorted(snap.manifest.files.items())]
    tok = snap.top("tokenizer.json")
    pipeline: dict[str, Any] = {}
    if isinstance(tok, dict):
        pipeline = {k: tok.get(k) for k in PIPELINE_KEYS}
        raw = tok.get("added_tokens")
        added: list[Any] = raw if isinstance(raw, list) else []
        pipeline["added_tokens"] = [
            {k: a.get(k) for k in ("id", "content", "special", "normalized")}
            for a in added[:MAX_ADDED]
            if isinstance(a, dict)
        ]
        model = tok.get("model")
        pipeline["model_type"] = model.get("type") if isinstance(model, dict) else None
    templates = [
        {
            "file": t.rel,
            "key": t.key,
            "sha256": t.digest,
            "pinned": t.pinned,
            "default_system_prompt": t.default_system,
            "renders": [{"conversation": name, "text": text} for name, text in t.renders],
        }
        for t in snap.templates
    ]
    loaded = {rel: kind for rel, (kind, *_rest) in sorted(snap.tokenizer_files.items())}
    return {"files": files, "tokenizer_files": loaded, "templates": templates, "pipeline": pipeline}
