"""The malicious corpus: every case is flagged with its expected finding ids; the benign
tokenizer and model directories are clean (the CLI's reports of it: tests/sidecars/tokenscan)."""

from __future__ import annotations

import os

from warden.tokenscan import scan_directory
from warden.tokenscan.findings import Severity
from warden.tokenscan.policy import default_policy

HERE = os.path.dirname(os.path.abspath(__file__))


def ids(result) -> set[str]:
    return {f.id for f in result.findings}


def test_benign_tokenizer_and_model_are_clean(tokenscan_corpus, tokenscan_policy):
    for path in (tokenscan_corpus.benign, tokenscan_corpus.model):
        result = scan_directory(str(path), tokenscan_policy)
        assert result.findings == [] and result.errors == [], [f.to_dict() for f in result.findings]
        assert result.outcome(tokenscan_policy.fail_severity) == 0
        assert result.manifest is not None and len(result.manifest.digest) == 64


def test_malicious_case_is_flagged(tokenscan_corpus, tokenscan_policy, malicious_case):
    result = scan_directory(str(tokenscan_corpus.case(malicious_case)), tokenscan_policy)
    expected = tokenscan_corpus.expected[malicious_case]
    assert expected <= ids(result), [f.to_dict() for f in result.findings]
    assert result.outcome(tokenscan_policy.fail_severity) == 1
    for f in result.findings:
        assert f.fix and f.message and f.root == str(tokenscan_corpus.case(malicious_case))


def test_corpus_has_at_least_twenty_cases_and_covers_the_checks(tokenscan_corpus):
    assert len(tokenscan_corpus.expected) >= 20
    covered = {i for ids_ in tokenscan_corpus.expected.values() for i in ids_}
    for family in ("TS1", "TS2", "TS3", "TS4", "TS5", "TS6", "TS7", "TS8", "TS9", "TS10"):
        assert any(i.startswith(family) and (family != "TS1" or len(i) == 5) for i in covered), family


def test_default_policy_file_equals_the_built_in_policy():
    from warden.tokenscan.policy import load_tokenscan_policy

    shipped = load_tokenscan_policy(os.path.join(HERE, "..", "..", "..", "policies", "tokenscan.yaml"))
    assert shipped == default_policy()
    assert shipped.fail_severity is Severity.MEDIUM
