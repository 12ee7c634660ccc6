"""``warden scan tokenizer PATH...``: exit 0 clean, 1 violation, 3 incomplete (2 usage).

Text output groups findings by severity with their fix hints; ``--format json`` and
``--format sarif`` (SARIF 2.1.0, for code-scanning tools) carry the same findings.
With ``--state-dir``, each directory is also compared with its approved manifest (drift,
TS1101) and with the digest of the ids its tokenizer gave the built-in corpus at approval
(TS1208); ``--approve`` records both for every directory that scanned clean, and
``--approve --accept-findings`` also for one with findings, recording which were accepted.
"""

from __future__ import annotations

import json
import time

import click

from warden.cliutil import echo, format_option, option, policy_options
from warden.logs import utc_timestamp
from warden.safeio import atomic_write_bytes
from warden.tokenscan.approval import review
from warden.tokenscan.manifest import Approval, ApprovalStore, ManifestError
from warden.tokenscan.policy import TokenscanPolicy, load_tokenscan_policy
from warden.tokenscan.report import render_json, render_sarif, render_text
from warden.tokenscan.scanner import DirectoryScan, scan_paths, worst_outcome


@click.group()
def scan() -> None:
    """Supply-chain scans of model and tokenizer directories."""


def _policy(path: str) -> tuple[TokenscanPolicy, str]:
    return load_tokenscan_policy(path), path


def _compare(
    store: ApprovalStore, scan_result: DirectoryScan, approve: bool, policy: TokenscanPolicy, accept: bool = False
) -> DirectoryScan:
    """The scan with its approval's findings (see :func:`~warden.tokenscan.approval.review`);
    records the approval ``--approve`` asks for."""
    loaded: Approval | ManifestError | None
    try:
        loaded = store.load(scan_result.root)
    except ManifestError as exc:
        loaded = exc
    decided = review(loaded, scan_result, approve, policy, accept)
    if decided.save is not None:
        when = utc_timestamp(time.time())
        save = decided.save
        store.save(scan_result.root, save.manifest, when, save.token_ids_digest, save.accepted)
    return decided.scan


@scan.command("tokenizer")
@click.argument("paths", nargs=-1, required=True, type=click.Path(file_okay=False))
@policy_options("tokenscan")
@format_option("text", "json", "sarif")
@option("--state-dir", type=click.Path(file_okay=False), help="Approved manifests: report drift against them.")
@option(
    "--approve",
    is_flag=True,
    help="Record the manifest and token-ids digest of every directory that scans clean (needs --state-dir).",
)
@option(
    "--accept-findings",
    is_flag=True,
    help="With --approve: approve despite findings, recording exactly those; a later new finding is not covered.",
)
@option("--output", type=click.Path(dir_okay=False), help="Write the report to this file instead of stdout.")
@click.pass_context
def tokenizer(
    ctx: click.Context,
    paths: tuple[str, ...],
    policy: str,
    output_format: str,
    state_dir: str | None,
    approve: bool,
    accept_findings: bool,
    output: str | None,
) -> None:
    """Scan tokenizer or model directories PATH... against the policy.

    Checks auto_map, code and requirements files, tokenizer_class and model_type whitelists,
    path-valued keys, links leaving the directory, dangerous config keys, chat templates
    (static analysis and a sandboxed render), file contents (pickle, zip, NPY, sentencepiece,
    JSON, size caps) and the special tokens PPO needs. Exit 0 clean, 1 a finding at or above
    the policy's fail_on severity, 3 something could not be read.
    """
    if approve and not state_dir:
        raise click.UsageError("--approve needs --state-dir DIR (where approved manifests are kept)")
    if accept_findings and not approve:
        raise click.UsageError("--accept-findings is part of an approval: give --approve too")
    loaded, policy_path = _policy(policy)
    scans = scan_paths(paths, loaded, with_manifest=bool(state_dir))
    if state_dir:
        store = ApprovalStore(state_dir)
        scans = [_compare(store, s, approve, loaded, accept_findings) for s in scans]
    fail_on = loaded.fail_severity
    if output_format == "text":
        text = render_text(scans, fail_on, policy_path)
    else:
        doc = render_json(scans, fail_on, policy_path) if output_format == "json" else render_sarif(scans, fail_on)
        text = json.dumps(doc, indent=2, sort_keys=output_format == "json")
    if output:  # read by CI and other processes: never half a report
        atomic_write_bytes(output, (text + "\n").encode("utf-8"))
    else:
        echo(text)
    ctx.exit(worst_outcome(scans, fail_on))
