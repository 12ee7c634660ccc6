"""Live: real Prometheus scraping a real paths sidecar, real Alertmanager, a webhook sink."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from support import StackProcess, WebhookSink, need_binary

pytestmark = pytest.mark.slow  # real servers, faults and kills: minutes (make test-fast skips)


def post_alerts(am_url: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(
        f"{am_url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def is_alert(name: str, status: str = "firing"):
    return lambda a: a["labels"].get("alertname") == name and a.get("status") == status


@pytest.fixture
def paths_stack(tmp_path):
    need_binary("prometheus")
    if not (shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")):
        need_binary("prometheus-alertmanager")
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "data.bin").write_bytes(b"x" * 100)
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = {
        "version": 1,
        "check_interval_seconds": 0.2,
        "paths": [
            {"name": "data", "path": str(watched), "readable": True, "interval_seconds": 0.5, "deadline_seconds": 1}
        ],
    }
    (policies / "paths.yaml").write_text(yaml.safe_dump(policy))
    sink = WebhookSink()
    stack = StackProcess(
        [
            "--run-dir",
            str(tmp_path / "run"),
            "--policy-dir",
            str(policies),
            "--only",
            "paths",
            "--no-s3",
            "--pager-url",
            sink.url("/pager"),
            "--ticket-url",
            sink.url("/ticket"),
            "--deadman-url",
            sink.url("/deadman"),
        ]
    )
    try:
        stack.wait_ready()
        yield stack, sink, watched
    finally:
        code = stack.stop()
        sink.close()
        assert code == 0, "\n".join(stack.lines[-20:])


def test_a_flipped_metric_pages_the_right_receiver_and_resolves(paths_stack):
    stack, sink, watched = paths_stack
    assert {"paths", "prometheus", "alertmanager"} <= set(stack.urls)
    sink.wait_for("/deadman", is_alert("Watchdog"), timeout=30)
    wait_healthy_scrape(stack.urls["prometheus"], 'warden_path_up{path="data"}', timeout=30)
    start = time.monotonic()
    shutil.rmtree(watched)
    arrived, alert = sink.wait_for("/pager", is_alert("WardenPathUnreachable"), timeout=30)
    assert alert["labels"]["path"] == "data" and alert["labels"]["reason"] == "missing"
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["job"] == "paths"
    assert alert["annotations"]["runbook_url"].endswith("#wardenpathunreachable")
    fault_to_page = arrived - start
    assert fault_to_page < 10, fault_to_page
    watched.mkdir()
    (watched / "data.bin").write_bytes(b"y")
    sink.wait_for("/pager", is_alert("WardenPathUnreachable", "resolved"), timeout=40)
    assert not any(
        p == "/ticket" and a["labels"].get("alertname") == "WardenPathUnreachable" for _, p, a in sink.received
    )


def test_inhibition_in_real_alertmanager(paths_stack):
    stack, sink, _ = paths_stack
    am = stack.urls["alertmanager"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common = {"startsAt": now, "annotations": {"summary": "live inhibition test"}}
    post_alerts(
        am,
        [
            {**common, "labels": {"alertname": "WardenTwin", "severity": "critical", "instance": "x:1", "job": "deps"}},
            {**common, "labels": {"alertname": "WardenTwin", "severity": "warning", "instance": "x:1", "job": "deps"}},
            {
                **common,
                "labels": {
                    "alertname": "WardenTargetDown",
                    "severity": "critical",
                    "instance": "a:1",
                    "job": "archiver",
                },
            },
            {
                **common,
                "labels": {
                    "alertname": "WardenSidecarLagGrowing",
                    "severity": "warning",
                    "instance": "a:1",
                    "job": "archiver",
                    "sidecar": "archiver",
                },
            },
            {
                **common,
                "labels": {"alertname": "WardenControl", "severity": "warning", "instance": "c:1", "job": "deps"},
            },
        ],
    )
    sink.wait_for("/pager", is_alert("WardenTwin"), timeout=20)
    sink.wait_for("/pager", is_alert("WardenTargetDown"), timeout=20)
    sink.wait_for("/ticket", is_alert("WardenControl"), timeout=20)  # warnings do get through
    # Positive evidence rather than a pause: Alertmanager itself says which alert inhibits them.
    inhibited = wait_inhibited(am, {"WardenTwin", "WardenSidecarLagGrowing"}, timeout=20)
    assert inhibited["WardenTwin"] and inhibited["WardenSidecarLagGrowing"], inhibited
    tickets = [a["labels"]["alertname"] for _, p, a in sink.received if p == "/ticket"]
    assert "WardenTwin" not in tickets, "critical must inhibit its warning twin"
    assert "WardenSidecarLagGrowing" not in tickets, "a down component must inhibit its symptoms"


def wait_inhibited(alertmanager: str, names: set[str], timeout: float) -> dict[str, list[str]]:
    """{warning alert name: the fingerprints inhibiting it}, once every name in ``names`` is inhibited."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{alertmanager}/api/v2/alerts?inhibited=true", timeout=3) as resp:
            alerts = json.load(resp)
        found = {
            a["labels"]["alertname"]: a["status"]["inhibitedBy"]
            for a in alerts
            if a["labels"].get("severity") == "warning" and a["labels"]["alertname"] in names
        }
        if all(found.get(n) for n in names) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def wait_healthy_scrape(prometheus: str, selector: str, timeout: float) -> None:
    """Waits until Prometheus has scraped ``selector`` with the value 1 (a healthy baseline)."""
    query = urllib.parse.urlencode({"query": f"{selector} == 1"})
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=3) as resp:
            if json.load(resp)["data"]["result"]:
                return
        if time.monotonic() > deadline:
            with urllib.request.urlopen(f"{prometheus}/api/v1/targets", timeout=3) as resp:
                targets = [(t["labels"].get("job"), t["health"]) for t in json.load(resp)["data"]["activeTargets"]]
            q = urllib.parse.urlencode({"query": "warden_path_up"})
            with urllib.request.urlopen(f"{prometheus}/api/v1/query?{q}", timeout=3) as resp:
                series = json.load(resp)["data"]["result"]
            raise AssertionError(f"Prometheus never scraped {selector} == 1; targets: {targets}; {series}")
        time.sleep(0.2)
