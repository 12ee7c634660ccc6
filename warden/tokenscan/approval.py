"""What a scan adds against its directory's approval record, and what to record: one decision
for the CLI (``warden scan tokenizer --state-dir DIR [--approve]``) and the sidecar.

:func:`review` does no I/O and changes nothing it is given: the caller loads the record
(:meth:`~.manifest.ApprovalStore.load`), passes it (or the ManifestError the load raised), and
stores what the review says to store (:meth:`~.manifest.ApprovalStore.save`, with the time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warden.tokenscan.findings import Finding, Severity, finding
from warden.tokenscan.manifest import Approval, Manifest, ManifestError, approval_findings
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.result import DirectoryScan


@dataclass(frozen=True)
class ToSave:
    """An approval to record for the scanned directory (the caller adds when)."""

    manifest: Manifest
    token_ids_digest: str | None
    accepted: tuple[str, ...] = ()  # fingerprints of the findings accepted with it


@dataclass(frozen=True)
class Review:
    """``scan``: a new result, with the record's drift findings (TS1101, TS1208) first, or the
    record's load error; ``save``: what to record, or None; ``approved``: whether the directory
    has an approval once ``save`` is recorded; ``drift``: the drift findings when the scan was
    compared with a record (empty: no drift), None when it was not."""

    scan: DirectoryScan
    save: ToSave | None
    approved: bool
    drift: tuple[Finding, ...] | None


def fingerprint(f: Finding) -> str:
    """What identifies a finding across scans of unchanged files: rule, file, key and message."""
    return f"{f.id}|{f.path}|{f.key or ''}|{f.message}"


def _accepted(scan: DirectoryScan, accepted: tuple[str, ...]) -> list[Finding]:
    """The findings, those a person accepted at approval lowered to LOW and marked as accepted."""
    keep = set(accepted)
    return [
        replace(f, severity=Severity.LOW, message=f"accepted at approval: {f.message}") if fingerprint(f) in keep else f
        for f in scan.findings
    ]


def review(
    loaded: Approval | ManifestError | None,
    scan: DirectoryScan,
    approve: bool,
    policy: TokenscanPolicy,
    accept_findings: bool = False,
) -> Review:
    """The approval decision for ``scan`` given ``loaded``: the directory's approval record,
    None when it has none, or the error of an unreadable record (the scan becomes incomplete).

    A scan without a manifest is neither compared nor approved. With ``approve`` (the CLI's
    ``--approve``, a person's decision after reading the scan's review report), a clean scan
    (at ``policy.fail_severity``) is recorded, replacing any record, and nothing is compared;
    with ``accept_findings`` too (``--approve --accept-findings``) a scan with findings is
    recorded with the fingerprints of the findings accepted (:func:`fingerprint`): a later scan
    lowers exactly those to LOW (marked accepted); any other finding keeps its severity.
    Without it, a scan is compared with its record; a directory with no record is *unapproved*
    (first sight): TS1103, low under ``policy.unapproved: warn``, high under ``block``. Nothing
    approves itself: the sidecar never passes ``approve``.
    ``scan`` is never changed: the result is a copy (``dataclasses.replace``)."""
    if isinstance(loaded, ManifestError):
        return Review(_copy(scan, errors=[*scan.errors, str(loaded)]), None, False, None)
    if scan.manifest is None:
        return Review(_copy(scan), None, loaded is not None, None)
    if approve:
        if scan.outcome(policy.fail_severity) == 0:
            return Review(_copy(scan), ToSave(scan.manifest, scan.token_ids_digest), True, None)
        if accept_findings and not scan.errors:
            accepted = tuple(sorted({fingerprint(f) for f in scan.findings}))
            save = ToSave(scan.manifest, scan.token_ids_digest, accepted)
            return Review(_copy(scan, findings=_accepted(scan, accepted)), save, True, None)
        return Review(_copy(scan), None, loaded is not None, None)
    if loaded is None:
        return Review(_copy(scan, findings=[unapproved_finding(scan, policy), *scan.findings]), None, False, None)
    found = tuple(replace(f, root=scan.root) for f in approval_findings(loaded, scan.manifest, scan.token_ids_digest))
    return Review(_copy(scan, findings=[*found, *_accepted(scan, loaded.accepted)]), None, True, found)


def _copy(scan: DirectoryScan, findings: list[Finding] | None = None, errors: list[str] | None = None) -> DirectoryScan:
    """``scan`` with its own lists (a later change to the copy never reaches ``scan``)."""
    return replace(
        scan,
        findings=list(scan.findings) if findings is None else findings,
        errors=list(scan.errors) if errors is None else errors,
    )


def unapproved_finding(scan: DirectoryScan, policy: TokenscanPolicy) -> Finding:
    """TS1103 for a directory seen for the first time (no approval record)."""
    severity = Severity.HIGH if policy.unapproved == "block" else Severity.LOW
    digest = scan.manifest.digest[:12] if scan.manifest else "?"
    message = (
        f"first sight of this directory (manifest {digest}): not approved (policy unapproved: {policy.unapproved}); "
        "review its report and approve it with --approve"
    )
    prompts = [
        t["default_system_prompt"] for t in (scan.review or {}).get("templates", []) if t.get("default_system_prompt")
    ]
    if prompts:  # the text a conversation without a system message gets: for the reviewer's eyes first
        flat = " ".join(prompts[0].split())
        message += f"; default system prompt: {flat[:160] + ('...' if len(flat) > 160 else '')!r}"
    return replace(finding("TS1103", ".", message, severity=severity), root=scan.root)
