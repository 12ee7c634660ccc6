"""Check 8: chat templates, from the static analysis and the sandboxed render in the snapshot."""

from __future__ import annotations

from sidecars.tokenscan.chat_template import CANARIES, INJECTION_RE, residual_text
from sidecars.tokenscan.findings import Finding, Severity, finding
from sidecars.tokenscan.policy import TokenscanPolicy
from sidecars.tokenscan.snapshot import Snapshot, TemplateSource

ISSUE_RULES = {
    "syntax": ("TS801", None),
    "introspection": ("TS802", None),
    "content_branch": ("TS803", None),
    "url": ("TS804", None),
    "hidden_text": ("TS805", Severity.MEDIUM),
    "invisible": ("TS805", None),
    "injection": ("TS805", None),
    "loops": ("TS808", None),
    "size": ("TS908", None),
}
RENDER_RULES = {"timeout": "TS806", "too_large": "TS807", "memory": "TS807", "security": "TS809"}


def _where(t: TemplateSource) -> str:
    return f"template {t.key}" if t.key else "template"


def _render_findings(t: TemplateSource, policy: TokenscanPolicy, specials: tuple[str, ...]) -> list[Finding]:
    render = t.render
    if render is None:
        return []
    if render.status in RENDER_RULES:
        return [finding(RENDER_RULES[render.status], t.rel, f"{_where(t)}: {render.message}", key=t.key)]
    if render.status != "ok":
        return []
    out = []
    rest = residual_text(render.output, specials)
    if sum(ch.isalpha() for ch in rest) >= policy.chat_template.max_literal_chars:
        sev = Severity.HIGH if INJECTION_RE.search(rest) else Severity.MEDIUM
        out.append(
            finding(
                "TS805",
                t.rel,
                f"{_where(t)} renders text no message contained: {rest[:100]!r}",
                key=t.key,
                severity=sev,
            )
        )
    if CANARIES["user"] not in render.output and CANARIES["user2"] not in render.output:
        out.append(
            finding(
                "TS805", t.rel, f"{_where(t)} drops or rewrites the user's message", key=t.key, severity=Severity.MEDIUM
            )
        )
    return out


def check_chat_templates(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    specials = tuple(v for v in snap.special_tokens.values() if v) + snap.extra_special
    out = []
    for t in snap.templates:
        if t.pinned:
            continue
        for issue in t.issues:
            rule_id, sev = ISSUE_RULES[issue.kind]
            out.append(finding(rule_id, t.rel, f"{_where(t)}: {issue.detail}", key=t.key, severity=sev))
        out += _render_findings(t, policy, specials)
    return out
