"""``warden compare RUN_A RUN_B``: two runs step by step (shadow mode, issue 22).

Exit 0 when every judged metric and reward distribution is within the policy's tolerance at
every common step, 1 naming the first step and metric that diverged, 2 for a bad policy or a
run that is no journal, 3 when the runs share no step to compare.
"""

from __future__ import annotations

import click

from warden.cliutil import echo, echo_json, format_option, option, policy_options
from warden.errors import EXIT_OK, EXIT_VIOLATION
from warden.policy import load_policy
from warden.shadow.compare import compare_series
from warden.shadow.errors import NothingToCompare
from warden.shadow.journals import read_run
from warden.shadow.plot import write_png
from warden.shadow.policy import ShadowPolicy
from warden.shadow.report import render_json, render_text


@click.command("compare")
@click.argument("run_a", type=click.Path())
@click.argument("run_b", type=click.Path())
@policy_options("shadow")
@option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a PNG of both curves per metric.")
@format_option()
@click.pass_context
def compare(
    ctx: click.Context,
    run_a: str,
    run_b: str,
    policy: str,
    plot_path: str | None,
    output_format: str,
) -> None:
    """Compare two runs (run directories or journals) step by step.

    Metrics are aligned by step (verl names mapped by the bridge's alias table) and judged
    against the tolerances of the shadow policy; the reward snapshots of each common step are
    compared with a two-sample Kolmogorov-Smirnov test. Exit 0 within tolerance, 1 naming
    the first step and metric that diverged, 3 when the runs share no step.
    """
    rules = load_policy(policy, ShadowPolicy)
    a, b = read_run(run_a), read_run(run_b)
    comparison = compare_series(a.series, b.series, rules)
    if not comparison.common_steps:
        raise NothingToCompare(
            f"{a.path} and {b.path} share no step with a metric of the policy or a reward snapshot "
            f"(steps in A: {len(a.series.metrics)}, in B: {len(b.series.metrics)})"
        )
    if output_format == "json":
        echo_json(render_json(comparison, a.path, b.path) | {"plot": plot_path})
    else:
        echo(render_text(comparison, a.path, b.path))
    if plot_path:
        write_png(plot_path, a.series, b.series, comparison, a.path, b.path)
        if output_format == "text":
            echo(f"plot: {plot_path}")
    ctx.exit(EXIT_OK if comparison.ok else EXIT_VIOLATION)
