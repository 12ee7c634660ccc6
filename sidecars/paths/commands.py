"""``warden paths check``: one round of the path probes, exit 0 healthy / 1 unhealthy / 3 incomplete."""

from __future__ import annotations

import click

from warden.cliutil import echo, echo_json, format_option, policy_options
from warden.paths.policy import PathsPolicy
from warden.paths.scheduler import PathState, PathWatcher, states_outcome
from warden.policy import load_policy


@click.group()
def paths() -> None:
    """Path health: probe data, model, tokenizer and checkpoint paths in child processes."""


def _size(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} PiB"  # pragma: no cover


def _text_line(st: PathState) -> str:
    status = "ok" if st.healthy else ("STUCK" if st.stuck else "FAIL")
    took = f"{st.duration_seconds:.3f}s" if st.duration_seconds is not None else "-"
    line = f"{status:<6} {st.name:<18} {took:>8}  {st.message}"
    extra = []
    if st.free_bytes is not None and not st.stuck:
        pct = f" ({100 * st.free_bytes / st.total_bytes:.0f}%)" if st.total_bytes else ""
        extra.append(f"free {_size(st.free_bytes)}{pct}")
    if st.free_inodes is not None and not st.stuck:
        extra.append(f"{st.free_inodes} inodes free")
    if st.mount is not None:
        extra.append(st.mount.describe())
    return line + ("\n" + " " * 36 + "; ".join(extra) if extra else "")


@paths.command("check")
@policy_options("paths")
@format_option()
@click.pass_context
def check(ctx: click.Context, policy: str, output_format: str) -> None:
    """Probe every path of the policy once; exit 0 healthy, 1 unhealthy, 3 a probe could not run.

    Each probe runs in its own child process with the path's deadline; a path that does
    not answer in time is reported stuck, and its probe process is left to exit on its own.
    """
    loaded = load_policy(policy, PathsPolicy)
    watcher = PathWatcher(loaded.paths)
    try:
        states = list(watcher.run_round().values())
    finally:
        watcher.close()
    code = states_outcome(states)
    if output_format == "json":
        echo_json({"policy": policy, "healthy": code == 0, "exit_code": code, "paths": [s.to_dict() for s in states]})
    else:
        bad = sum(1 for s in states if not s.healthy)
        echo(f"paths: {len(states) - bad} healthy, {bad} unhealthy ({policy})")
        for st in states:
            echo(_text_line(st))
    ctx.exit(code)
