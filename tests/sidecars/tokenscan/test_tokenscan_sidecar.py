"""The tokenscan sidecar: in-process units, then a real process (watchdog, drift, /metrics, SIGTERM)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import yaml
from prometheus_client import CollectorRegistry
from support import free_port, run_warden, scrape, spawn, stop_process, wait_http, warden_cmd

from sidecars.runtime import Outcome, SidecarContext
from sidecars.tokenscan.sidecar import TokenscanSidecar
from warden import journal as ev
from warden.tokenscan.policy import default_policy


def make_sidecar(tmp_path, **policy):
    ctx = SidecarContext(
        name="tokenscan",
        state_dir=str(tmp_path / "state"),
        policy=default_policy(watch=False, **policy),
        registry=CollectorRegistry(),
    )
    return TokenscanSidecar(ctx)


def sample(sidecar, name, **labels):
    return sidecar.ctx.registry.get_sample_value(name, labels or None)


def approve(state_dir, *paths):
    """A person's decision, through the real CLI: ``warden scan tokenizer PATH... --approve``."""
    result = run_warden("scan", "tokenizer", *map(str, paths), "--approve", "--state-dir", str(state_dir))
    assert result.returncode == 0, result.stdout + result.stderr


def loading_event(seq, path, kind="tokenizer"):
    return ev.Event(
        seq=seq,
        run_id="r",
        type=ev.MODEL_LOADING,
        time="2026-11-30T00:00:00.000000Z",
        data={"path": str(path), "kind": kind},
    )


def test_first_sight_is_unapproved_with_a_review_report_and_nothing_approves_itself(tmp_path, fresh_benign):
    """Issue 33: the sidecar never approves: a clean directory it sees first is unapproved (a low
    TS1103 under warn: the outcome stays OK; high under block), with its review report written
    for the person who decides; after `--approve` it is approved and quiet."""
    sc = make_sidecar(tmp_path, paths=(str(fresh_benign),), rescan_interval_seconds=1e-6)
    try:
        assert sc.check() == Outcome.OK
        assert sample(sc, "warden_tokenscan_approved", path=str(fresh_benign)) == 0
        assert sample(sc, "warden_tokenscan_findings", path=str(fresh_benign), severity="low") == 1
        assert not (tmp_path / "state" / "approved").exists() or not list((tmp_path / "state" / "approved").iterdir())
        (report,) = (tmp_path / "state" / "review").iterdir()
        doc = json.loads(report.read_text())
        assert doc["path"] == str(fresh_benign) and [f["id"] for f in doc["findings"]] == ["TS1103"]
        review = doc["review"]
        assert {f["path"] for f in review["files"]} >= {"tokenizer.json", "tokenizer_config.json"}
        assert all(len(f["sha256"]) == 64 for f in review["files"])
        assert review["templates"] and review["templates"][0]["renders"]
        assert "normalizer" in review["pipeline"] and "added_tokens" in review["pipeline"]
        approve(tmp_path / "state", fresh_benign)
        assert sc.check() == Outcome.OK
        assert sample(sc, "warden_tokenscan_approved", path=str(fresh_benign)) == 1
        assert sample(sc, "warden_tokenscan_findings", path=str(fresh_benign), severity="low") == 0
    finally:
        sc.close()
    blocking = make_sidecar(tmp_path / "b", paths=(str(fresh_benign),), unapproved="block")
    try:
        assert blocking.check() == Outcome.VIOLATION
        assert sample(blocking, "warden_tokenscan_findings", path=str(fresh_benign), severity="high") == 1
    finally:
        blocking.close()


def test_check_approves_clean_dirs_and_reports_drift(tmp_path, fresh_benign, tokenscan_corpus):
    bad = str(tokenscan_corpus.case("auto_map_with_py"))
    approve(tmp_path / "state", fresh_benign)
    sc = make_sidecar(tmp_path, paths=(str(fresh_benign), bad), rescan_interval_seconds=0.05)
    try:
        assert sc.check() == Outcome.VIOLATION
        assert sample(sc, "warden_tokenscan_approved", path=str(fresh_benign)) == 1
        assert sample(sc, "warden_tokenscan_approved", path=bad) == 0
        assert sample(sc, "warden_tokenscan_findings", path=bad, severity="critical") == 2
        assert sample(sc, "warden_tokenscan_approved_directories") == 1
        assert sc.check() == Outcome.OK  # nothing due yet
        time.sleep(0.06)
        (fresh_benign / "tokenizer.json").write_text((fresh_benign / "tokenizer.json").read_text() + "\n")
        assert sc.check() == Outcome.VIOLATION
        assert sample(sc, "warden_tokenscan_drift", path=str(fresh_benign)) == 1
        assert sample(sc, "warden_tokenscan_drift_detected_total") == 1
        assert sample(sc, "warden_tokenscan_findings", path=str(fresh_benign), severity="critical") == 1
    finally:
        sc.close()


def test_model_loading_events_are_scanned_and_tracked(tmp_path, tokenscan_corpus):
    sc = make_sidecar(tmp_path, max_watched_paths=1)
    try:
        assert sc.handle(loading_event(1, tokenscan_corpus.benign)) == Outcome.OK
        assert sc.handle(loading_event(2, tokenscan_corpus.case("pickle_os_system"), "actor")) == Outcome.VIOLATION
        assert list(sc.dirs) == [str(tokenscan_corpus.benign)]  # the second went over max_watched_paths
        assert sample(sc, "warden_tokenscan_findings", path="other", severity="critical") == 1
        assert sc.handle(ev.Event(3, "r", ev.MODEL_LOADING, "2026-11-30T00:00:00.000000Z", data={})) == Outcome.OK
        assert sample(sc, "warden_tokenscan_scans_total", result="violation") == 1
        assert sc.handle(loading_event(4, tokenscan_corpus.root / "missing")) == Outcome.INCOMPLETE
    finally:
        sc.close()


def test_once_with_journal_events(run_dir, journal, tokenscan_corpus, tmp_path):
    policy = tmp_path / "tokenscan.yaml"
    policy.write_text(yaml.safe_dump({"version": 1, "watch": False}))
    journal.emit(ev.MODEL_LOADING, {"path": str(tokenscan_corpus.benign), "kind": "tokenizer"})
    journal.emit(ev.MODEL_LOADING, {"path": str(tokenscan_corpus.model), "kind": "actor"})
    args = ("sidecar", "run", "tokenscan", "--run-dir", str(run_dir), "--once", "--policy", str(policy))
    clean = run_warden(*args)
    assert clean.returncode == 0, clean.stderr
    journal.emit(ev.MODEL_LOADING, {"path": str(tokenscan_corpus.case("ssti_template")), "kind": "critic"})
    dirty = run_warden(*args)
    assert dirty.returncode == 1, dirty.stderr
    logs = [json.loads(line) for line in dirty.stderr.splitlines() if line.startswith("{")]
    assert any(entry.get("id") == "TS802" and entry.get("severity") == "critical" for entry in logs)
    assert "Traceback" not in dirty.stderr


def wait_for(port, key, value, deadline=20.0):
    end = time.monotonic() + deadline
    while True:
        samples = scrape(port)
        if samples.get(key) == value:
            return samples
        assert time.monotonic() < end, f"{key} never became {value}: {samples.get(key)}"
        time.sleep(0.1)


def test_running_sidecar_watches_approves_and_detects_drift(tmp_path, fresh_benign, tokenscan_corpus):
    bad = tmp_path / "bad"
    shutil.copytree(tokenscan_corpus.case("trust_remote_code_true"), bad)
    policy = tmp_path / "tokenscan.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "paths": [str(fresh_benign), str(bad)],
                "check_interval_seconds": 0.2,
                "rescan_interval_seconds": 3600,
            }
        )
    )
    approve(tmp_path / "state", fresh_benign)
    port = free_port()
    cmd = warden_cmd(
        "sidecar",
        "run",
        "tokenscan",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--state-dir",
        str(tmp_path / "state"),
    )
    proc = spawn(cmd, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        good = str(fresh_benign)
        wait_for(port, ("warden_tokenscan_approved", (("path", good),)), 1.0)
        # the two directories are scanned by a pool: wait for the bad one's verdict too, not only the good one's
        samples = wait_for(port, ("warden_tokenscan_findings", (("path", str(bad)), ("severity", "critical"))), 1.0)
        assert samples[("warden_tokenscan_approved_directories", ())] == 1
        assert samples[("warden_sidecar_up", (("sidecar", "tokenscan"),))] == 1
        # Time of check / time of use: a file changed after approval (watchdog, not the 1 h rescan).
        (fresh_benign / "chat_template.jinja").write_text("{{ messages }}")
        wait_for(port, ("warden_tokenscan_drift", (("path", good),)), 1.0)
        # The bad directory is fixed: watchdog triggers a rescan; it is clean but unapproved (a
        # person approves it, never the sidecar).
        config = bad / "tokenizer_config.json"
        config.write_text(
            json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "trust_remote_code"})
        )
        samples = wait_for(port, ("warden_tokenscan_findings", (("path", str(bad)), ("severity", "critical"))), 0.0)
        assert samples[("warden_tokenscan_approved", (("path", str(bad)),))] == 0
        assert samples[("warden_tokenscan_findings", (("path", str(bad)), ("severity", "low")))] == 1
        assert samples[("warden_tokenscan_drift_detected_total", ())] == 1
        assert samples[("warden_tokenscan_last_scan_timestamp_seconds", (("path", good),))] > 1e9
    finally:
        assert stop_process(proc) == 0
    logs = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
    assert any(e.get("id") == "TS1101" for e in logs), logs
    assert os.path.exists(tmp_path / "state" / "approved")


def test_registry_entry_resolves():
    from sidecars.registry import sidecar_class

    cls = sidecar_class("tokenscan")
    assert cls is TokenscanSidecar and cls.default_port == 9463 and cls.handles == {ev.MODEL_LOADING}


def test_sidecar_rescans_of_unchanged_dirs_send_no_sandbox_request(tmp_path, tokenscan_corpus, monkeypatch):
    """The sidecar's rescans (every rescan_interval) of unchanged tokenizers reuse the stored
    verdicts: no parse, no tokenizer or template sandbox request."""
    from tests.warden.tokenscan.corpus import distinct_copies, requests
    from warden.tokenscan import manifest as mf
    from warden.tokenscan import scanner

    monkeypatch.setattr(mf, "RACY_NS", 0)  # the copies were written just now
    dirs = distinct_copies(tokenscan_corpus.benign, tmp_path / "dirs", 5)
    approve(tmp_path / "state", *dirs)
    sc = make_sidecar(tmp_path, paths=tuple(dirs), rescan_interval_seconds=1e-6)
    try:
        assert sc.check() == Outcome.OK
        res = scanner.default_resources()
        for memo in (res.memo, res.judged, res.behaviour):
            memo.clear()  # what is left: the directories' verdicts
        before = requests()
        for _ in range(3):
            assert sc.check() == Outcome.OK
        assert requests() == before
        assert sample(sc, "warden_tokenscan_approved_directories") == 5
    finally:
        sc.close()
