"""``warden audit snapshot|verify-run|list``: fetch and verify archived reward snapshots.

Exit codes: 0 verified, 1 a violation (signature, key or chain), 2 usage/configuration,
3 incomplete (store unreachable, step or run not found). The store is ``--store`` (or
``WARDEN_STORE``), else the ``store`` of the archiver policy; trusted keys are
``--trust`` (a ``.pub`` file or a directory of them; required, never a default path).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click

from warden.archive.anchor import DEFAULT_GRACE_SECONDS, JournalAnchor
from warden.archive.errors import ChainBroken, StepNotFound
from warden.archive.findings import ranges
from warden.archive.lookup import Snapshot, fetch_snapshot, list_steps
from warden.archive.policy import ArchiverPolicy
from warden.archive.record import valid_run_id
from warden.archive.store import DEFAULT_MAX_OBJECT_BYTES, Store, open_store
from warden.archive.verify import RunReport, verify_run
from warden.cliutil import echo, echo_json, format_option, option, policy_options, run_dir_option, trust_option
from warden.errors import ConfigError
from warden.policy import load_policy
from warden.signing.keys import TrustedKeys, load_trusted_keys


def _run_id(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not valid_run_id(value):
        raise click.BadParameter(f"{value!r} is not a run id (letters, digits, '.', '_', '-')")
    return value


def _store_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = policy_options("archiver")(func)
    func = option(
        "--store",
        metavar="URL",
        help="s3://bucket/prefix[?addressing_style=path] or file:///dir. Default: the archiver policy's store.",
    )(func)
    return option("--run", "run_id", required=True, callback=_run_id, help="Run id.")(func)


def _trust_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return trust_option()(func)


def _open(store_url: str | None, policy_path: str) -> Store:
    """The store from --store, else from the policy file."""
    style = "auto"
    if store_url is None:
        if not os.path.exists(policy_path):
            raise ConfigError(f"no store given: pass --store URL (or WARDEN_STORE); {policy_path} does not exist")
        policy = load_policy(policy_path, ArchiverPolicy)
        store_url, style = policy.store_url(), policy.addressing_style
    return open_store(store_url, addressing_style=style)


def _max_bytes_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return option(
        "--max-object-bytes",
        type=click.IntRange(min=1024),
        default=DEFAULT_MAX_OBJECT_BYTES,
        show_default=True,
        help="A record larger than this is not read (reported malformed). Raise it for huge top_k x max_text_bytes.",
    )(func)


def _trusted(path: str) -> TrustedKeys:
    return load_trusted_keys(path)


@click.group("audit")
def audit() -> None:
    """Fetch and verify archived reward snapshots (signed, hash-chained records per step).

    Exit codes: 0 verified, 1 a record or the chain is wrong (altered, missing, reordered,
    untrusted key), 2 usage or configuration, 3 not found or the store is unreachable.
    """


# --- snapshot ------------------------------------------------------------------------------------


def _snapshot_text(snap: Snapshot, store: Store) -> str:
    record = snap.record
    lines = [f"run {snap.run_id} step {snap.step}  ({store.url} {snap.key})"]
    lines.append(f"signature: ok, trusted key {snap.key_id[:16]}…")
    lines.append(
        f"chain: BROKEN ({snap.problem.kind}): {snap.problem.message}" if snap.problem else f"chain: {snap.link}"
    )
    checkpoint = record.get("checkpoint")
    lines.append(f"time: {record.get('time')}  checkpoint: {checkpoint['path'] if checkpoint else 'none known'}")
    selection = record.get("selection", {})
    threshold = selection.get("min_reward")
    lines.append(
        f"samples: {len(record.get('samples', []))} kept of {selection.get('offered')} "
        f"(top_k {selection.get('top_k')}, min_reward {'none' if threshold is None else threshold})"
    )
    for rank, sample in enumerate(record.get("samples", []), 1):
        flags = " [truncated]" if sample.get("truncated") else ""
        lines.append(f"  #{rank} reward {sample['reward']:.4f} index {sample['index']}{flags}")
        lines.append(f"     prompt:   {json.dumps(sample['prompt'][:200], ensure_ascii=False)}")
        lines.append(f"     response: {json.dumps(sample['response'][:200], ensure_ascii=False)}")
    lines.extend(f"note: {note}" for note in record.get("notes", []))
    lines.append(f"{snap.requests} store requests, {snap.seconds * 1000:.0f} ms")
    return "\n".join(lines)


@audit.command("snapshot")
@_store_options
@option("--step", type=click.IntRange(min=0), required=True, help="Training step.")
@_trust_option
@_max_bytes_option
@format_option()
def snapshot_command(
    run_id: str, store: str | None, policy: str, step: int, trust: str, max_object_bytes: int, output_format: str
) -> None:
    """Fetch the record of one step, verify its signature and its link to the previous record, print it.

    At most 3 store requests. A step proved archived and now gone (delete marker, a later
    record chained to it, the signed head naming it) exits 1 (missing); a step never
    archived exits 3 and names the archived steps near it.
    """
    trusted = _trusted(trust)
    backend = _open(store, policy)
    try:
        snap = fetch_snapshot(backend, run_id, step, trusted, max_object_bytes)
    except StepNotFound as exc:
        if output_format == "json":
            echo_json({"run_id": run_id, "step": step, "found": False, "nearby": list(exc.nearby), "error": str(exc)})
        raise
    finally:
        backend.close()
    if output_format == "json":
        echo_json(
            {
                "run_id": run_id,
                "step": step,
                "found": True,
                "store": backend.url,
                "key": snap.key,
                "verified": snap.problem is None,
                "key_id": snap.key_id,
                "link": snap.link,
                "break": snap.problem.to_dict() if snap.problem else None,
                "record": snap.record,
                "requests": snap.requests,
                "seconds": round(snap.seconds, 4),
            }
        )
    else:
        echo(_snapshot_text(snap, backend))
    if snap.problem is not None:
        raise ChainBroken(f"run {run_id} step {step}: {snap.problem.message}")


# --- verify-run ---------------------------------------------------------------------------------------


def _report_text(report: RunReport) -> str:
    lines = [f"run {report.run_id} in {report.store}"]
    span = f"steps {report.first_step}..{report.last_step}" if report.first_step is not None else "no records"
    lines.append(f"records verified: {report.checked} ({span})")
    if report.head is not None:
        lines.append(f"head: step {report.head.last_step}")
    if report.after_head:
        lines.append(f"after the head (the head lags; uploads in progress): {ranges(report.after_head)}")
    if report.versioned:
        lines.append(f"versions: checked (delete markers, {report.head_versions_read} older head version(s) read)")
    if report.anchor is not None:
        recent = f"; within the grace period: {ranges(report.anchor_recent)}" if report.anchor_recent else ""
        lines.append(f"anchor: {report.anchor}{recent}")
    keys = ", ".join(k[:16] + "…" for k in sorted(report.key_ids)) or "none"
    lines.append(f"signed by: {keys}")
    if report.problem is None:
        lines.append("chain: intact")
    for finding in report.findings:
        where = f" at step {finding.step}" if finding.step is not None else ""
        lines.append(f"chain: BROKEN{where} ({finding.kind}): {finding.message}")
    lines.append(f"{report.requests} store requests, {report.seconds:.2f} s")
    return "\n".join(lines)


@audit.command("verify-run")
@_store_options
@_trust_option
@option("--workers", type=click.IntRange(1, 128), default=16, show_default=True, help="Concurrent reads.")
@_max_bytes_option
@run_dir_option(
    "The run directory: its journal (events.jsonl) is the anchor that the store's newest record is checked "
    "against (see docs/threat-model.md); needed to detect a rolled-back file:// store.",
    required=False,
)
@option(
    "--grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_GRACE_SECONDS,
    show_default=True,
    help="With --run-dir: journal snapshots younger than this many seconds may still be uploading.",
)
@format_option()
def verify_run_command(
    run_id: str,
    store: str | None,
    policy: str,
    trust: str,
    workers: int,
    max_object_bytes: int,
    run_dir: str | None,
    grace: float,
    output_format: str,
) -> None:
    """Verify a whole run: every record, the chain, the head, deletions; report every break.

    Kinds: missing, rolled_back, altered, wrong_key, malformed, reordered, unexpected.
    """
    trusted = _trusted(trust)
    anchor = JournalAnchor.from_run_dir(run_dir, run_id) if run_dir is not None else None
    backend = _open(store, policy)
    try:
        report = verify_run(
            backend, run_id, trusted, workers, max_record_bytes=max_object_bytes, anchor=anchor, grace=grace
        )
    finally:
        backend.close()
    if output_format == "json":
        echo_json(report.to_dict())
    else:
        echo(_report_text(report))
    if report.problem is not None:
        raise ChainBroken(f"run {run_id}: the chain is broken: {report.problem.message}")


# --- list -----------------------------------------------------------------------------------------------


@audit.command("list")
@_store_options
@format_option()
def list_command(run_id: str, store: str | None, policy: str, output_format: str) -> None:
    """List the archived steps of a run (no verification; see verify-run)."""
    backend = _open(store, policy)
    try:
        steps = list_steps(backend, run_id)
    finally:
        backend.close()
    if output_format == "json":
        echo_json({"run_id": run_id, "store": backend.url, "count": len(steps), "steps": steps})
        return
    if not steps:
        echo(f"run {run_id}: no archived steps in {backend.url}")
        return
    echo(f"run {run_id}: {len(steps)} archived steps in {backend.url}: {ranges(steps)}")
