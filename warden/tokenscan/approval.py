"""What a scan adds against its directory's approval record, and what to record: one decision
for the CLI (``warden scan tokenizer --state-dir DIR [--approve]``) and the sidecar.

:func:`review` does no I/O and changes nothing it is given: the caller loads the record
(:meth:`~.manifest.ApprovalStore.load`), passes it (or the ManifestError the load raised), and
stores what the review says to store (:meth:`~.manifest.ApprovalStore.save`, with the time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warden.tokenscan.findings import Finding
from warden.tokenscan.manifest import Approval, Manifest, ManifestError, approval_findings
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.result import DirectoryScan


@dataclass(frozen=True)
class ToSave:
    """An approval to record for the scanned directory (the caller adds when)."""

    manifest: Manifest
    token_ids_digest: str | None


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


def review(
    loaded: Approval | ManifestError | None, scan: DirectoryScan, approve: bool, policy: TokenscanPolicy
) -> Review:
    """The approval decision for ``scan`` given ``loaded``: the directory's approval record,
    None when it has none, or the error of an unreadable record (the scan becomes incomplete).

    A scan without a manifest is neither compared nor approved. With ``approve``, a clean scan
    (at ``policy.fail_severity``) is recorded, replacing any record, and nothing is compared
    (the CLI's ``--approve``; the sidecar approves a directory that has no record yet, so it
    passes ``approve=loaded is None``). Without it, a scan is compared with its record, if any.
    ``scan`` is never changed: the result is a copy (``dataclasses.replace``)."""
    if isinstance(loaded, ManifestError):
        return Review(_copy(scan, errors=[*scan.errors, str(loaded)]), None, False, None)
    if scan.manifest is None:
        return Review(_copy(scan), None, loaded is not None, None)
    if approve:
        if scan.outcome(policy.fail_severity) == 0:
            return Review(_copy(scan), ToSave(scan.manifest, scan.token_ids_digest), True, None)
        return Review(_copy(scan), None, loaded is not None, None)
    if loaded is None:
        return Review(_copy(scan), None, False, None)
    found = tuple(replace(f, root=scan.root) for f in approval_findings(loaded, scan.manifest, scan.token_ids_digest))
    return Review(_copy(scan, findings=[*found, *scan.findings]), None, True, found)


def _copy(scan: DirectoryScan, findings: list[Finding] | None = None, errors: list[str] | None = None) -> DirectoryScan:
    """``scan`` with its own lists (a later change to the copy never reaches ``scan``)."""
    return replace(
        scan,
        findings=list(scan.findings) if findings is None else findings,
        errors=list(scan.errors) if errors is None else errors,
    )
