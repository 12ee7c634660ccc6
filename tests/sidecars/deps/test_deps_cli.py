"""`warden deps audit`, `warden sidecar run deps`: real processes, exit codes, outputs, metrics."""

from __future__ import annotations

import json
import os
import subprocess
import time

import yaml
from support import free_port, http_get, parse_samples, run_warden, spawn, stop_process, wait_http, warden_cmd

from tests.warden.deps.deps_helpers import write_osv_zip


def write_policy(path, lock, **extra) -> str:
    doc = {
        "version": 1,
        "lock": {"path": str(lock)},
        "integrity": {"workers": 2},
        "vulnerabilities": {"pip_audit_crosscheck": False},
        "change_debounce_seconds": 0.3,
        "check_interval_seconds": 0.2,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def audit(test_env, policy, *args, env=None, timeout=120):
    return run_warden(
        "deps",
        "audit",
        "--policy",
        policy,
        "--python",
        test_env.python,
        "--state-dir",
        str(test_env.state_dir),
        *args,
        env=env,
        timeout=timeout,
    )


def test_audit_cli_exit_codes_json_text_and_sbom(test_env, tmp_path):
    policy = write_policy(tmp_path / "deps.yaml", test_env.lock)
    sbom = tmp_path / "sbom.json"
    result = audit(test_env, policy, "--format", "json", "--approve", "--sbom", str(sbom))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "clean" and doc["summary"]["findings"]["drift"] == {}
    assert {"pip", "setuptools", "six", "idna"} <= {p["name"] for p in doc["packages"]}

    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    bom = json.loads(sbom.read_text())
    assert JsonStrictValidator(SchemaVersion.V1_5).validate_str(sbom.read_text()) is None
    six = next(c for c in bom["components"] if c["name"] == "six")
    assert six["purl"] == "pkg:pypi/six@1.16.0" and six["hashes"][0]["alg"] == "SHA-256"
    assert any(p["name"] == "warden:record_sha256" for p in six["properties"])

    (test_env.site / "six.py").write_text("print('owned')\n")
    result = audit(test_env, policy)
    assert result.returncode == 1
    assert "VIOLATION" in result.stdout and "tampered" in result.stdout and "six.py" in result.stdout
    assert "Traceback" not in result.stderr


def test_vulnerabilities_crosscheck_ignores_and_strictness(test_env, tmp_path):
    db = write_osv_zip(tmp_path / "all.zip")  # six 1.16.0 is listed; one member is corrupt
    policy = write_policy(tmp_path / "deps.yaml", test_env.lock, vulnerabilities={"osv_db": str(db)})
    args = ("--check", "vulns", "--pip-audit", "--format", "json")
    result = audit(test_env, policy, *args)
    doc = json.loads(result.stdout)
    assert result.returncode == 3, doc  # strict: a corrupt record means we may have missed one
    assert any("unreadable records" in d for d in doc["degraded"])
    assert doc["stats"]["pip_audit"] == {"audited": 4, "disagreements": 0}
    (vuln,) = [f for f in doc["findings"] if f["kind"] == "vulnerable"]
    assert vuln["details"]["id"] == "OSV-TEST-VERSIONS" and vuln["subject"] == "six"
    assert doc["summary"]["vulnerabilities"]["unknown"] == 1
    assert audit(test_env, policy, *args, "--no-strict").returncode == 1

    ignore = [{"id": "OSV-TEST-VERSIONS", "reason": "test", "expires": "2999-01-01"}]
    ignored = write_policy(tmp_path / "ignored.yaml", test_env.lock, vulnerabilities={"osv_db": str(db)}, ignore=ignore)
    result = audit(test_env, ignored, "--check", "vulns", "--no-strict")
    assert result.returncode == 0, result.stdout
    assert "ignored OSV-TEST-VERSIONS" in result.stdout
    expired = [{"id": "OSV-TEST-VERSIONS", "reason": "test", "expires": "2020-01-01"}]
    old = write_policy(tmp_path / "old.yaml", test_env.lock, vulnerabilities={"osv_db": str(db)}, ignore=expired)
    result = audit(test_env, old, "--check", "vulns", "--no-strict")
    assert result.returncode == 1 and "expired on 2020-01-01" in result.stdout


def test_online_mode_fails_closed_when_the_service_is_unreachable(test_env, tmp_path):
    policy = write_policy(tmp_path / "deps.yaml", test_env.lock)
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"HTTPS_PROXY": dead, "HTTP_PROXY": dead, "https_proxy": dead, "http_proxy": dead, "NO_PROXY": ""}
    result = audit(test_env, policy, "--check", "vulns", "--online", "--no-strict", env=env, timeout=180)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "fail closed" in result.stdout


def test_bad_inputs_give_clear_errors_never_tracebacks(test_env, tmp_path):
    policy = write_policy(tmp_path / "deps.yaml", test_env.lock)
    bad = tmp_path / "requirements.txt"
    bad.write_text("six>=1.0\nidna===3.7 --hash=sha256:" + "a" * 64 + "\n!!nonsense\n")
    result = audit(test_env, policy, "--lock", str(bad), "--check", "lock")
    assert result.returncode == 1
    for text in ("not_pinned", "requirements.txt:1", "=== is arbitrary equality", "requirements.txt:3", "malformed"):
        assert text in result.stdout
    toml = tmp_path / "pylock.toml"
    toml.write_text("packages = [")
    result = audit(test_env, policy, "--lock", str(toml))
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    result = run_warden("deps", "audit", "--policy", policy, "--python", str(tmp_path / "nope"))
    assert result.returncode == 3 and "no such interpreter" in result.stderr
    result = run_warden("deps", "audit", "--python", test_env.python, "--site-packages", str(test_env.site))
    assert result.returncode == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\nlock: {path: x.txt, allow_pip: true}\n")
    result = run_warden("deps", "audit", "--policy", str(broken))
    assert result.returncode == 2 and "lock.allow_pip: unknown key" in result.stderr
    for out in (result, *()):
        assert "Traceback" not in out.stderr


def wait_metric(url: str, name: str, labels: tuple, predicate, proc, deadline_s: float = 60.0) -> dict:
    end = time.monotonic() + deadline_s
    while True:
        assert proc.poll() is None, "sidecar exited"
        values = parse_samples(http_get(url)[1])
        if name in {k[0] for k in values} and predicate(values.get((name, labels))):
            return values
        assert time.monotonic() < end, f"{name}{labels} never satisfied the condition: {values.get((name, labels))}"
        time.sleep(0.2)


def test_sidecar_once_and_live_with_watchdog(test_env, tmp_path):
    policy = write_policy(tmp_path / "deps.yaml", test_env.lock)
    env = {"WARDEN_PYTHON": test_env.python}
    state = str(test_env.state_dir)
    once = run_warden("sidecar", "run", "deps", "--once", "--policy", policy, "--state-dir", state, env=env)
    assert once.returncode == 0, once.stderr
    assert os.path.exists(test_env.state_dir / "baseline.json")  # auto-approved on the first clean audit
    port = free_port()
    cmd = warden_cmd("sidecar", "run", "deps", "--policy", policy, "--state-dir", state, "--port", str(port))
    proc = spawn(cmd, stderr=subprocess.PIPE, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc, deadline_s=60)
        values = wait_metric(url, "warden_deps_last_audit_timestamp_seconds", (), lambda v: v and v > 1e9, proc)
        assert values[("warden_deps_tampered_files", ())] == 0
        assert values[("warden_deps_drift_packages", (("kind", "extra"),))] == 0
        assert values[("warden_deps_vulnerabilities", (("severity", "critical"),))] == 0
        assert values[("warden_deps_osv_database_age_seconds", ())] == -1
        assert values[("warden_deps_audit_duration_seconds", ())] > 0
        assert values[("warden_sidecar_up", (("sidecar", "deps"),))] == 1
        # The audit reads every file: its own reads must not trigger audits. Wait for checks that
        # started well after the audit (any audit its reads triggered would have run by then).
        settled = time.time() + 1.0
        key = "warden_sidecar_last_success_timestamp_seconds"
        wait_metric(url, key, (("sidecar", "deps"),), lambda v: v is not None and v > settled, proc)
        quiet = parse_samples(http_get(url)[1])
        assert quiet[("warden_deps_audits_total", (("result", "clean"),))] == 1
        # An edit under site-packages triggers an audit without waiting for the hour-long period.
        target = test_env.site / "idna" / "core.py"
        target.write_bytes(target.read_bytes() + b"\n# edited\n")
        (test_env.site / "rogue.py").write_text("x = 1\n")
        values = wait_metric(url, "warden_deps_tampered_files", (), lambda v: v == 1, proc)
        assert values[("warden_deps_unowned_files", ())] == 1
        assert values[("warden_deps_audits_total", (("result", "violation"),))] >= 1
    finally:
        assert stop_process(proc) == 0
    logs = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
    assert any(entry.get("kind") == "tampered" for entry in logs)
    assert all("Traceback" not in entry.get("msg", "") for entry in logs)
    bad = run_warden("sidecar", "run", "deps", "--once", "--policy", policy, "--state-dir", state, env=env)
    assert bad.returncode == 1
    gone = run_warden(
        "sidecar",
        "run",
        "deps",
        "--once",
        "--policy",
        policy,
        "--state-dir",
        state,
        env={"WARDEN_SITE_PACKAGES": str(tmp_path / "nowhere")},
    )
    assert gone.returncode == 3 and "not a directory" in gone.stderr
