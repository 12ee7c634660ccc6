"""Check 8: chat templates, from the static analysis and the sandboxed render in the snapshot."""

from __future__ import annotations

import re

from warden.tokenscan.chat_template import CANARIES, instruction_text
from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot, TemplateSource
from warden.tokenscan.template_battery import PROBE_WORDS

ISSUE_RULES = {
    "syntax": ("TS801", None),
    "introspection": ("TS802", None),
    "content_branch": ("TS803", None),
    "url": ("TS804", None),
    "invisible": ("TS805", None),
    "injection": ("TS805", None),
    "loops": ("TS808", None),
    "size": ("TS908", None),
    "complexity": ("TS810", None),
}
BEHAVIOUR_RULES = {
    "order": "TS811",
    "role": "TS812",
    "varies": "TS813",
    "text": "TS805",
    "invisible": "TS805",
    "url": "TS804",
    "taint": "TS803",
    "private": "TS802",
    "lookalike": "TS812",
    "unexercised": "TS814",
}
RENDER_RULES = {"timeout": "TS806", "too_large": "TS807", "memory": "TS807", "security": "TS809", "crashed": "TS807"}


def _where(t: TemplateSource) -> str:
    return f"template {t.key}" if t.key else "template"


def _render_findings(t: TemplateSource) -> list[Finding]:
    out = []
    if t.render is not None and t.render.status in RENDER_RULES:
        out.append(finding(RENDER_RULES[t.render.status], t.rel, f"{_where(t)}: {t.render.message}", key=t.key))
    for issue in t.behaviour:
        out.append(finding(BEHAVIOUR_RULES[issue.kind], t.rel, f"{_where(t)}: {issue.detail}", key=t.key))
    return out


def _default_prompt_findings(t: TemplateSource) -> list[Finding]:
    """The text a template adds before a conversation without a system message (a default system
    prompt, as rendered) is judged like any fixed text: instruction-like or steering text in it is
    TS805 (identity, date and protocol lines are not; see :func:`~..chat_template.instruction_text`)."""
    why = instruction_text(t.default_system) if t.default_system else None
    if not why:
        return []
    return [finding("TS805", t.rel, f"{_where(t)}: the default system prompt has {why}", key=t.key)]


_PROBE_TEXTS = (*PROBE_WORDS, *CANARIES.values())
PROBES_RE = re.compile("|".join([r"\x00[0-9]+\x00", r"QPROBE[0-9]+X", *map(re.escape, _PROBE_TEXTS)]))
"""The conversation's own parts in a review render (battery probes, generated placeholders)."""


def _render_text_findings(t: TemplateSource) -> list[Finding]:
    """Every review render (battery and generated shapes) with the conversation's parts cut out
    (each a sentence break): what remains is the template's text wherever it appears (between
    turns, around tools and documents, after the last message), judged like its literals; this
    covers text assembled at run time from pieces no literal shows."""
    for label, render in t.renders:
        why = instruction_text(PROBES_RE.sub("\n", render))
        if why:
            return [finding("TS805", t.rel, f"{_where(t)}: the {label} render adds {why}", key=t.key)]
    return []


def check_chat_templates(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for t in snap.templates:
        if t.pinned:
            continue
        for issue in t.issues:
            rule_id, sev = ISSUE_RULES[issue.kind]
            out.append(finding(rule_id, t.rel, f"{_where(t)}: {issue.detail}", key=t.key, severity=sev))
        out += _render_findings(t) + _default_prompt_findings(t) + _render_text_findings(t)
    return out
