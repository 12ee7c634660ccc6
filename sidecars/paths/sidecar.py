"""The ``paths`` sidecar: watches the health of the paths in policies/paths.yaml.

It reads no journal. :meth:`PathsSidecar.check` is one non-blocking round of the
scheduler (collect finished probes, mark overdue ones stuck, start due ones); the runner
calls it every ``check_interval_seconds`` (0.2 s by default, so a hang is reported
within deadline + 0.2 s plus the runner's loop period), while each path keeps its own
probe interval. The very first call runs a whole blocking round instead (bounded by the
longest deadline), so ``warden sidecar run paths --once`` reports every path and exits
0/1/3. ``/metrics`` renders the last verdicts from memory and never waits for a probe.
"""

from __future__ import annotations

from sidecars.paths.metrics import PathMetrics
from sidecars.runtime import Outcome, Sidecar, SidecarContext
from warden.errors import ConfigError, IncompleteError
from warden.logs import log_fields
from warden.paths.policy import PathsPolicy
from warden.paths.scheduler import PathState, PathWatcher


class ProbeIncomplete(IncompleteError):
    """A probe process could not be started or died without a result (exit code 3)."""


class PathsSidecar(Sidecar[PathsPolicy]):
    name = "paths"
    description = "probes data/model/checkpoint paths in child processes with deadlines (stuck, full, read-only)"
    default_port = 9465
    policy_schema = PathsPolicy
    handles = frozenset()
    needs_run_dir = False

    def default_policy(self) -> PathsPolicy:
        raise ConfigError("the paths sidecar needs a policy: pass --policy FILE (see policies/paths.yaml)")

    def __init__(self, ctx: SidecarContext) -> None:
        super().__init__(ctx)
        self.metrics = PathMetrics(ctx.registry, [spec.name for spec in self.policy.paths])
        self.watcher = PathWatcher(self.policy.paths, wall=ctx.clock, on_verdict=self._on_verdict)
        self._first_round = True
        self._last: dict[str, tuple[bool, str | None]] = {}

    def check(self) -> Outcome:
        if self._first_round:
            self._first_round = False
            verdicts = list(self.watcher.run_round(stop=self.ctx.stop).values())
        else:
            verdicts = self.watcher.tick()
        self.metrics.tick(self.watcher.states, self.watcher.live_probes())
        broken = [st for st in verdicts if st.incomplete]
        if broken:
            raise ProbeIncomplete("; ".join(st.message for st in broken))
        if any(not st.healthy for st in verdicts if st.checked):
            return Outcome.VIOLATION
        return Outcome.OK

    def _on_verdict(self, st: PathState) -> None:
        self.metrics.update(st)
        now = (st.healthy, st.reason)
        before = self._last.get(st.name)
        self._last[st.name] = now
        if now == before:
            return
        fields = log_fields(sidecar=self.name, path=st.name, reason=st.reason, stuck=st.stuck, errno=st.errno_name)
        if st.healthy:
            self.ctx.log.info(f"path healthy: {st.message}", extra=fields)
        else:
            self.ctx.log.warning(f"path unhealthy: {st.message}", extra=fields)

    def close(self) -> None:
        self.watcher.close()
