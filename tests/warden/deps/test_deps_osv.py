"""OSV: CVSS scoring, the schema's matching algorithm, the loader, the OSV API server, ignores
(pip-audit against `warden deps osv-serve`: tests/sidecars/deps/test_deps_osv_serve.py)."""

from __future__ import annotations

import datetime as dt
import json
import urllib.request

import pytest
from support import http_get

from tests.warden.deps.deps_helpers import EXPECTED_MATCHES, fake_dist, write_osv_zip
from warden.deps.ignores import IgnoreRule, apply_ignores
from warden.deps.osv.cvss import bucket, cvss2_base_score, cvss3_base_score
from warden.deps.osv.loader import OsvDatabaseError, load_database
from warden.deps.osv.matcher import in_range
from warden.deps.osv.server import OsvServer
from warden.deps.pipaudit import compare
from warden.deps.vulns import check_vulnerabilities
from warden.policy import PolicyError, policy_from_mapping


@pytest.mark.parametrize(
    ("vector", "score", "severity"),
    [
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8, "critical"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10.0, "critical"),
        ("CVSS:3.0/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:N/A:N", 8.6, "high"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:N/A:N", 7.5, "high"),
        ("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H", 7.8, "high"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N", 6.1, "medium"),
        ("CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:L/I:N/A:N", 3.7, "low"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:N", 0.0, "unknown"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H/E:U/RL:O", 9.8, "critical"),
    ],
)
def test_cvss3_base_scores_match_first_calculator(vector, score, severity):
    assert cvss3_base_score(vector) == score
    assert bucket(cvss3_base_score(vector)) == severity


def test_bad_vectors_raise_and_v2_scores():
    assert cvss2_base_score("AV:N/AC:L/Au:N/C:P/I:P/A:P") == 7.5
    assert cvss2_base_score("AV:N/AC:M/Au:N/C:N/I:P/A:N") == 4.3
    for bad in ("CVSS:3.1/AV:N", "CVSS:2.0/AV:N", "CVSS:3.1/AV:X/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", "garbage"):
        with pytest.raises(ValueError):
            cvss3_base_score(bad)


def test_range_algorithm_edge_cases():
    from packaging.version import Version

    multi = [("introduced", "1.0"), ("fixed", "1.0.2"), ("introduced", "3.0"), ("fixed", "3.2.5")]
    assert [in_range(Version(v), multi) for v in ("0.9", "1.0", "1.0.1", "1.0.2", "3.1", "3.2.5")] == [
        False,
        True,
        True,
        False,
        True,
        False,
    ]
    assert in_range(Version("9.9"), [("introduced", "0"), ("limit", "*")])
    assert not in_range(Version("2.0"), [("introduced", "0"), ("limit", "2.0")])
    # events out of order are sorted first
    assert in_range(Version("1.5"), [("fixed", "2.0"), ("introduced", "1.0")])


def test_fixture_database_gives_exactly_the_expected_matches(osv_zip):
    db = load_database(str(osv_zip))
    assert len(db.records) == 8
    assert db.errors and "CORRUPT-1.json" in db.errors[0]
    for (name, version), expected in EXPECTED_MATCHES.items():
        found, notes = check_vulnerabilities(db, [fake_dist(name, version)])
        assert notes == []
        assert [set(f.details["ids"]) for f in found] == expected, (name, version)
    (req,) = check_vulnerabilities(db, [fake_dist("requests", "2.19.1")])[0]
    assert (req.details["severity"], req.details["score"], req.details["fixed"]) == ("high", 7.5, ["2.20.0"])
    (jinja,) = check_vulnerabilities(db, [fake_dist("jinja2", "2.10")])[0]
    assert (jinja.details["id"], jinja.details["severity"], jinja.details["score"]) == (
        "GHSA-462w-v97r-4m45",
        "high",
        8.6,
    )
    (urllib,) = check_vulnerabilities(db, [fake_dist("urllib3", "1.24.1+local")])[0]
    assert urllib.details["severity"] == "high"  # no vector: the database's own word
    (six,) = check_vulnerabilities(db, [fake_dist("six", "1.16.0")])[0]
    assert six.details["severity"] == "unknown" and six.blocking


def test_directory_export_and_unusable_databases(tmp_path, osv_zip):
    import zipfile

    out = tmp_path / "dir"
    zipfile.ZipFile(osv_zip).extractall(out)
    db = load_database(str(out))
    assert len(db.records) == 8 and len(db.errors) == 1
    assert db.age_seconds(db.newest + 10) == 10
    with pytest.raises(OsvDatabaseError, match="not readable"):
        load_database(str(tmp_path / "missing.zip"))
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(OsvDatabaseError, match="not a directory or zip"):
        load_database(str(tmp_path / "junk.zip"))
    only_bad = tmp_path / "bad.zip"
    write_osv_zip(only_bad, records=[], corrupt=True)
    with pytest.raises(OsvDatabaseError, match="no readable OSV record"):
        load_database(str(only_bad))


def post(url: str, body: object) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_osv_api_endpoints(osv_zip):
    server = OsvServer(load_database(str(osv_zip))).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, body = post(
            f"{base}/v1/query", {"package": {"name": "Requests", "ecosystem": "PyPI"}, "version": "2.19.1"}
        )
        assert status == 200 and {v["id"] for v in body["vulns"]} == {"PYSEC-2018-28", "GHSA-x84v-xcm2-53pg"}
        assert post(
            f"{base}/v1/query", {"package": {"name": "requests", "ecosystem": "PyPI"}, "version": "2.20.0"}
        ) == (
            200,
            {},
        )
        _, body = post(f"{base}/v1/query", {"package": {"purl": "pkg:pypi/urllib3@1.24.1%2Blocal"}})
        assert [v["id"] for v in body["vulns"]] == ["PYSEC-2019-133"]
        _, body = post(f"{base}/v1/query", {"package": {"name": "requests", "ecosystem": "PyPI"}})
        assert {v["id"] for v in body["vulns"]} == {"PYSEC-2018-28", "GHSA-x84v-xcm2-53pg"}  # withdrawn left out
        assert post(f"{base}/v1/query", {"package": {"name": "requests", "ecosystem": "npm"}, "version": "1"})[1] == {}
        assert post(f"{base}/v1/query", {"commit": "abc"})[0] == 400
        assert post(f"{base}/v1/query", ["not", "an", "object"])[0] == 400
        queries = [
            {"package": {"name": "jinja2", "ecosystem": "PyPI"}, "version": "2.10"},
            {"package": {"name": "six", "ecosystem": "PyPI"}, "version": "1.17.0"},
        ]
        status, body = post(f"{base}/v1/querybatch", {"queries": queries})
        assert status == 200
        assert [[v["id"] for v in r.get("vulns", [])] for r in body["results"]] == [["GHSA-462w-v97r-4m45"], []]
        status, text = http_get(f"{base}/v1/vulns/PYSEC-2099-1")
        assert status == 200 and json.loads(text)["withdrawn"]
        assert http_get(f"{base}/v1/vulns/NOPE-1")[0] == 404
    finally:
        server.stop()


def test_compare_reports_disagreements():
    from warden.deps.model import Finding
    from warden.deps.pipaudit import PipAuditResult

    ours = [Finding("vulns", "vulnerable", "a", "", True, {"id": "X-1", "ids": ["X-1", "CVE-1"]})]
    theirs = PipAuditResult(vulns={"a": [frozenset({"CVE-1"})], "b": [frozenset({"Y-2"})]}, audited=2, skipped=[])
    assert compare(ours, theirs) == ["b: pip-audit reports Y-2, we do not"]


def test_ignore_entries_need_reason_and_expiry_and_stop_when_expired(osv_zip):
    db = load_database(str(osv_zip))
    found, _ = check_vulnerabilities(db, [fake_dist("requests", "2.19.1"), fake_dist("jinja2", "2.10")])
    rules = [
        IgnoreRule("CVE-2018-18074", "only internal redirects", "2026-12-31"),
        IgnoreRule("GHSA-462w-v97r-4m45", "sandbox unused", dt.date(2026, 1, 1)),
    ]
    kept, suppressed, warnings = apply_ignores(found, rules, dt.date(2026, 11, 30))
    assert [f.details["id"] for f in kept] == ["GHSA-462w-v97r-4m45"]  # its entry expired
    assert [f.details["ignored_by"] for f in suppressed] == ["CVE-2018-18074"]
    assert [(w.kind, w.subject, w.blocking) for w in warnings] == [("ignore_expired", "GHSA-462w-v97r-4m45", False)]
    kept, suppressed, _ = apply_ignores(found, rules, dt.date(2027, 1, 1))
    assert len(kept) == 2 and suppressed == []
    narrow = [IgnoreRule("CVE-2018-18074", "r", "2099-01-01", package="urllib3")]
    assert len(apply_ignores(found, narrow, dt.date(2026, 11, 30))[0]) == 2

    from warden.deps.policy import DepsPolicy

    ok = policy_from_mapping(
        {"version": 1, "ignore": [{"id": "X", "reason": "r", "expires": dt.date(2026, 1, 2)}]}, DepsPolicy, "p.yaml"
    )
    assert ok.ignore[0].expires == dt.date(2026, 1, 2)
    for bad, match in (
        ({"id": "X", "expires": "2026-01-01"}, "reason: required"),
        ({"id": "X", "reason": " ", "expires": "2026-01-01"}, "say why"),
        ({"id": "X", "reason": "r"}, "expires: required"),
        ({"id": "X", "reason": "r", "expires": "someday"}, "expected a date"),
    ):
        with pytest.raises(PolicyError, match=match):
            policy_from_mapping({"version": 1, "ignore": [bad]}, DepsPolicy, "p.yaml")
