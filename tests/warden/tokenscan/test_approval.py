"""warden.tokenscan.approval.review: the one approval decision of the CLI and the sidecar. It
returns a new result and what to record; the scan it is given is never changed."""

from __future__ import annotations

import copy

import pytest

from warden.tokenscan.approval import Review, ToSave, review
from warden.tokenscan.findings import finding
from warden.tokenscan.manifest import Approval, FileDigest, Manifest, ManifestError
from warden.tokenscan.policy import default_policy
from warden.tokenscan.result import DirectoryScan

POLICY = default_policy()
ROOT = "/models/tok"
APPROVED = Manifest(ROOT, {"tokenizer.json": FileDigest("a" * 64, 10)})
CHANGED = Manifest(ROOT, {"tokenizer.json": FileDigest("b" * 64, 10)})


def scan_of(manifest: Manifest | None = APPROVED, dirty: bool = False, ids: str | None = "c" * 64) -> DirectoryScan:
    found = [finding("TS101", "config.json", "auto_map")] if dirty else []
    return DirectoryScan(ROOT, found, [], 3, 30, 0.1, manifest, ids)


def reviewed(loaded, scan: DirectoryScan, approve: bool) -> Review:
    """:func:`review`, checking that ``scan`` is left exactly as it was and not shared."""
    before = copy.deepcopy(scan)
    out = review(loaded, scan, approve, POLICY)
    assert scan == before  # not mutated
    assert out.scan is not scan and out.scan.findings is not scan.findings and out.scan.errors is not scan.errors
    return out


def test_an_unreadable_record_makes_the_scan_incomplete():
    scan = scan_of()
    out = reviewed(ManifestError("approved/x.json: approval record unreadable"), scan, approve=True)
    assert out.scan.errors == ["approved/x.json: approval record unreadable"] and scan.errors == []
    assert (out.save, out.approved, out.drift) == (None, False, None)
    assert out.scan.outcome(POLICY.fail_severity) == 3


@pytest.mark.parametrize("approve", [False, True])
def test_a_scan_without_a_manifest_is_neither_compared_nor_approved(approve):
    record = Approval(APPROVED, "2026-01-01T00:00:00Z", "c" * 64)
    out = reviewed(record, scan_of(manifest=None), approve)
    assert (out.save, out.approved, out.drift, out.scan.findings) == (None, True, None, [])
    out = reviewed(None, scan_of(manifest=None), approve)
    assert (out.save, out.approved, out.drift) == (None, False, None)


def test_approve_records_a_clean_scan_replacing_the_record_without_comparing():
    record = Approval(APPROVED, "2026-01-01T00:00:00Z", "c" * 64)
    out = reviewed(record, scan_of(manifest=CHANGED, ids="d" * 64), approve=True)
    assert out.save == ToSave(CHANGED, "d" * 64) and out.approved and out.drift is None
    assert out.scan.findings == []  # --approve re-approves: no drift finding against the old record
    out = reviewed(None, scan_of(), approve=True)  # the sidecar's first clean scan
    assert out.save == ToSave(APPROVED, "c" * 64) and out.approved


def test_approve_never_records_a_scan_with_a_blocking_finding():
    out = reviewed(None, scan_of(dirty=True), approve=True)
    assert (out.save, out.approved, out.drift) == (None, False, None)
    record = Approval(APPROVED, "2026-01-01T00:00:00Z")
    out = reviewed(record, scan_of(dirty=True), approve=True)
    assert (out.save, out.approved) == (None, True)  # the old record stands


def test_without_approve_a_scan_is_compared_with_its_record():
    record = Approval(APPROVED, "2026-01-01T00:00:00Z", "c" * 64)
    scan = scan_of(manifest=CHANGED, dirty=True, ids="d" * 64)
    out = reviewed(record, scan, approve=False)
    assert [f.id for f in out.scan.findings] == ["TS1101", "TS1208", "TS101"]  # drift first, then the scan's
    assert all(f.root == ROOT for f in out.scan.findings[:2]) and "at 2026-01-01" in out.scan.findings[0].message
    assert out.drift == tuple(out.scan.findings[:2]) and out.save is None and out.approved
    assert [f.id for f in scan.findings] == ["TS101"]
    same = reviewed(record, scan_of(), approve=False)
    assert same.drift == () and same.scan.findings == [] and same.approved and same.save is None


def test_first_sight_is_unapproved_warn_or_block_and_nothing_approves_itself():
    """Issue 33: approval is the decision. A directory without a record is unapproved (TS1103,
    low under unapproved: warn, so the scan still passes; high under block) and nothing is
    recorded without approve, however clean the scan."""
    out = reviewed(None, scan_of(), approve=False)
    assert (out.save, out.approved, out.drift) == (None, False, None)
    assert [(f.id, f.severity.label, f.root) for f in out.scan.findings] == [("TS1103", "low", ROOT)]
    assert out.scan.outcome(POLICY.fail_severity) == 0
    block = default_policy(unapproved="block")
    out = review(None, scan_of(), False, block)
    assert [(f.id, f.severity.label) for f in out.scan.findings] == [("TS1103", "high")]
    assert out.scan.outcome(block.fail_severity) == 1 and out.save is None
    dirty = review(None, scan_of(dirty=True), False, POLICY)
    assert [f.id for f in dirty.scan.findings] == ["TS1103", "TS101"]  # evidence beside the decision
    prompted = scan_of()
    prompted.review = {"templates": [{"default_system_prompt": "You are Qwen.\nBe helpful."}]}
    (first,) = review(None, prompted, False, POLICY).scan.findings
    assert first.message.endswith("default system prompt: 'You are Qwen. Be helpful.'")
    with pytest.raises(ValueError, match="unapproved"):
        default_policy(unapproved="auto")


def test_approve_despite_findings_is_explicit_and_covers_only_those(tmp_path):
    from warden.tokenscan.approval import fingerprint
    from warden.tokenscan.manifest import ApprovalStore

    dirty = scan_of(dirty=True)
    assert review(None, dirty, True, POLICY).save is None  # --approve alone: a finding blocks it
    out = review(None, dirty, True, POLICY, accept_findings=True)
    assert out.save is not None and out.save.accepted == (fingerprint(dirty.findings[0]),)
    assert out.scan.outcome(POLICY.fail_severity) == 0 and "accepted at approval" in out.scan.findings[0].message
    store = ApprovalStore(str(tmp_path))
    store.save(ROOT, out.save.manifest, "2026-01-01T00:00:00Z", out.save.token_ids_digest, out.save.accepted)
    record = store.load(ROOT)
    assert record is not None and record.accepted == out.save.accepted
    later = review(record, dirty, False, POLICY)  # the same finding again: accepted, not failing
    assert later.scan.outcome(POLICY.fail_severity) == 0
    new = finding("TS803", "tokenizer_config.json", "if on message content (line 3)")
    grown = DirectoryScan(ROOT, [*dirty.findings, new], [], 3, 30, 0.1, APPROVED, "c" * 64)
    later = review(record, grown, False, POLICY)  # a new finding keeps its severity
    assert later.scan.outcome(POLICY.fail_severity) == 1
    assert [f.severity for f in later.scan.findings if f.id == "TS803"] == [new.severity]
