"""What every sidecar shares: the :class:`Sidecar` base, its context and the runner.

A sidecar reacts to journal events (``handles`` + :meth:`Sidecar.handle`) and/or runs a
periodic :meth:`Sidecar.check`. The :class:`Runner` feeds it, keeps its cursor, serves
``/metrics`` and ``/healthz``, logs JSON to stderr and stops cleanly on SIGTERM.

Delivery is at least once: the cursor is saved after an event's side effect is done, so
a crash between the two replays that event, and handlers must be idempotent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from warden.errors import ExitCode, WardenError
from warden.errors import error_kind as error_kind  # re-exported: the runner labels failures with it
from warden.journal import JOURNAL_NAME, Event

# The result of one event or one check is an exit code: OK, VIOLATION or INCOMPLETE.
Outcome = ExitCode


class RetryLater(WardenError):
    """Raised by a handler whose side effect cannot be done now (store down).

    The runner keeps the cursor before the event and retries it after a back-off.
    """


@dataclass
class SidecarContext:
    """Everything a sidecar gets from outside; tests build one with fresh parts."""

    name: str
    state_dir: str
    run_dir: str | None = None
    policy: Any = None
    policy_path: str | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("warden"))
    clock: Callable[[], float] = time.time
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def journal_path(self) -> str | None:
        return os.path.join(self.run_dir, JOURNAL_NAME) if self.run_dir else None


P = TypeVar("P")


class Sidecar(Generic[P]):
    """Base of every sidecar, generic over its policy type ``P`` (``policy_schema``).

    Subclasses set the class attributes and override one or both hooks. ``self.policy`` is
    the context's policy when it is a ``policy_schema`` instance, else :meth:`default_policy`
    (the schema's defaults; a sidecar that cannot run without a policy file raises there).
    ``check_interval_seconds`` comes from the policy's field of that name.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    default_port: ClassVar[int]
    policy_schema: ClassVar[type[Any] | None] = None
    handles: ClassVar[frozenset[str]] = frozenset()
    needs_run_dir: ClassVar[bool] = False

    def __init__(self, ctx: SidecarContext) -> None:
        self.ctx = ctx
        schema = self.policy_schema
        self.policy: P = ctx.policy if schema is not None and isinstance(ctx.policy, schema) else self.default_policy()

    def default_policy(self) -> P:
        """The policy used when none was loaded: the schema's defaults."""
        if self.policy_schema is None:
            return None  # type: ignore[return-value]  # a sidecar without a policy
        return self.policy_schema()  # type: ignore[no-any-return]

    @property
    def check_interval_seconds(self) -> float | None:
        """Seconds between periodic checks (the policy's ``check_interval_seconds``); None: no checks."""
        value = getattr(self.policy, "check_interval_seconds", None)
        return float(value) if value is not None else None

    def handle(self, event: Event) -> Outcome:
        """Acts on one event of a type in ``handles``. Must be idempotent.

        Raises RetryLater to be called again later with the same event, WardenError for
        a failure of this event (counted, logged, then skipped).
        """
        return Outcome.OK

    def check(self) -> Outcome:
        """One round of periodic checks. Raises WardenError when it cannot complete."""
        return Outcome.OK

    def close(self) -> None:
        """Releases resources; called once when the runner stops."""


class SidecarMetrics:
    """The common ``warden_sidecar_*`` families (docs/design.md section 8), labelled ``sidecar``."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        label = ["sidecar"]
        self.up = Gauge("warden_sidecar_up", "1 while the sidecar process runs.", label, registry=registry)
        self.processed = Counter("warden_sidecar_events_processed", "Journal events handled.", label, registry=registry)
        self.lag = Gauge(
            "warden_sidecar_lag_events", "Journal events written but not yet handled.", label, registry=registry
        )
        self.errors = Counter(
            "warden_sidecar_errors", "Failures by kind (handler, check, journal).", [*label, "kind"], registry=registry
        )
        self.last_success = Gauge(
            "warden_sidecar_last_success_timestamp_seconds",
            "Unix time of the last event or check that completed.",
            label,
            registry=registry,
        )
        self.violations = Counter(
            "warden_sidecar_violations", "Events or checks that found a policy violation.", label, registry=registry
        )
        self.name = name
        for metric in (self.up, self.processed, self.lag, self.last_success, self.violations):
            metric.labels(name)
        self.up.labels(name).set(1)

    def error(self, kind: str) -> None:
        self.errors.labels(self.name, kind).inc()
