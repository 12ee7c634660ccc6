"""Renders an AuditReport as text (for people) or JSON (for machines)."""

from __future__ import annotations

from typing import Any

from warden.deps.audit import AuditReport
from warden.deps.model import CHECKS, SEVERITIES, Finding
from warden.logs import utc_timestamp

VERDICTS = {0: "clean", 1: "VIOLATION", 3: "INCOMPLETE"}


def summary_counts(report: AuditReport) -> dict[str, Any]:
    by_check: dict[str, dict[str, int]] = {c: {} for c in CHECKS}
    for f in report.findings:
        by_check.setdefault(f.check, {})
        by_check[f.check][f.kind] = by_check[f.check].get(f.kind, 0) + 1
    severities = dict.fromkeys(SEVERITIES, 0)
    for f in report.findings:
        if f.check == "vulns" and f.kind == "vulnerable":
            sev = str(f.details.get("severity") or "unknown")
            severities[sev if sev in severities else "unknown"] += 1
    return {"findings": by_check, "vulnerabilities": severities, "ignored": len(report.ignored)}


def to_json(report: AuditReport) -> dict[str, Any]:
    return {
        "exit_code": report.exit_code,
        "verdict": VERDICTS.get(report.exit_code, "?").lower(),
        "target": report.target.to_dict(),
        "lock": {"path": report.lock.path, "format": report.lock.format, "packages": len(report.lock.packages)}
        if report.lock
        else None,
        "osv": {"path": report.osv_db, "age_seconds": report.osv_age_seconds} if report.osv_db else None,
        "started": utc_timestamp(report.started),
        "duration_seconds": round(report.duration, 3),
        "checks": list(report.checks),
        "strict": report.strict,
        "summary": summary_counts(report),
        "findings": [f.to_dict() for f in report.findings],
        "ignored": [f.to_dict() for f in report.ignored],
        "incomplete": report.incomplete,
        "degraded": report.degraded,
        "notes": report.notes,
        "stats": report.stats,
        "packages": [{"name": d.name, "version": d.version, "location": d.meta_dir} for d in report.dists],
    }


def _line(f: Finding) -> str:
    mark = "FAIL" if f.blocking else "warn"
    return f"  {mark} {f.kind:<18} {f.message}"


def to_text(report: AuditReport, max_per_kind: int = 20) -> str:
    code = report.exit_code
    head = [
        f"deps audit: {VERDICTS.get(code, '?')} (exit {code}) in {report.duration:.2f}s",
        f"  target   {report.target.description}",
    ]
    if report.lock:
        head.append(f"  lock     {report.lock.path} ({report.lock.format}, {len(report.lock.packages)} entries)")
    if report.osv_db:
        age = report.osv_age_seconds
        head.append(f"  osv      {report.osv_db}" + (f" ({age / 86400:.1f} days old)" if age is not None else ""))
    integ = report.stats.get("integrity")
    if integ:
        head.append(
            f"  files    {integ['files_walked']} walked, {integ['files_hashed']} hashed, "
            f"{integ['files_cached']} cached, "
            f"{integ['pyc_checked']} .pyc compiled, {integ['pyc_cached'] + integ.get('pyc_verdict_cached', 0)} cached"
            + (" (full pass)" if integ.get("full_pass") else "")
        )
    closure = report.stats.get("closure")
    if closure:
        roots = closure.get("roots") or []
        head.append(
            f"  sys.path {len(closure.get('sys_path') or [])} entries (read, not run); "
            f"{len(roots)} more directories walked: {', '.join(roots[:5]) or 'none'}"
        )
    for built in report.stats.get("built_locally") or ():
        head.append(f"  built    {built['name']} {built['version']} locally, from {built['built_from']}")
    lines = head
    for check in CHECKS:
        found = [f for f in report.findings if f.check == check]
        unchecked = check not in report.checks or (check == "vulns" and not report.osv_db and not found)
        if unchecked and not found:
            lines.append(f"{check}: not checked")
            continue
        lines.append(f"{check}: {'ok' if not found else f'{len(found)} finding(s)'}")
        shown: dict[str, int] = {}
        for f in found:
            shown[f.kind] = shown.get(f.kind, 0) + 1
            if shown[f.kind] <= max_per_kind:
                lines.append(_line(f))
        lines.extend(f"  ... {n - max_per_kind} more {k}" for k, n in shown.items() if n > max_per_kind)
    for f in report.ignored:
        lines.append(f"  ignored {f.details.get('id')} ({f.subject}) by policy: {f.message}")
    for reason in report.incomplete:
        lines.append(f"INCOMPLETE: {reason}")
    for reason in report.degraded:
        lines.append(f"{'INCOMPLETE' if report.strict else 'warning'}: {reason}")
    lines.extend(f"note: {n}" for n in report.notes[:20])
    return "\n".join(lines)
