"""``warden diagnose --run-dir DIR [--metrics URL]``: why the rollout is slow now.

Reads the newest step of the run's journal and, with ``--metrics`` (repeatable: the trainer's
``/metrics``, a DCGM exporter's), the gauges of the last step, and prints each cause of
:data:`warden.diagnose.causes.CAUSES` that holds, with the setting to change and by how much: the
same table the recording rules ``warden_rollout_slow_cause`` are generated from.

Exit 0 when no cause holds, 1 naming the causes, 2 for a run directory without a journal or a URL
that is none, 3 when the facts could not be read (no completed step yet, the endpoint unreachable).
"""

from __future__ import annotations

import click

from warden.cliutil import echo, echo_json, format_option, option, run_dir_option
from warden.diagnose.causes import Facts, Finding, diagnose
from warden.diagnose.facts import gather
from warden.errors import EXIT_OK, EXIT_VIOLATION


def split_line(facts: Facts) -> str:
    """The step's time split, as the findings' context."""

    def s(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f} s"

    ranks = ", ".join(f"{r:.2f}" for r in facts.rank_rollout_s) or "?"
    return (
        f"step {facts.step if facts.step is not None else '?'}: {s(facts.step_s)} "
        f"(data {s(facts.data_s)}, generation {s(facts.generation_s)}, reward {s(facts.reward_s)}; "
        f"per rank {ranks} s)"
    )


def render_text(facts: Facts, findings: list[Finding]) -> str:
    lines = [split_line(facts), f"from: {', '.join(facts.sources)}"]
    if not findings:
        lines.append("no cause named: the last step's gauges are within every cause's bounds")
    for f in findings:
        lines.append(f"cause: {f.title} ({f.cause}; {f.measure} = {f.value:.3g})")
        lines.append(f"  change: {f.advice}")
    return "\n".join(lines)


@click.command("diagnose")
@run_dir_option("Run directory holding events.jsonl (its newest step.completed).", required=False)
@option(
    "--metrics",
    "urls",
    multiple=True,
    metavar="URL",
    help="A /metrics endpoint to read the last step's gauges from (the trainer's; a DCGM exporter's). Repeatable.",
)
@format_option()
@click.pass_context
def diagnose_command(ctx: click.Context, run_dir: str | None, urls: tuple[str, ...], output_format: str) -> None:
    """Name why the rollout is slow now, and the number to change.

    Exit 0 when no cause holds, 1 naming each cause, 2 for bad arguments, 3 when nothing could be read.
    """
    if run_dir is None and not urls:
        raise click.UsageError("name --run-dir DIR, --metrics URL or both")
    facts = gather(run_dir, urls)
    findings = diagnose(facts)
    if output_format == "json":
        echo_json({"step": facts.step, "sources": list(facts.sources), "causes": [f.to_data() for f in findings]})
    else:
        echo(render_text(facts, findings))
    ctx.exit(EXIT_VIOLATION if findings else EXIT_OK)
