"""Tokenizer and model directory scanner: whitelists and supply-chain checks.

Layers: :mod:`.tree` (listing, links), :mod:`.sniff` / :mod:`.pickle_scan` / :mod:`.spm` /
:mod:`.gguf` (content, by bytes not names), :mod:`.chat_template` and :mod:`.template_battery`
(+ ``sandbox_child.py``: static analysis, then a battery of renders with run-time taint),
:mod:`.tokenizer_behaviour` (+ ``tokenizer_child.py``: the tokenizer loaded with ``tokenizers``
/ ``sentencepiece`` and run on a built-in corpus), :mod:`.manifest` (SHA-256 manifests,
approvals, drift) feed :mod:`.scanner`, the entry points: :mod:`.analysis` (with :mod:`.reader`,
:mod:`.declared` and :mod:`.exercise`) builds a :mod:`.snapshot` and runs the pure checks of
:mod:`.checks`, :mod:`.verdict` stores and serves the verdicts of unchanged directories, all
in the caches of a :mod:`.resources` ``ScanResources`` (:mod:`.result`: what a scan returns);
:mod:`.approval` decides what a scan adds against its approval record and what to record;
:mod:`.report` renders text / JSON / SARIF; the service and the CLI are
:mod:`sidecars.tokenscan`. Never imports torch.

The API other parts of Warden call::

    policy = load_tokenscan_policy("policies/tokenscan.yaml")    # or default_policy()
    result = scan_directory("/models/tok", policy)
    result.outcome(policy.fail_severity)   # 0 clean, 1 violation, 3 incomplete
    result.findings                        # [Finding(id, severity, path, message, fix, ...)]
"""

from warden.tokenscan.findings import RULES, Finding, Severity
from warden.tokenscan.manifest import ApprovalStore, Manifest, build_manifest
from warden.tokenscan.policy import TokenscanPolicy, coerce_policy, default_policy, load_tokenscan_policy
from warden.tokenscan.scanner import DirectoryScan, scan_directory, scan_paths, worst_outcome

__all__ = [
    "RULES",
    "ApprovalStore",
    "DirectoryScan",
    "Finding",
    "Manifest",
    "Severity",
    "TokenscanPolicy",
    "build_manifest",
    "coerce_policy",
    "default_policy",
    "load_tokenscan_policy",
    "scan_directory",
    "scan_paths",
    "worst_outcome",
]
