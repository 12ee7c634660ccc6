#!/usr/bin/env python3
"""Writes Warden's Grafana dashboards with Grafana's typed builders (PyPI ``grafana-foundation-sdk``,
the ``dashboards`` extra): the dashboards are code, the committed JSON is its output.

Usage: ``python grafana/generate.py`` rewrites ``grafana/dashboards/*.json`` and
``grafana/metrics-used.json``; ``python grafana/generate.py --check`` writes nothing and exits 1
(naming the stale files) when the committed files differ from what this script produces.

Contracts:

- Panels, rows, queries, variables, annotations and links are the SDK's builders and models; this
  file adds only Warden's choices (units, thresholds, layout) on top of them.
- Output is byte-stable: the SDK's JSON, then ``json.dumps(sort_keys=True, indent=2)`` plus a
  trailing newline, panel ids numbered in layout order, grid positions computed by :func:`layout`.
- :func:`validate` is the schema check: a board must read back through the SDK's own models
  (every panel plugin's options and field config registered) to exactly itself, so a key or a
  value the models do not know is reported, never dropped silently.
- Every panel and query uses the datasource variable (:data:`DATASOURCE`); every panel but a
  row sets ``fieldConfig.defaults.unit``.
- ``metrics-used.json`` is the sorted list of every metric name a panel, annotation or variable
  query names, read from the parsed queries (PyPI ``promql-parser``; only this file needs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_panel
from grafana_foundation_sdk.builders import prometheus, statetimeline, table
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as m
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

HERE = Path(__file__).resolve().parent
DASHBOARD_DIR = HERE / "dashboards"
METRICS_FILE = HERE / "metrics-used.json"

Json = dict[str, Any]
PanelBuilder = cogbuilder.Builder[m.Panel]

DATASOURCE_UID = "${datasource}"
DATASOURCE: Json = {"type": "prometheus", "uid": DATASOURCE_UID}
SCHEMA_VERSION = 41
TAGS = ["warden"]
RATE = "$__rate_interval"
INSTANCE = 'instance=~"$instance"'
GRID_WIDTH = 24
FIRING_ALERTS_EXCLUDED = 'alertname!="Watchdog"'

GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"


def datasource() -> m.DataSourceRef:
    return m.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


# --------------------------------------------------------------------------- panel builders


@dataclass
class Target:
    """One Prometheus query before its ``refId`` (given by :func:`panel`, in order)."""

    expr: str
    legend: str = ""
    instant: bool = False
    fmt: pm.PromQueryFormat = pm.PromQueryFormat.TIME_SERIES

    def build(self, ref_id: str) -> prometheus.Dataquery:
        query = (
            prometheus.Dataquery()
            .datasource(datasource())
            .editor_mode(pm.QueryEditorMode.CODE)
            .expr(self.expr)
            .format(self.fmt)
            .legend_format(self.legend or "__auto")
            .ref_id(ref_id)
        )
        return query.instant() if self.instant else query.range()


def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str = "time_series") -> Target:
    return Target(expr, legend, instant, pm.PromQueryFormat(fmt))


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute thresholds; the first step's value is ``None`` (minus infinity)."""
    return (
        db.ThresholdsConfig()
        .mode(m.ThresholdsMode.ABSOLUTE)
        .steps([m.Threshold(value=value, color=color) for value, color in steps])
    )


def value_map(mapping: dict[str, tuple[str, str]]) -> list[m.ValueMapping]:
    """A value mapping ``{"1": ("UP", "green")}`` in Grafana's form."""
    options = {
        key: m.ValueMappingResult(text=text, color=color, index=index)
        for index, (key, (text, color)) in enumerate(mapping.items())
    }
    return [m.ValueMap(options=options)]


@dataclass
class Spec:
    """A panel before layout: the SDK builder and its size (:func:`layout` places it)."""

    builder: Any
    w: int
    h: int


def panel(
    builder: Any,
    title: str,
    targets: Sequence[Target],
    unit: str,
    *,
    w: int,
    h: int,
    description: str = "",
) -> Spec:
    """``builder`` (an SDK panel builder) with Warden's common fields: title, unit, datasource, queries."""
    builder.title(title).description(description).unit(unit).datasource(datasource())
    builder.targets([t.build(chr(ord("A") + i)) for i, t in enumerate(targets)])
    return Spec(builder, w, h)


def stat(
    title: str,
    expr: str,
    unit: str,
    *,
    w: int = 3,
    h: int = 4,
    description: str = "",
    steps: Sequence[tuple[float | None, str]] = ((None, BLUE),),
    mappings: list[m.ValueMapping] | None = None,
    no_value: str = "no data",
    legend: str = "",
    text_mode: str = "value",
) -> Spec:
    """A single-value panel of an instant query, coloured by ``steps``."""
    builder = (
        stat_panel.Panel()
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.THRESHOLDS))
        .no_value(no_value)
        .thresholds(thresholds(*steps))
        .color_mode(cm.BigValueColorMode.BACKGROUND if mappings else cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .justify_mode(cm.BigValueJustifyMode.CENTER)
        .orientation(cm.VizOrientation.AUTO)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .text_mode(cm.BigValueTextMode(text_mode))
    )
    if mappings:
        builder.mappings(mappings)
    return panel(builder, title, [target(expr, legend, instant=True)], unit, w=w, h=h, description=description)


def legend(calcs: Sequence[str] = ("lastNotNull", "max")) -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .calcs(list(calcs))
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(True)
    )


def timeseries(
    title: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    w: int = 12,
    h: int = 8,
    description: str = "",
    interpolation: str = "linear",
    steps: Sequence[tuple[float | None, str]] = ((None, GREEN),),
    threshold_style: str = "off",
    minimum: float | None = None,
    stacked: bool = False,
    draw_style: str = "line",
) -> Spec:
    """A graph of ``(expr, legend)`` queries over time."""
    builder = (
        ts.Panel()
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.PALETTE_CLASSIC))
        .thresholds(thresholds(*steps))
        .draw_style(cm.GraphDrawStyle(draw_style))
        .fill_opacity(60 if stacked else 10)
        .line_interpolation(cm.LineInterpolation(interpolation))
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode(threshold_style)))
        .legend(legend())
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    )
    if stacked:
        builder.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if minimum is not None:
        builder.min(minimum)
    targets = [target(expr, name) for expr, name in queries]
    return panel(builder, title, targets, unit, w=w, h=h, description=description)


def heatmap(title: str, bucket_metric: str, *, w: int = 8, h: int = 8, description: str = "", scheme: str) -> Spec:
    """A latency heatmap straight from a histogram's ``_bucket`` series (bounds in seconds)."""
    expr = f"sum by (le) (rate({bucket_metric}[{RATE}]))"
    color = (
        heatmap_panel.HeatmapColorOptions()
        .exponent(0.5)
        .fill("dark-orange")
        .mode(hm.HeatmapColorMode.SCHEME)
        .scale(hm.HeatmapColorScale.EXPONENTIAL)
        .scheme(scheme)
        .steps(64)
        .reverse(False)
    )
    builder = (
        heatmap_panel.Panel()
        .calculate(False)
        .cell_gap(1)
        .color(color)
        .filter_values(heatmap_panel.FilterValueRange().le(1e-9))
        .show_legend()
        .rows_frame(heatmap_panel.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.AUTO))
        .mode(cm.TooltipDisplayMode.SINGLE)
        .show_color_scale(False)
        .show_y_histogram()
        .y_axis(heatmap_panel.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT).reverse(False).unit("s"))
        .hide_from(cb.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        .scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LINEAR))
    )
    targets = [target(expr, "{{le}}", fmt="heatmap")]
    return panel(builder, title, targets, "s", w=w, h=h, description=description)


def state_timeline(title: str, queries: Sequence[tuple[str, str]], *, w: int, h: int, description: str) -> Spec:
    """Rows of yes/no states over time: each query returns 1 while its event or condition holds."""
    builder = (
        statetimeline.Panel()
        .color_scheme(db.FieldColor().mode(m.FieldColorModeId.THRESHOLDS))
        .mappings(value_map({"0": ("", "transparent"), "1": ("yes", GREEN)}))
        .thresholds(thresholds((None, "transparent"), (1, GREEN)))
        .fill_opacity(80)
        .hide_from(cb.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        .line_width(0)
        .align_value(cm.TimelineValueAlignment.LEFT)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(False)
        )
        .merge_values(True)
        .row_height(0.8)
        .show_value(cm.VisibilityMode.NEVER)
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE))
    )
    targets = [target(expr, name) for expr, name in queries]
    return panel(builder, title, targets, "none", w=w, h=h, description=description)


def alerts_table(
    title: str,
    expr: str,
    *,
    w: int,
    h: int,
    description: str,
    no_value: str = "no alert is firing",
    hidden: Sequence[str] = ("Time", "Value", "__name__", "alertstate"),
    unit: str = "none",
) -> Spec:
    """A table of series (one row each, their labels as columns), e.g. the firing alerts."""
    organize = m.DataTransformerConfig(id_val="organize", options={"excludeByName": dict.fromkeys(hidden, True)})
    builder = (
        table.Panel()
        .cell_height(cm.TableCellHeight.SM)
        .footer(cb.TableFooterOptions().show(False).reducer([]))
        .show_header(True)
        .sort_by([])
        .align(cm.FieldTextAlignment.AUTO)
        .inspect(False)
        .no_value(no_value)
        .with_transformation(organize)
    )
    targets = [target(expr, instant=True, fmt="table")]
    return panel(builder, title, targets, unit, w=w, h=h, description=description)


# --------------------------------------------------------------------------- layout


@dataclass
class Row:
    """A titled row of panels; a collapsed row holds its panels inside it (queried when opened)."""

    title: str
    panels: list[Spec] = field(default_factory=list)
    collapsed: bool = False


def _place(specs: Sequence[Spec], top: int, next_id: Callable[[], int]) -> tuple[list[Any], int]:
    """Flows ``specs`` left to right from row ``top``; returns the placed builders and the first free row."""
    placed: list[Any] = []
    x, y, line_h = 0, top, 0
    for spec in specs:
        if x + spec.w > GRID_WIDTH:
            x, y, line_h = 0, y + line_h, 0
        placed.append(spec.builder.grid_pos(m.GridPos(h=spec.h, w=spec.w, x=x, y=y)).id(next_id()))
        x, line_h = x + spec.w, max(line_h, spec.h)
    return placed, y + line_h


def layout(board: db.Dashboard, rows: Sequence[Row]) -> db.Dashboard:
    """Adds each row to ``board``, then (unless collapsed) its panels; ids count from 1.

    Every position is computed here (the SDK's own placement only fills in panels at 0,0, and no
    panel is there: the first row is).
    """
    counter = iter(range(1, 10_000))

    def next_id() -> int:
        return next(counter)

    y = 0
    for row in rows:
        row_builder = db.Row(row.title).grid_pos(m.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)).id(next_id())
        placed, bottom = _place(row.panels, y + 1, next_id)
        if row.collapsed:
            for built in placed:
                row_builder.with_panel(built)
            board.with_row(row_builder)
            y += 1
        else:
            board.with_row(row_builder.collapsed(False))
            for built in placed:
                board.with_panel(built)
            y = bottom
    return board


# --------------------------------------------------------------------------- dashboard frame


def datasource_variable() -> db.DatasourceVariable:
    return (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .hide(m.VariableHide.DONT_HIDE)
        .type("prometheus")
        .multi(False)
        .include_all(False)
        .regex("")
    )


def builtin_annotation() -> db.AnnotationQuery:
    return (
        db.AnnotationQuery()
        .built_in(1)
        .datasource(m.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .name("Annotations & Alerts")
        .target(db.AnnotationTarget().limit(100).match_any(False).tags([]).type("dashboard"))
        .type("dashboard")
    )


def warden_link() -> db.DashboardLink:
    return (
        db.DashboardLink("Warden dashboards")
        .as_dropdown(False)
        .icon("external link")
        .include_vars(True)
        .keep_time(True)
        .tags(TAGS)
        .target_blank(False)
        .tooltip("")
        .type(m.DashboardLinkType.DASHBOARDS)
    )


def annotation(name: str, expr: str, color: str) -> db.AnnotationQuery:
    """A Prometheus annotation: a marker wherever ``expr`` returns a series (the SDK's annotation model has
    no title format: Grafana shows the annotation's name and the series' labels)."""
    query = db.AnnotationQuery().datasource(datasource()).enable(True).expr(expr)
    return query.hide(False).icon_color(color).name(name)


def dashboard(
    uid: str,
    title: str,
    description: str,
    rows: Sequence[Row],
    variables: Sequence[Any] = (),
    annotations: Sequence[db.AnnotationQuery] = (),
) -> Json:
    """The dashboard around ``rows`` (datasource variable first, built-in annotations first), as JSON data."""
    board = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .editable()
        .fiscal_year_start_month(0)
        .tooltip(m.DashboardCursorSync.CROSSHAIR)
        .link(warden_link())
        .live_now(False)
        .refresh("30s")
        .tags(TAGS)
        .time("now-6h", "now")
        .timezone("browser")
        .version(1)
        .variables([datasource_variable(), *variables])
        .annotations([builtin_annotation(), *annotations])
    )
    return to_data(layout(board, rows).build())


def to_data(model: Any) -> Json:
    """The SDK model as plain JSON data (what its encoder writes)."""
    data: Json = json.loads(json.dumps(model, cls=JSONEncoder))
    return data


def validate(board: Json) -> list[str]:
    """Where ``board`` differs from itself read back through the SDK's models: each path whose key or
    value the models do not know (empty: valid). Every panel plugin's options are registered first."""
    register_default_plugins()
    again = to_data(m.Dashboard.from_json(board))
    return sorted(_differences(board, again, "$"))


def _differences(a: Any, b: Any, where: str) -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                yield f"{where}.{key}: not in the SDK's model"
            elif key not in a:
                yield f"{where}.{key}: the model adds it ({b[key]!r}); set it in the generator"
            else:
                yield from _differences(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{where}[{i}]")
    elif a != b or type(a) is not type(b):
        yield f"{where}: {a!r} reads back as {b!r}"


# --------------------------------------------------------------------------- overview

UP_MAPPINGS = {"0": ("DOWN", RED), "1": ("UP", GREEN)}


def up_stat(job: str) -> Spec:
    return stat(
        "Up",
        f'min(up{{job="{job}"}})',
        "none",
        description=f"Prometheus scrape of the {job} target (absent: not scraped at all).",
        steps=((None, RED), (1, GREEN)),
        mappings=value_map(UP_MAPPINGS),
        no_value="absent",
    )


def since_stat(title: str, timestamp_selector: str, *, description: str, warn: float, crit: float) -> Spec:
    """Seconds since the newest non-zero Unix timestamp of ``timestamp_selector``."""
    return stat(
        title,
        f"time() - max({timestamp_selector} > 0)",
        "s",
        description=description,
        steps=((None, GREEN), (warn, YELLOW), (crit, RED)),
        no_value="never",
    )


def firing_stat(job: str) -> Spec:
    return stat(
        "Firing alerts",
        f'count(ALERTS{{alertstate="firing", job="{job}"}}) or vector(0)',
        "none",
        description=f"Alerts firing now whose job label is {job}.",
        steps=((None, GREEN), (1, RED)),
    )


def count_stat(title: str, expr: str, *, description: str, warn: float = 1, unit: str = "none") -> Spec:
    """A figure that is fine at 0 and red from ``warn`` up."""
    return stat(title, expr, unit, description=description, steps=((None, GREEN), (warn, RED)))


def sidecar_lag(name: str) -> Spec:
    return count_stat(
        "Lag",
        f'max(warden_sidecar_lag_events{{sidecar="{name}"}})',
        description="Journal events written but not handled yet.",
        warn=100,
    )


def sidecar_errors(name: str) -> Spec:
    return count_stat(
        "Errors (1h)",
        f'sum(increase(warden_sidecar_errors_total{{sidecar="{name}"}}[1h]))',
        description="Handler, check and journal failures in the last hour.",
    )


def sidecar_success(name: str, warn: float, crit: float) -> Spec:
    return since_stat(
        "Last success",
        f'warden_sidecar_last_success_timestamp_seconds{{sidecar="{name}"}}',
        description="Time since the last event or check the sidecar completed.",
        warn=warn,
        crit=crit,
    )


def component_row(job: str, title: str, last_success: Spec, figures: Sequence[Spec]) -> Row:
    """One overview row: up, last success, the key figures, firing alerts."""
    return Row(title, [up_stat(job), last_success, *figures, firing_stat(job)])


def trainer_row() -> Row:
    last_step = since_stat(
        "Last step",
        "warden_trainer_last_step_timestamp_seconds",
        description="Time since the trainer completed a PPO step.",
        warn=300,
        crit=900,
    )
    figures = [
        stat("Step", "max(warden_trainer_last_step)", "none", description="Number of the last completed step."),
        stat("Reward (mean)", "avg(warden_trainer_reward_mean)", "none", description="Mean reward of the last step."),
        stat(
            "Generated tokens/s",
            "sum(warden_trainer_generated_tokens_per_second)",
            "short",
            description="Response tokens generated per second in the last rollout.",
        ),
        stat("KL", "max(warden_trainer_kl)", "none", description="KL to the reference policy (nats/token)."),
        since_stat(
            "Last checkpoint",
            "warden_trainer_last_checkpoint_timestamp_seconds",
            description="Age of the newest complete checkpoint.",
            warn=1800,
            crit=3600,
        ),
    ]
    return component_row("trainer", "Trainer", last_step, figures)


def signer_row() -> Row:
    figures = [
        sidecar_lag("signer"),
        sidecar_errors("signer"),
        stat("Signed", "sum(warden_signer_signed_total)", "none", description="Checkpoints signed since start."),
        count_stat(
            "Unsigned",
            "max(warden_signer_unsigned_checkpoints)",
            description="Complete checkpoints without a signature yet.",
            warn=2,
        ),
        count_stat(
            "Invalid",
            "max(warden_signer_invalid_checkpoints)",
            description="Signed checkpoints whose last re-verification failed.",
        ),
    ]
    return component_row("signer", "Signer", sidecar_success("signer", 900, 3600), figures)


def archiver_row() -> Row:
    figures = [
        sidecar_lag("archiver"),
        sidecar_errors("archiver"),
        stat(
            "Archived",
            "sum(warden_archiver_records_archived_total)",
            "none",
            description="Records confirmed in the store since start.",
        ),
        count_stat(
            "Spool depth",
            "max(warden_archiver_spool_depth)",
            description="Signed records waiting locally for the store.",
            warn=10,
        ),
        stat(
            "Store",
            "min(warden_archiver_store_up)",
            "none",
            description="Whether the last store request succeeded.",
            steps=((None, RED), (1, GREEN)),
            mappings=value_map(UP_MAPPINGS),
        ),
    ]
    return component_row("archiver", "Archiver", sidecar_success("archiver", 900, 3600), figures)


def tokenscan_row() -> Row:
    figures = [
        sidecar_lag("tokenscan"),
        sidecar_errors("tokenscan"),
        count_stat(
            "Critical/high findings",
            'sum(warden_tokenscan_findings{severity=~"critical|high"})',
            description="Findings of severity critical or high in the last scans.",
        ),
        count_stat(
            "Drifting directories",
            "sum(warden_tokenscan_drift)",
            description="Watched directories that differ from their approved manifest.",
        ),
        stat(
            "Watched directories",
            "max(warden_tokenscan_watched_directories)",
            "none",
            description="Tokenizer and model directories being watched.",
        ),
    ]
    return component_row("tokenscan", "Tokenizer scanner", sidecar_success("tokenscan", 3600, 7200), figures)


def deps_row() -> Row:
    figures = [
        sidecar_errors("deps"),
        count_stat(
            "Vulnerabilities",
            "sum(warden_deps_vulnerabilities)",
            description="Known vulnerabilities in the audited environment (not ignored).",
        ),
        count_stat(
            "Tampered files",
            "max(warden_deps_tampered_files)",
            description="Installed files that differ from RECORD, the baseline or their source.",
        ),
        count_stat(
            "Drifting packages",
            "sum(warden_deps_drift_packages)",
            description="Packages that differ from the lock (missing, extra, wrong version, ...).",
        ),
        since_stat(
            "Last complete audit",
            "warden_deps_last_complete_audit_timestamp_seconds",
            description="Age of the last audit that checked everything.",
            warn=86400,
            crit=172800,
        ),
    ]
    return component_row("deps", "Dependencies", sidecar_success("deps", 86400, 172800), figures)


def paths_row() -> Row:
    figures = [
        sidecar_errors("paths"),
        count_stat(
            "Unhealthy paths",
            "count(warden_path_up == 0) or vector(0)",
            description="Watched paths whose last probe failed an expectation.",
        ),
        count_stat("Stuck probes", "sum(warden_path_stuck)", description="Probes past their deadline (a hung mount)."),
        stat(
            "Lowest free space",
            "min(warden_path_free_bytes)",
            "bytes",
            description="Free bytes on the fullest watched filesystem.",
        ),
        stat(
            "Lowest free fraction",
            "min(warden_path_free_bytes / warden_path_size_bytes)",
            "percentunit",
            description="Free share of the fullest watched filesystem.",
            steps=((None, RED), (0.05, YELLOW), (0.15, GREEN)),
        ),
    ]
    return component_row("paths", "Paths", sidecar_success("paths", 300, 900), figures)


def journal_row() -> Row:
    figures = [
        sidecar_errors("journal"),
        since_stat(
            "Last event",
            "warden_journal_last_event_timestamp_seconds",
            description="Time since the newest event the trainer wrote to the journal.",
            warn=300,
            crit=600,
        ),
        stat("Last step", "max(warden_journal_last_step)", "none", description="Step of the newest event."),
        count_stat("Quiet runs", "sum(warden_journal_stale)", description="Journals with no event within the limit."),
    ]
    return component_row("journal", "Journal", sidecar_success("journal", 300, 900), figures)


def shadow_row() -> Row:
    figures = [
        sidecar_errors("shadow"),
        count_stat(
            "Diverged",
            "max(warden_shadow_diverged)",
            description="1: the candidate run left the tolerances of policies/shadow.yaml at a common step.",
        ),
        stat(
            "First divergent step",
            "max(warden_shadow_first_divergent_step)",
            "none",
            description="Lowest step with a divergence; -1 while none (`warden compare` names the metric).",
        ),
        stat("Common steps", "max(warden_shadow_common_steps)", "none", description="Steps both runs have completed."),
        stat(
            "Reward KS p-value",
            "min(warden_shadow_reward_ks_p_value)",
            "none",
            description="Two-sample KS test of the newest judged step's reward snapshots (low: distributions differ).",
            steps=((None, RED), (0.01, GREEN)),
        ),
    ]
    return component_row("shadow", "Shadow", sidecar_success("shadow", 300, 900), figures)


def alerts_row() -> Row:
    return Row(
        "Alerts",
        [
            alerts_table(
                "Firing alerts",
                f'ALERTS{{alertstate="firing", {FIRING_ALERTS_EXCLUDED}}}',
                w=18,
                h=6,
                description="Every alert firing now (the Watchdog heartbeat left out).",
            ),
            count_stat(
                "Firing",
                f'count(ALERTS{{alertstate="firing", {FIRING_ALERTS_EXCLUDED}}}) or vector(0)',
                description="Number of alerts firing now.",
            ),
            stat(
                "Alert pipeline",
                'count(ALERTS{alertname="Watchdog", alertstate="firing"})',
                "none",
                description="The always-firing Watchdog alert: absent means rule evaluation is broken.",
                steps=((None, RED), (1, GREEN)),
                mappings=value_map({"1": ("OK", GREEN)}),
                no_value="broken",
            ),
        ],
    )


def hosts_row() -> Row:
    """Node exporter and DCGM panels under their own metric names (queried when the row opens)."""
    cpu = f'1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"}}[{RATE}]))'
    return Row(
        "Hosts and GPUs (node exporter, DCGM)",
        [
            timeseries("CPU busy", [(cpu, "{{instance}}")], "percentunit", w=6, minimum=0),
            timeseries(
                "Memory available",
                [("node_memory_MemAvailable_bytes", "{{instance}}")],
                "bytes",
                w=6,
                minimum=0,
            ),
            timeseries(
                "GPU utilisation",
                [("DCGM_FI_DEV_GPU_UTIL", "{{Hostname}} GPU {{gpu}}")],
                "percent",
                w=6,
                minimum=0,
            ),
            timeseries(
                "GPU memory used",
                [("DCGM_FI_DEV_FB_USED", "{{Hostname}} GPU {{gpu}}")],
                "mbytes",
                w=6,
                minimum=0,
            ),
        ],
        collapsed=True,
    )


def overview() -> Json:
    rows = [
        alerts_row(),
        trainer_row(),
        signer_row(),
        archiver_row(),
        tokenscan_row(),
        deps_row(),
        paths_row(),
        journal_row(),
        shadow_row(),
        hosts_row(),
    ]
    return dashboard(
        "warden-overview",
        "Warden / Overview",
        "One row per component: whether it is up, its last success, its key figures and its firing alerts.",
        rows,
    )


# --------------------------------------------------------------------------- trainer


def tm(name: str, extra: str = "") -> str:
    """A trainer metric selector limited to the chosen instances."""
    return f"{name}{{{INSTANCE}{', ' + extra if extra else ''}}}"


def instance_variable() -> db.QueryVariable:
    query = "label_values(warden_trainer_last_step, instance)"
    return (
        db.QueryVariable("instance")
        .label("Trainer")
        .hide(m.VariableHide.DONT_HIDE)
        .datasource(datasource())
        .query(query)
        .refresh(m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(m.VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .regex("")
    )


def run_row() -> Row:
    return Row(
        "Run",
        [
            stat(
                "Run",
                tm("warden_trainer_run_info"),
                "none",
                w=6,
                description="Run id of the trainer.",
                legend="{{run_id}}",
                text_mode="name",
            ),
            stat("Last step", f"max({tm('warden_trainer_last_step')})", "none", description="Last completed step."),
            stat(
                "Rollout layout",
                tm("warden_trainer_rollout_layout_info"),
                "none",
                w=6,
                description="Where the rollout engine runs: colocated with the trainer or split onto rollout.devices "
                "(its own process; weights pushed after every update), the engine and its tensor parallel size.",
                legend="{{mode}} {{engine}}: rollout [{{rollout_devices}}] TP {{tensor_parallel_size}}, "
                "trainer [{{trainer_devices}}]",
                text_mode="name",
            ),
            stat(
                "World size",
                f"max({tm('warden_trainer_world_size')})",
                "none",
                description="Data-parallel ranks now: smaller after torchrun re-formed the group without a lost node.",
            ),
            count_stat(
                "Elastic restarts",
                f"max({tm('warden_trainer_restart_count')}) or vector(0)",
                description="torchrun restarts of the worker group (WardenTrainerElasticRestart; docs/elastic.md).",
            ),
            since_stat(
                "Since last step",
                tm("warden_trainer_last_step_timestamp_seconds"),
                description="Time since a step completed (the no-progress alert fires at 15 minutes).",
                warn=300,
                crit=900,
            ),
            stat(
                "Newest checkpoint",
                f"max({tm('warden_trainer_last_checkpoint_step')})",
                "none",
                description="Step of the newest complete checkpoint.",
            ),
            since_stat(
                "Since last checkpoint",
                tm("warden_trainer_last_checkpoint_timestamp_seconds"),
                description="Age of the newest complete checkpoint (the overdue alert fires at 1 hour).",
                warn=1800,
                crit=3600,
            ),
            count_stat(
                "OOM events",
                f"sum(increase({tm('warden_trainer_oom_events_total')}[$__range])) or vector(0)",
                description="Out-of-memory errors caught in the time range, all phases.",
            ),
            count_stat(
                "Checkpoint write failures",
                f"sum(increase({tm('warden_trainer_checkpoint_write_failures_total')}[$__range])) or vector(0)",
                description="Checkpoint writes that failed in the time range.",
            ),
        ],
    )


def why_slow_row() -> Row:
    """Why is the rollout slow now: the causes the recording rules name from the last step's gauges
    (alerts/rules/rollout-causes.yml, generated from warden/diagnose/causes.py; ``warden diagnose`` prints
    the same), and the gauges they read."""
    causes = tm("warden_rollout_slow_cause")
    return Row(
        "Why is the rollout slow now",
        [
            alerts_table(
                "Causes named now",
                causes,
                w=12,
                h=8,
                description="One row per cause that holds for the last step (no waiting period: named at the first "
                "rule evaluation after the scrape). Value: the measure named in its column. The setting to change "
                "and by how much: warden diagnose --run-dir RUN --metrics URL.",
                no_value="no cause named: the last step is within every cause's bounds",
                hidden=("Time", "__name__", "job"),
            ),
            timeseries(
                "Time split of each step",
                [(tm("warden_trainer_last_step_phase_seconds"), "{{phase}} {{instance}}")],
                "s",
                description="Data loading, generation, reward scoring (decoding included), experience and update of "
                "the last step: a phase at 25 % of the step and 0.5 s or more is named above.",
                interpolation="stepAfter",
                minimum=0,
                stacked=True,
            ),
            timeseries(
                "Each rank's generation and scoring",
                [(tm("warden_trainer_rank_rollout_seconds"), "rank {{rank}} {{instance}}")],
                "s",
                w=8,
                description="Each rank's own rollout time in the last step, before it waits for the others: one "
                "rank 1.5x the fastest (and 0.5 s more) is a slow rank.",
                interpolation="stepAfter",
                minimum=0,
            ),
            timeseries(
                "vLLM scheduler in the last rollout",
                [
                    (tm("warden_rollout_requests_running_max"), "running (peak) {{instance}}"),
                    (tm("warden_rollout_requests_waiting_max"), "waiting (peak) {{instance}}"),
                    (tm("warden_rollout_max_num_seqs"), "max_num_seqs {{instance}}"),
                ],
                "short",
                w=8,
                description="Requests waiting while the running ones fill max_num_seqs: queueing (vLLM engine; zeros "
                "for the HF engine).",
                interpolation="stepAfter",
                minimum=0,
            ),
            timeseries(
                "KV cache peak in the last rollout",
                [(tm("warden_rollout_kv_cache_usage_max_ratio"), "{{instance}}")],
                "percentunit",
                w=4,
                description="Highest KV-cache usage of the last rollout; full (95 %) with preemptions is named above.",
                steps=((None, GREEN), (0.95, RED)),
                threshold_style="dashed",
                interpolation="stepAfter",
                minimum=0,
            ),
            stat(
                "Preempted, last rollout",
                f"max({tm('warden_rollout_preemptions_last')})",
                "none",
                w=4,
                h=8,
                description="Requests vLLM preempted (and recomputes) in the last rollout: the KV cache was full.",
                steps=((None, GREEN), (1, RED)),
            ),
        ],
    )


def learning_row() -> Row:
    return Row(
        "Reward and KL",
        [
            timeseries(
                "Reward",
                [(tm("warden_trainer_reward_mean"), "mean"), (tm("warden_trainer_reward_max"), "max")],
                "none",
                description="Mean and max reward of each step.",
            ),
            timeseries(
                "KL to the reference policy",
                [(tm("warden_trainer_kl"), "KL (nats/token)"), (tm("warden_trainer_kl_coef"), "KL coefficient")],
                "none",
                description="Mean per-token KL of the policy to the reference, and the current KL penalty coefficient.",
                steps=((None, GREEN), (10, RED)),
                threshold_style="dashed",
            ),
        ],
    )


def losses_row() -> Row:
    return Row(
        "Losses",
        [
            timeseries(
                "Losses",
                [(tm("warden_trainer_policy_loss"), "policy"), (tm("warden_trainer_value_loss"), "value")],
                "none",
                w=6,
                description="PPO policy (clipped surrogate) and value losses of each step.",
            ),
            timeseries("Entropy", [(tm("warden_trainer_entropy"), "entropy")], "none", w=6, description="nats/token."),
            timeseries(
                "Clip fraction",
                [(tm("warden_trainer_clip_fraction"), "clipped")],
                "percentunit",
                w=6,
                description="Share of tokens whose ratio PPO clipped.",
                minimum=0,
            ),
            timeseries(
                "Gradient norm",
                [(tm("warden_trainer_grad_norm"), "grad norm")],
                "none",
                w=6,
                description="Actor gradient norm before clipping.",
                minimum=0,
            ),
        ],
    )


def throughput_row() -> Row:
    steps = f"60 * sum(rate({tm('warden_trainer_steps_total')}[{RATE}]))"
    return Row(
        "Throughput and latency",
        [
            timeseries(
                "Generated tokens/s",
                [(tm("warden_trainer_generated_tokens_per_second"), "{{instance}}")],
                "short",
                w=8,
                description="Response tokens generated per second in each rollout.",
                minimum=0,
            ),
            heatmap(
                "Step latency",
                tm("warden_trainer_step_duration_seconds_bucket"),
                description="Wall time of PPO steps (histogram buckets).",
                scheme="Oranges",
            ),
            heatmap(
                "Rollout latency",
                tm("warden_trainer_rollout_duration_seconds_bucket"),
                description="Wall time of rollouts (generation), histogram buckets.",
                scheme="Blues",
            ),
            timeseries(
                "p95 latency (10 min)",
                [
                    (tm("warden_trainer_step_duration_p95_seconds"), "step {{instance}}"),
                    (tm("warden_trainer_rollout_duration_p95_seconds"), "rollout {{instance}}"),
                ],
                "s",
                description="The recording rules the alerts use; the rollout-slow alert fires above 0.5 s.",
                steps=((None, GREEN), (0.5, RED)),
                threshold_style="dashed",
                minimum=0,
            ),
            timeseries("Steps per minute", [(steps, "steps/min")], "short", description="PPO step rate.", minimum=0),
        ],
    )


def signature_stats() -> list[Spec]:
    return [
        since_stat(
            "Since last signature",
            "warden_signer_last_signed_timestamp_seconds",
            description="Time since the signer wrote a signature.",
            warn=1800,
            crit=3600,
        ),
        stat(
            "Unsigned checkpoint age",
            "max(warden_signer_unsigned_checkpoint_age_seconds)",
            "s",
            description="Age of the newest complete but unsigned checkpoint (0: all signed).",
            steps=((None, GREEN), (300, YELLOW), (600, RED)),
        ),
        count_stat(
            "Invalid checkpoints",
            "max(warden_signer_invalid_checkpoints)",
            description="Signed checkpoints whose last re-verification failed.",
        ),
        stat(
            "Signatures",
            "sum(increase(warden_signer_signed_total[$__range]))",
            "none",
            description="Signatures written in the time range.",
        ),
    ]


def checkpoint_row() -> Row:
    written = f"max(changes({tm('warden_trainer_last_checkpoint_timestamp_seconds')}[{RATE}])) > bool 0"
    signed = f"sum(increase(warden_signer_signed_total[{RATE}])) > bool 0"
    stats = signature_stats()
    for spec in stats:
        spec.w = GRID_WIDTH // len(stats)
    timeline = state_timeline(
        "Checkpoint and signature timeline",
        [
            (written, "checkpoint written"),
            (signed, "checkpoint signed"),
            ("max(warden_signer_unsigned_checkpoints) > bool 0", "unsigned checkpoint waiting"),
            ("max(warden_signer_invalid_checkpoints) > bool 0", "signed checkpoint invalid"),
        ],
        w=GRID_WIDTH,
        h=6,
        description="When checkpoints were written and signed, and when one waited unsigned or failed re-verification.",
    )
    progress = timeseries(
        "Steps and checkpoints",
        [
            (f"max({tm('warden_trainer_last_step')})", "last step"),
            (f"max({tm('warden_trainer_last_checkpoint_step')})", "newest checkpoint"),
        ],
        "none",
        w=GRID_WIDTH,
        description="The gap between the lines is the work a crash would lose.",
        interpolation="stepAfter",
    )
    return Row("Checkpoints and signatures", [*stats, timeline, progress, *checkpoint_space()])


def checkpoint_space() -> list[Spec]:
    """Whether the next checkpoint fits (trainer/space.py), and the saves that did not happen."""
    skipped = f"sum by (reason) (increase({tm('warden_trainer_checkpoint_skipped_total')}[{RATE}]))"
    return [
        timeseries(
            "Checkpoint space",
            [
                (tm("warden_trainer_checkpoint_space_free_bytes"), "free {{instance}}"),
                (tm("warden_trainer_checkpoint_space_needed_bytes"), "next needs {{instance}}"),
                (tm("warden_trainer_checkpoint_space_reclaimable_bytes"), "prune_first may free {{instance}}"),
            ],
            "bytes",
            description="Free bytes of the checkpoint root's filesystem and what the next checkpoint needs, measured "
            "before and after each save; WardenCheckpointSpaceInsufficient pages while free plus what prune_first "
            "may free is below needed.",
            interpolation="stepAfter",
            minimum=0,
        ),
        timeseries(
            "Save timing",
            [
                (tm("warden_trainer_checkpoint_stall_seconds"), "training held {{instance}}"),
                (tm("warden_trainer_checkpoint_write_seconds"), "until durable {{instance}}"),
                (f"increase({tm('warden_trainer_checkpoint_wait_seconds_total')}[{RATE}])", "waited {{instance}}"),
            ],
            "s",
            description="The last save: how long training was held (the copy into host buffers when "
            "checkpoint.async_save is on, the whole write when off), how long until its bytes were durable, and "
            "the time saves waited for a previous one still being written.",
            interpolation="stepAfter",
            minimum=0,
        ),
        timeseries(
            "Skipped saves",
            [(skipped, "{{reason}}")],
            "short",
            description="Saves not made, by reason (no_space: would not fit even after pruning; write_failed: every "
            "retry failed); WardenCheckpointSkipped pages on any.",
            minimum=0,
        ),
    ]


def vllm_row() -> Row:
    ttft = "vllm:time_to_first_token_seconds_bucket"
    itl = f"histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[{RATE}])))"
    return Row(
        "Rollout engine (vLLM)",
        [
            timeseries(
                "Requests",
                [("sum(vllm:num_requests_running)", "running"), ("sum(vllm:num_requests_waiting)", "waiting")],
                "none",
                w=8,
                minimum=0,
            ),
            timeseries("KV cache usage", [("max(vllm:kv_cache_usage_perc)", "used")], "percentunit", w=8, minimum=0),
            timeseries(
                "Generation tokens/s",
                [(f"sum(rate(vllm:generation_tokens_total[{RATE}]))", "tokens/s")],
                "short",
                w=8,
                minimum=0,
            ),
            heatmap("Time to first token", ttft, w=12, scheme="Purples"),
            timeseries("Inter-token latency p95", [(itl, "p95")], "s", minimum=0),
        ],
        collapsed=True,
    )


def gpu_row() -> Row:
    legend = "{{Hostname}} GPU {{gpu}}"
    return Row(
        "GPUs (DCGM)",
        [
            timeseries("GPU utilisation", [("DCGM_FI_DEV_GPU_UTIL", legend)], "percent", w=8, minimum=0),
            timeseries("GPU memory used", [("DCGM_FI_DEV_FB_USED", legend)], "mbytes", w=8, minimum=0),
            timeseries("GPU power", [("DCGM_FI_DEV_POWER_USAGE", legend)], "watt", w=8, minimum=0),
        ],
        collapsed=True,
    )


def trainer() -> Json:
    annotations = [
        annotation(
            "Checkpoints",
            f"changes({tm('warden_trainer_last_checkpoint_step')}[1m]) > 0",
            BLUE,
        ),
        annotation("Signatures", "increase(warden_signer_signed_total[1m]) > 0", GREEN),
        annotation("OOM", f"increase({tm('warden_trainer_oom_events_total')}[1m]) > 0", RED),
    ]
    rows = [
        run_row(),
        why_slow_row(),
        learning_row(),
        losses_row(),
        throughput_row(),
        checkpoint_row(),
        vllm_row(),
        gpu_row(),
    ]
    return dashboard(
        "warden-trainer",
        "Warden / Trainer",
        "PPO trainer: reward, KL, losses, throughput, latency heatmaps, checkpoints and their signatures.",
        rows,
        variables=[instance_variable()],
        annotations=annotations,
    )


DASHBOARDS: dict[str, Callable[[], Json]] = {"overview.json": overview, "trainer.json": trainer}


# --------------------------------------------------------------------------- queries and metric names

_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_DURATION_VARIABLES = {"__interval", "__rate_interval", "__range"}
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?\w+\)$")


def expand_variables(expr: str) -> str:
    """``expr`` with Grafana variables replaced so that it parses: durations by ``5m``, others by ``x``."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return "5m" if name in _DURATION_VARIABLES else "x"

    return _VARIABLE.sub(sub, expr)


def walk_panels(panels: Sequence[Json]) -> Iterator[Json]:
    """Every panel, rows and the panels inside collapsed rows included."""
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def queries(board: Json) -> Iterator[str]:
    """Every PromQL expression of ``board``: panel targets, annotations, ``label_values`` selectors."""
    for p in walk_panels(board.get("panels", [])):
        for t in p.get("targets", []):
            yield t["expr"]
    for a in board["annotations"]["list"]:
        if "expr" in a:
            yield a["expr"]
    for v in board["templating"]["list"]:
        match = _LABEL_VALUES.match(v["query"]) if v["type"] == "query" else None
        if match and match.group(1):
            yield match.group(1)


def metric_names(expr: str) -> set[str]:
    """Metric names ``expr`` selects (after :func:`expand_variables`); raises ValueError if it does not parse."""
    import promql_parser  # a development dependency, needed only here

    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")

    promql_parser.walk(promql_parser.parse(expand_variables(expr)), visit)
    return names


def metrics_used(boards: Sequence[Json]) -> list[str]:
    """Sorted metric names of every query of ``boards``."""
    return sorted({name for board in boards for expr in queries(board) for name in metric_names(expr)})


# --------------------------------------------------------------------------- output


def to_json(obj: Any) -> str:
    """The byte-stable text form: sorted keys, two-space indent, ASCII, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def render() -> dict[Path, str]:
    """Every generated file and its exact text."""
    boards = {DASHBOARD_DIR / name: build() for name, build in DASHBOARDS.items()}
    out = {path: to_json(board) for path, board in boards.items()}
    out[METRICS_FILE] = to_json(metrics_used(list(boards.values())))
    return out


def stale(files: dict[Path, str]) -> list[Path]:
    """The files whose committed text differs from ``files`` (missing ones included)."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def write_atomically(path: Path, text: str) -> None:
    """Replaces ``path`` in one rename, so Grafana never reads half a dashboard."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate Warden's Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    files = render()
    if args.check:
        old = stale(files)
        for path in old:
            print(f"stale: {path.relative_to(HERE.parent)} (run: python grafana/generate.py)", file=sys.stderr)
        return 1 if old else 0
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        write_atomically(path, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
