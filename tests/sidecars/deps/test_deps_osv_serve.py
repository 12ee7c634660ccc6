"""`warden deps osv-serve` as a process, with pip-audit pointed at it: it reports what we do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import free_port, spawn, stop_process, wait_http, warden_cmd

from tests.warden.deps.deps_helpers import fake_dist
from warden.deps.osv.loader import load_database
from warden.deps.pipaudit import compare, run_pip_audit
from warden.deps.vulns import check_vulnerabilities

PIP_AUDIT_CASES = {
    "requests": "2.20.0rc1",
    "urllib3": "1.24.1+local",
    "jinja2": "2.10",
    "six": "1.16.0",
    "idna": "3.6",
    "click": "8.1.7",
}


def test_pip_audit_against_osv_serve_agrees_with_us(tmp_path, osv_zip):
    """The real CLI: `warden deps osv-serve` as a process, pip-audit pointed at it with --osv-url."""
    port = free_port()
    proc = spawn(warden_cmd("deps", "osv-serve", "--db", str(osv_zip), "--port", str(port)), stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        req = tmp_path / "req.txt"
        req.write_text("".join(f"{n}=={v}\n" for n, v in PIP_AUDIT_CASES.items()))
        cmd = [sys.executable, "-m", "pip_audit", "-r", str(req), "--disable-pip", "--no-deps", "-f", "json"]
        cmd += ["-s", "osv", "--osv-url", f"http://127.0.0.1:{port}/v1/query", "--progress-spinner", "off"]
        cmd += ["--cache-dir", str(tmp_path / "cache"), "--aliases", "on"]
        env = {**os.environ, "NO_PROXY": "127.0.0.1"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 1, out.stderr  # pip-audit exits 1 when it finds vulnerabilities
        theirs = {
            d["name"]: {frozenset([v["id"], *v["aliases"]]) for v in d["vulns"]}
            for d in json.loads(out.stdout)["dependencies"]
        }
        db = load_database(str(osv_zip))
        dists = [fake_dist(n, v) for n, v in PIP_AUDIT_CASES.items()]
        ours, _ = check_vulnerabilities(db, dists)
        mine = {n: set() for n in PIP_AUDIT_CASES}
        for f in ours:
            mine[f.subject].add(frozenset(f.details["ids"]))
        assert theirs == mine
        assert theirs["click"] == set() and len(ours) == 5
        # The helper the audit uses says the same.
        assert compare(ours, run_pip_audit(dists, f"http://127.0.0.1:{port}/v1/query")) == []
    finally:
        assert stop_process(proc) == 0
