"""The committed dashboards: the SDK's models, structure, units, datasource, and queries that parse."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, free_port, need_binary, spawn, stop_process, wait_http

GRAFANA = Path(ROOT) / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
DURATION_VARIABLES = {"__interval", "__rate_interval", "__range"}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def visual_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(board["panels"]) if p["type"] != "row"]


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in visual_panels(board) for t in p["targets"]]
    return exprs + [a["expr"] for a in board["annotations"]["list"] if "expr" in a]


def substitute(expr: str) -> str:
    """Grafana variables replaced by values PromQL accepts where they stand."""
    return VARIABLE.sub(lambda m: "5m" if (m.group(1) or m.group(2)) in DURATION_VARIABLES else "x", expr)


def selected_names(promql: Any, expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql.VectorSelector) and node.name:
            names.add(node.name)

    promql.walk(promql.parse(substitute(expr)), visit)
    return names


def overlaps(a: dict[str, int], b: dict[str, int]) -> bool:
    apart_x = a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
    apart_y = a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"]
    return not (apart_x or apart_y)


def test_grafana_dashboards_read_back_through_the_sdk_models_unchanged(dashboards, generator):
    for name, board in dashboards.items():
        errors = generator.validate(board)
        assert not errors, f"{name} is not what grafana-foundation-sdk's models describe:\n" + "\n".join(errors[:10])


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("defaults", "unitt", "s"),  # a misspelt field option
        ("options", "colourMode", "value"),  # a stat option the stat plugin does not have
        ("panel", "gridPoss", {"x": 0}),  # a misspelt panel key
        ("board", "refreshh", "1m"),  # a misspelt dashboard key
    ],
)
def test_grafana_model_check_is_strict(dashboards, generator, where, key, value):
    """A stray key fails the check, so the check above is not vacuous."""
    board = copy.deepcopy(dashboards["trainer.json"])
    stat = next(p for p in visual_panels(board) if p["type"] == "stat")
    target = {
        "defaults": stat["fieldConfig"]["defaults"],
        "options": stat["options"],
        "panel": stat,
        "board": board,
    }[where]
    target[key] = value
    errors = generator.validate(board)
    assert any(key in e and "not in the SDK's model" in e for e in errors), errors


def test_grafana_dashboard_uids_are_unique_and_stable(dashboards):
    uids = [board["uid"] for board in dashboards.values()]
    assert len(set(uids)) == len(uids), uids
    for uid in uids:
        assert re.fullmatch(r"[a-z0-9-]{8,40}", uid), uid
    assert {"warden-overview", "warden-trainer"} <= set(uids)


def test_grafana_panel_ids_unique_with_grid_positions(dashboards):
    for name, board in dashboards.items():
        panels = list(all_panels(board["panels"]))
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        for p in panels:
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24, f"{name}: panel {p['id']} is wider than the grid"
        top = [p["gridPos"] for p in board["panels"]]
        nested = [[c["gridPos"] for c in p["panels"]] for p in board["panels"] if p["type"] == "row"]
        for group in [top, *nested]:
            for a, b in itertools.combinations(group, 2):
                assert not overlaps(a, b), f"{name}: panels overlap at {a} and {b}"


def test_grafana_every_panel_has_a_unit_and_the_datasource_variable(dashboards):
    for name, board in dashboards.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for p in visual_panels(board):
            where = f"{name}: panel {p['id']} {p.get('title')!r}"
            assert p["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
            assert p["datasource"] == DATASOURCE, where
            assert p["targets"], f"{where} has no query"
            for t in p["targets"]:
                assert t["datasource"] == DATASOURCE, where
        for a in board["annotations"]["list"]:
            if not a.get("builtIn"):
                assert a["datasource"] == DATASOURCE, f"{name}: annotation {a['name']}"


def test_grafana_every_query_parses(dashboards, promql):
    for name, board in dashboards.items():
        for expr in expressions(board):
            try:
                promql.parse(substitute(expr))
            except ValueError as exc:
                pytest.fail(f"{name}: query does not parse: {expr!r}: {exc}")


def query_prometheus(port: int, expr: str) -> tuple[int, str]:
    data = urllib.parse.urlencode({"query": expr}).encode()
    url = f"http://127.0.0.1:{port}/api/v1/query"
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_grafana_every_query_runs_on_a_real_prometheus(dashboards, tmp_path):
    """Prometheus's own parser (with type checks) accepts every query, variables substituted."""
    binary = need_binary("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = free_port()
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", deadline_s=30, proc=proc)
        for name, board in dashboards.items():
            for expr in expressions(board):
                status, body = query_prometheus(port, substitute(expr))
                assert status == 200, f"{name}: Prometheus rejects {expr!r}: {body}"
    finally:
        stop_process(proc)


def test_grafana_metrics_used_lists_every_metric(dashboards, promql):
    """metrics-used.json is exactly the metric names the committed dashboards query."""
    found: set[str] = set()
    for board in dashboards.values():
        for expr in expressions(board):
            found |= selected_names(promql, expr)
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                found |= selected_names(promql, v["query"].split("(", 1)[1].rsplit(",", 1)[0])
    listed = json.loads((GRAFANA / "metrics-used.json").read_text())
    assert listed == sorted(found)
    allowed = re.compile(r"(warden_\w+|vllm:\w+|DCGM_\w+|node_\w+|up|ALERTS)")
    assert [m for m in listed if not allowed.fullmatch(m)] == []


def test_grafana_trainer_dashboard_shows_what_the_issue_asks(dashboards):
    board = dashboards["trainer.json"]
    panels = visual_panels(board)
    text = "\n".join(t["expr"] for p in panels for t in p["targets"])
    for metric in (
        "warden_trainer_reward_mean",
        "warden_trainer_kl",
        "warden_trainer_policy_loss",
        "warden_trainer_value_loss",
        "warden_trainer_generated_tokens_per_second",
        "warden_trainer_last_checkpoint_step",
        "warden_signer_signed_total",
    ):
        assert metric in text, metric
    heatmaps = {p["title"]: p for p in panels if p["type"] == "heatmap"}
    for title, histogram in (("Step latency", "step_duration"), ("Rollout latency", "rollout_duration")):
        (t,) = heatmaps[title]["targets"]
        assert t["format"] == "heatmap"
        assert t["expr"].startswith("sum by (le) (rate(") and f"warden_trainer_{histogram}_seconds_bucket" in t["expr"]
    assert any(p["type"] == "state-timeline" and "signed" in json.dumps(p["targets"]) for p in panels)


def test_grafana_trainer_dashboard_says_why_the_rollout_is_slow_now(dashboards):
    """The row reads the recorded causes (alerts/rules/rollout-causes.yml) and the gauges behind them."""
    board = dashboards["trainer.json"]
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows][:2] == ["Run", "Why is the rollout slow now"]
    assert rows[1]["collapsed"] is False
    members, inside = [], False
    for p in board["panels"]:
        if p["type"] == "row":
            inside = p["title"] == "Why is the rollout slow now"
        elif inside:
            members.append(p)
    (causes,) = [p for p in members if p["type"] == "table"]
    (query,) = causes["targets"]
    assert query["expr"] == 'warden_rollout_slow_cause{instance=~"$instance"}' and query["instant"] is True
    text = json.dumps([p["targets"] for p in members])
    for metric in (
        "warden_trainer_last_step_phase_seconds",
        "warden_trainer_rank_rollout_seconds",
        "warden_rollout_requests_waiting_max",
        "warden_rollout_kv_cache_usage_max_ratio",
        "warden_rollout_preemptions_last",
    ):
        assert metric in text, metric


def test_grafana_overview_has_a_row_per_component(dashboards):
    board = dashboards["overview.json"]
    rows = [p for p in board["panels"] if p["type"] == "row" and not p["collapsed"]]
    titles = [r["title"] for r in rows]
    for component in ("Trainer", "Signer", "Archiver", "Tokenizer scanner", "Dependencies", "Paths"):
        assert component in titles, titles
    # A row's panels are the top-level panels after it, up to the next row.
    members: dict[str, list[str]] = {}
    current = ""
    for p in board["panels"]:
        if p["type"] == "row":
            current = p["title"]
        else:
            members.setdefault(current, []).append(p["title"])
    for component in titles[1:]:
        first, second, *_, last = members[component]
        assert (first, last) == ("Up", "Firing alerts"), component
        assert second.startswith("Last"), component
