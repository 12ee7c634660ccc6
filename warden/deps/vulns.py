"""Known vulnerabilities of the installed distributions, from an offline OSV database (pure).

Records of one package that share an id or alias are one finding (named by the most
severe record, every id listed), with the highest severity of the group.
"""

from __future__ import annotations

from collections.abc import Sequence

from warden.deps.installed import InstalledDist
from warden.deps.model import SEVERITIES, Finding
from warden.deps.osv.loader import OsvDatabase
from warden.deps.osv.matcher import VulnRecord, group_aliases, rank, representative


def _finding(dist: InstalledDist, group: list[VulnRecord], fail_on: Sequence[str]) -> Finding:
    rep = representative(group)
    ids = sorted({i for r in group for i in (r.id, *r.aliases)})
    severity = max((r.severity for r in group), key=rank)
    fixed = sorted({v for r in group for v in r.fixed_versions(dist.canonical)})
    fix_text = f"fixed in {', '.join(fixed)}" if fixed else "no fixed version"
    message = f"{dist.name} {dist.version}: {rep.id} ({severity}) {rep.summary or ''}".rstrip() + f"; {fix_text}"
    details = {
        "id": rep.id,
        "ids": ids,
        "aliases": [i for i in ids if i != rep.id],
        "severity": severity,
        "score": rep.score,
        "vector": rep.vector,
        "package": dist.canonical,
        "version": dist.version,
        "fixed": fixed,
        "summary": rep.summary,
    }
    return Finding("vulns", "vulnerable", dist.canonical, message, severity in fail_on, details)


def unevaluable(dist: InstalledDist, ident: str) -> Finding:
    """A record whose ranges cannot be decided for ``dist``: the audit fails closed (exit 3)
    unless an ``ignore`` entry names the id (audit.py turns what is left into ``incomplete``)."""
    message = f"{dist.name} {dist.version}: {ident}: its affected ranges cannot be evaluated for this version"
    details = {"id": ident, "ids": [ident], "package": dist.canonical, "version": dist.version}
    return Finding("vulns", "unevaluable", dist.canonical, message, True, details)


def check_vulnerabilities(
    db: OsvDatabase, dists: Sequence[InstalledDist], fail_on: Sequence[str] = SEVERITIES
) -> tuple[list[Finding], list[Finding]]:
    """(one finding per vulnerability per installed distribution, one ``unevaluable`` per record
    whose ranges could not be evaluated for a distribution)."""
    findings: list[Finding] = []
    notes: list[Finding] = []
    for dist in dists:
        hits, errors = db.query(dist.canonical, dist.version)
        notes.extend(unevaluable(dist, ident) for ident in errors)
        for group in group_aliases(hits):
            findings.append(_finding(dist, group, fail_on))
    findings.sort(key=lambda f: (-rank(str(f.details["severity"])), f.subject, str(f.details["id"])))
    return findings, notes
