"""Follows a baseline and a candidate journal and exports how far they diverge (``warden_shadow_*``).

Both journals are read incrementally at each periodic check (the runner follows one journal
only; this sidecar handles no events of its own). A divergence is a violation of the check.
"""

from __future__ import annotations

import os

from sidecars.runtime import Outcome, Sidecar, SidecarContext
from sidecars.shadow.metrics import ShadowMetrics, reading_of
from warden.shadow.compare import compare_series
from warden.shadow.errors import ShadowConfigError
from warden.shadow.journals import FollowedJournal, journal_location
from warden.shadow.policy import ShadowPolicy

BASELINE_ENV = "WARDEN_SHADOW_BASELINE"  # the baseline when the policy names none (compose sets it)


def resolve_run(value: str | None, policy_path: str | None) -> str | None:
    """A run named in the policy; relative paths resolve against the policy file, never the cwd."""
    if not value:
        return None
    if os.path.isabs(value) or policy_path is None:
        return value
    return os.path.join(os.path.dirname(os.path.abspath(policy_path)), value)


class ShadowSidecar(Sidecar[ShadowPolicy]):
    name = "shadow"
    description = "follows a baseline and a candidate journal and exports their step-by-step divergence"
    default_port = 9468
    policy_schema = ShadowPolicy

    def __init__(self, ctx: SidecarContext) -> None:
        super().__init__(ctx)
        baseline = resolve_run(self.policy.baseline, ctx.policy_path) or os.environ.get(BASELINE_ENV) or None
        candidate = resolve_run(self.policy.candidate, ctx.policy_path) or ctx.run_dir
        if baseline is None or candidate is None:
            raise ShadowConfigError(
                f"{ctx.policy_path or 'shadow policy'}: baseline: name the reference run (or set {BASELINE_ENV})"
                + ("" if candidate else "; and candidate, or pass --run-dir")
            )
        self.baseline = FollowedJournal(journal_location(baseline))
        self.candidate = FollowedJournal(journal_location(candidate))
        self.metrics = ShadowMetrics(ctx.registry)

    def check(self) -> Outcome:
        self.baseline.poll()
        self.candidate.poll()
        comparison = compare_series(self.baseline.series, self.candidate.series, self.policy)
        self.metrics.show(reading_of(comparison, self.baseline.series, self.candidate.series))
        return Outcome.OK if comparison.ok else Outcome.VIOLATION
