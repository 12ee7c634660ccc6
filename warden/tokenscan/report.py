"""Reports of a scan: text (grouped by severity, with fix hints), JSON, and SARIF 2.1.0.

SARIF: one run with every rule of :data:`~.findings.RULES` (level from the default severity,
``properties.security-severity`` for code-scanning UIs), one result per finding located
by ``uriBaseId`` = the scanned directory (``originalUriBaseIds`` holds its file URI), and
the incomplete-scan errors as ``toolExecutionNotifications``.
"""

from __future__ import annotations

import pathlib
import unicodedata
import urllib.parse
from collections.abc import Sequence
from typing import Any

from warden import __version__
from warden.tokenscan.findings import RULES, Finding, Severity, count_by_severity, sort_findings
from warden.tokenscan.scanner import DirectoryScan, worst_outcome

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
TOOL_NAME = "warden-tokenscan"
OUTCOME_WORDS = {0: "clean", 1: "VIOLATION", 3: "INCOMPLETE"}


def escape_control(text: str) -> str:
    """``text`` with control, format and line-separator characters written as escapes, so a
    hostile file name cannot move the cursor, clear the screen or start a forged line."""
    out = []
    for ch in str(text):
        if ch != " " and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _all(scans: Sequence[DirectoryScan]) -> list[Finding]:
    return sort_findings(f for s in scans for f in s.findings)


def render_text(scans: Sequence[DirectoryScan], fail_on: Severity, policy_path: str | None = None) -> str:
    findings = _all(scans)
    counts = count_by_severity(findings)
    code = worst_outcome(scans, fail_on)
    summary = ", ".join(f"{n} {label}" for label, n in counts.items() if n) or "no findings"
    lines = [
        f"tokenscan: {len(scans)} director{'y' if len(scans) == 1 else 'ies'}, {summary} "
        f"-> {OUTCOME_WORDS[code]} (fail_on {fail_on.label}; policy {policy_path or 'built-in'})"
    ]
    e = escape_control
    for s in scans:
        state = OUTCOME_WORDS[s.outcome(fail_on)]
        lines.append(f"  {state:<10} {e(s.root)}  ({s.files} files, {s.duration_seconds:.3f}s)")
        lines += [f"             incomplete: {e(err)}" for err in s.errors]
    for severity in sorted(Severity, reverse=True):
        group = [f for f in findings if f.severity == severity]
        if not group:
            continue
        lines.append("")
        lines.append(f"{severity.label.upper()} ({len(group)})")
        for f in group:
            lines.append(f"  {f.id} {f.rule.name}: {e(f.location)}")
            lines.append(f"      {e(f.message)}")
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines)


def render_json(scans: Sequence[DirectoryScan], fail_on: Severity, policy_path: str | None = None) -> dict[str, Any]:
    findings = _all(scans)
    code = worst_outcome(scans, fail_on)
    return {
        "tool": TOOL_NAME,
        "version": __version__,
        "policy": policy_path,
        "fail_on": fail_on.label,
        "exit_code": code,
        "clean": code == 0,
        "counts": count_by_severity(findings),
        "directories": [s.to_dict(fail_on) for s in scans],
    }


def sarif_level(severity: Severity) -> str:
    return {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.MEDIUM: "warning"}.get(severity, "note")


def _rules() -> list[dict[str, Any]]:
    return [
        {
            "id": r.id,
            "name": "".join(part.capitalize() for part in r.name.split("-")),
            "shortDescription": {"text": r.title},
            "fullDescription": {"text": f"{r.title}."},
            "help": {"text": r.fix},
            "defaultConfiguration": {"level": sarif_level(r.severity)},
            "properties": {"security-severity": f"{int(r.severity):.1f}", "tags": ["security", "supply-chain"]},
        }
        for r in RULES.values()
    ]


def _result(f: Finding, base: str, index: dict[str, int]) -> dict[str, Any]:
    uri = "." if f.path == "." else urllib.parse.quote(pathlib.PurePosixPath(f.path).as_posix(), safe="/")
    props: dict[str, Any] = {"severity": f.severity.label, "security-severity": f"{int(f.severity):.1f}"}
    if f.key:
        props["key"] = f.key
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri, "uriBaseId": base}}
    if f.line:
        physical["region"] = {"startLine": f.line}
    return {
        "ruleId": f.id,
        "ruleIndex": index[f.id],
        "level": sarif_level(f.severity),
        "message": {"text": f"{f.message}. Fix: {f.fix}"},
        "locations": [{"physicalLocation": physical}],
        "partialFingerprints": {"tokenscan/v1": f"{f.id}:{f.path}:{f.key or ''}"},
        "properties": props,
    }


def render_sarif(scans: Sequence[DirectoryScan], fail_on: Severity) -> dict[str, Any]:
    index = {rule_id: i for i, rule_id in enumerate(RULES)}
    bases = {s.root: f"SCANROOT{i}" for i, s in enumerate(scans)}
    results = [_result(f, bases[s.root], index) for s in scans for f in sort_findings(s.findings)]
    notes = [{"level": "error", "message": {"text": e}} for s in scans for e in s.errors]
    run = {
        "tool": {"driver": {"name": TOOL_NAME, "version": __version__, "rules": _rules()}},
        "originalUriBaseIds": {b: {"uri": pathlib.Path(r).as_uri() + "/"} for r, b in bases.items()},
        "invocations": [
            {
                "executionSuccessful": not notes,
                "toolExecutionNotifications": notes,
                "exitCode": worst_outcome(scans, fail_on),
            }
        ],
        "results": results,
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
