"""The verl bridge as a long-lived service, run by the same :class:`~sidecars.runner.Runner` as
every sidecar: one bridge pass per poll interval as its periodic check, ``/metrics`` and
``/healthz`` from the runner, SIGTERM handled there, the common ``warden_sidecar_*`` families
labelled ``sidecar="bridge"``. The bridge writes the journal rather than following it, so it
handles no event.
"""

from __future__ import annotations

from sidecars.bridge.errors import BridgeError
from sidecars.bridge.verl import VerlBridge
from sidecars.runtime import Outcome, Sidecar, SidecarContext
from warden.logs import log_fields

DEFAULT_PORT = 9467


class BridgeService(Sidecar[None]):
    name = "bridge"
    description = "turns a verl run's logs, rollout dumps and checkpoints into Warden events"
    default_port = DEFAULT_PORT

    def __init__(self, ctx: SidecarContext, worker: VerlBridge, poll_seconds: float) -> None:
        super().__init__(ctx)
        self.worker = worker
        self.poll_seconds = poll_seconds

    @property
    def check_interval_seconds(self) -> float:
        return self.poll_seconds

    def check(self) -> Outcome:
        """One bridge pass; a failed pass is counted by the runner and retried at the next check."""
        try:
            report = self.worker.run_pass()
        except BridgeError:
            self.worker.metrics.errors.labels("pass_failed").inc()
            raise
        except Exception:  # the runner logs it and retries; the bridge's own alert counts it too
            self.worker.metrics.errors.labels("internal").inc()
            raise
        if report.emitted:
            self.ctx.log.info("pass", extra=log_fields(emitted=report.emitted, pending=len(report.pending)))
        return Outcome(report.exit_code)

    def close(self) -> None:
        self.worker.close()
