"""Who acts for a run when several nodes run a signer (or an archiver) on one run directory.

A stack runs next to each training node and the run directory is on shared storage: every
node's signer follows the same journal and checkpoint root, every node's archiver the same
snapshots. Exactly one of each acts (writes ``.sig`` files, puts objects); the others stand by
and take over when the owner stops renewing. The owner is whoever holds the run's *lease*, a
small file on the shared storage, ``<dir>/.warden-lease-<scope>.json``, with a *fencing token*:
a counter that grows by one at every change of owner.

Protocol (all I/O through :mod:`warden.safeio`: descriptor-relative, no link followed, capped
reads, atomic replacement, exclusive creation):

- *claim*: a standby that finds the lease free claims token ``T+1`` by creating
  ``<dir>/.warden-lease-<scope>.claims/<T+1>``
  exclusively; of several claimants exactly one creates it. It then writes the lease file
  (holder, token, ``expires_at = now + duration``) and holds the lease. *Free* is judged by the
  standby's own monotonic clock, never by a time read from the storage alone: one state (record and
  claims) unchanged for ``duration + skew`` since it first saw it, or a record past ``expires_at``
  plus the skew that stayed so for ``act_margin_seconds``; no lease file while a claim exists is a
  pending claim, not a free lease;
- *renew*: the holder rewrites the lease file every ``renew_seconds`` while its own clock is
  before ``expires_at - act_margin`` and the file still names it with its token; otherwise it
  steps down (a lease that ran out is never renewed: a standby may be taking it over);
- *act*: right before a side effect (a ``.sig`` written, an object put) the holder reads the
  lease file again and acts only if it names this holder with this token and its own clock is
  before ``expires_at - act_margin`` (:func:`may_act`). A standby's first act comes after
  ``expires_at + skew`` by its clock, which is after ``expires_at`` by the holder's; so with
  clocks within the skew bound the acting windows of two processes never overlap.
- *page*: a lease file that does not parse (or is a link, FIFO, oversized file), a token lower
  than one already seen (going backwards), an expiry later than any holder could have written,
  or a lease naming someone else while we hold ours and renewed it in time (or our own record with
  an expiry we did not write); a claim above our token while ours is in time, or an unreadable,
  future or abandoned claim, or an unusable claims path; the token range exhausted; a side effect
  that outlasted its lease (below): each is counted in ``warden_<scope>_lease_alarms_total{reason}``
  (alert ``WardenLeaseForged``); the holder steps down on a stolen lease rather than fight for it.

The fencing is checked by the actor, not enforced by the storage (a filesystem has no
conditional write): a process paused between its last check and its write for longer than
``act_margin_seconds`` can still write once after its lease ran out; the check right after the
write (:meth:`LeaseKeeper.fence` returns it) then finds its clock past that lease's expiry or the
lease passed on, which pages (``late_write``). Lease records are not authenticated: a plausible
record rewritten by whoever writes the directory looks live (alert ``WardenLeaseVacant``).
docs/threat-model.md states the invariant, docs/deploy.md the settings.

:func:`decide` and :func:`may_act` are the whole decision, pure functions of the clock reading,
the settings, what this process remembers (:class:`View`) and what it read (:class:`Observation`);
:class:`LeaseFile` is the I/O edge and :class:`LeaseKeeper` ties them to a clock and a thread.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from warden.errors import ConfigError, TryAgainLater, WardenError
from warden.journal import Cursor, Event, JournalReader
from warden.logs import log_fields
from warden.safeio import UnsafeFile, atomic_write_at, create_new_at, open_dirs_below, open_root, read_regular

LEASE_VERSION = 1
MAX_LEASE_BYTES = 4096
MAX_CLAIMS_LISTED = 100_000
LEASE_PREFIX = ".warden-lease-"
HOLDER_ENV = "WARDEN_LEASE_HOLDER"
ALARM_REASONS = (
    "malformed",
    "token_backwards",
    "stolen",
    "expiry_too_far",
    "missing",
    "tampered",
    "claim",
    "claims_unusable",
    "exhausted",
    "late_write",
)
"""Why a lease pages: content that does not parse (or no regular file); a token below one seen
before; an ``expires_at`` later than now + duration + skew; another holder (or token) while ours
is held and in time; our lease file removed while held; our write swapped right after it was made,
or our own record found with an expiry we did not write; a claim above our token while ours is in
time, or a claim that is unreadable, from the future, or pending (no lease file written for it)
longer than ``renew_seconds``; the claims directory unusable (a file, FIFO or link there, any
OSError); the next token out of range; a side effect that finished after the lease it was checked
under ran out or changed (a holder paused between check and write)."""
MAX_TOKEN = 10**18 - 1
"""The highest token a record carries (and a claim name spells: 1 to 18 digits)."""
_TOKEN_NAME = re.compile(r"[1-9][0-9]{0,17}\Z")
_SCOPE = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


class LeaseError(WardenError):
    """The lease could not be read or written (the storage failed)."""


class LeaseMalformed(LeaseError):
    """Lease content that is not a lease record."""


class LeaseLost(TryAgainLater):
    """A side effect refused because this process does not hold the lease with the current token."""


@dataclass(frozen=True)
class LeaseSettings:
    """The ``lease:`` section of the signer and archiver policies (policies/signer.yaml, archiver.yaml).

    ``enabled``: take part in the lease (every node of a multi-node run must); ``duration_seconds``:
    how long a written lease is valid; ``renew_seconds``: how often the holder rewrites it (and a
    standby looks); ``max_clock_skew_seconds``: the bound on the difference between two nodes'
    clocks (NTP); ``act_margin_seconds``: the holder stops acting this long before its lease runs
    out (longer than one side effect takes); ``holder``: this process's name in the lease (default
    ``$WARDEN_LEASE_HOLDER``, else ``<hostname>:<pid>``); ``directory``: where the lease lies
    (default: the run directory).
    """

    enabled: bool = False
    duration_seconds: float = 15.0
    renew_seconds: float = 3.0
    max_clock_skew_seconds: float = 2.0
    act_margin_seconds: float = 1.0
    holder: str | None = None
    directory: str | None = None

    def __post_init__(self) -> None:
        numbers = ("duration_seconds", "renew_seconds", "max_clock_skew_seconds", "act_margin_seconds")
        for name in numbers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0")
        if self.renew_seconds <= 0 or self.act_margin_seconds <= 0:
            raise ValueError("renew_seconds and act_margin_seconds: must be > 0")
        if self.duration_seconds < 2 * self.renew_seconds + self.act_margin_seconds:
            raise ValueError(
                "duration_seconds: must be at least 2 x renew_seconds + act_margin_seconds "
                "(a holder gets a second chance to renew before it must stop acting)"
            )
        if self.holder is not None and not _plain_text(self.holder):
            raise ValueError("holder: 1-200 printable characters")

    def holder_id(self) -> str:
        """``holder``, else ``$WARDEN_LEASE_HOLDER``, else ``<hostname>:<pid>``; ConfigError naming the
        source when the name is not 1-200 printable characters (no control character, no line or
        paragraph separator): the lease record would refuse it."""
        if self.holder:
            name, source = self.holder, "lease.holder"
        elif os.environ.get(HOLDER_ENV):
            name, source = os.environ[HOLDER_ENV], HOLDER_ENV
        else:
            name, source = f"{socket.gethostname()}:{os.getpid()}", "the host name"
        if not _plain_text(name):
            raise ConfigError(f"{source}: the lease holder must be 1-200 printable characters (got {name[:40]!r})")
        return name


def _plain_text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200 and value.isprintable()


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class LeaseRecord:
    """The content of a lease file (and of a claim): who holds which token until when."""

    scope: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float

    def to_data(self) -> dict[str, Any]:
        return {
            "version": LEASE_VERSION,
            "scope": self.scope,
            "holder": self.holder,
            "token": self.token,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_data(cls, data: object) -> LeaseRecord:
        """Parses strictly: exactly these keys, of these types; LeaseMalformed otherwise."""
        keys = {"version", "scope", "holder", "token", "acquired_at", "expires_at"}
        if not isinstance(data, dict) or set(data) != keys or data["version"] != LEASE_VERSION:
            raise LeaseMalformed("not a version-1 lease record with exactly the expected keys")
        token = data["token"]
        if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token < 10**18:
            raise LeaseMalformed("token: not a positive integer")
        if not (isinstance(data["scope"], str) and _SCOPE.match(data["scope"]) and _plain_text(data["holder"])):
            raise LeaseMalformed("scope or holder: not plain names")
        if not (_finite(data["acquired_at"]) and _finite(data["expires_at"])):
            raise LeaseMalformed("acquired_at / expires_at: not finite numbers")
        return cls(data["scope"], data["holder"], token, float(data["acquired_at"]), float(data["expires_at"]))

    def encode(self) -> bytes:
        return json.dumps(self.to_data(), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, payload: bytes) -> LeaseRecord:
        try:
            data = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise LeaseMalformed("not JSON") from None
        return cls.from_data(data)


@dataclass(frozen=True)
class Observation:
    """What one read of the shared storage found.

    ``record``: the lease file's record (None: no file, or ``problem``); ``problem``: why the lease
    file is not a record (malformed, link, not regular, too large), or None; ``claim_token``: the
    highest claimed token (0: none); ``claim``: that claim's record (None: unreadable or not read);
    ``claims_problem``: why the claims directory could not be listed (a file, FIFO or link at its
    path, any OSError but its absence), or None.
    """

    record: LeaseRecord | None
    problem: str | None = None
    claim_token: int = 0
    claim: LeaseRecord | None = None
    claims_problem: str | None = None


@dataclass(frozen=True)
class View:
    """What a process remembers between reads.

    ``token``/``expires_at``: the lease it holds (token None: it holds none); ``claimed``: the claim
    it made and has not yet turned into a lease file; ``highest``: the highest token seen in a sound
    lease file; ``odd_since``: since when the lease file is unusable (malformed, forged), by our
    clock; ``alarm``: the alarm raised at the last read (None when that read was sound).
    """

    token: int | None = None
    expires_at: float = 0.0
    claimed: LeaseRecord | None = None
    highest: int = 0
    odd_since: float | None = None
    alarm: str | None = None
    acquired_from: str | None = None
    """At the last acquisition: the holder of the lease file it replaced (None: there was none)."""
    seen: tuple[object, ...] | None = None
    """What the last read found (lease record or problem, highest claim and its record)."""
    seen_since: float = 0.0
    """Since when (this process's local, monotonic clock) every read found ``seen`` unchanged."""


@dataclass(frozen=True)
class Decision:
    """What to do after a read: the next view, a claim to create or a record to write, and what
    happened (``change``: acquired, renewed, claimed, lost, standby, holding) and the new alarm
    (``alarm``, set only when the read raised one the previous read did not)."""

    view: View
    change: str
    claim: LeaseRecord | None = None
    write: LeaseRecord | None = None
    alarm: str | None = None


def _alarm_of(now: float, me: str, settings: LeaseSettings, view: View, obs: Observation) -> str | None:
    rec = obs.record
    held_in_time = view.token is not None and now < view.expires_at
    if obs.problem is not None:
        return "tampered" if obs.problem == "swapped" else "malformed"
    if obs.claims_problem is not None:
        return "claims_unusable"
    if held_in_time and view.token is not None and obs.claim_token > view.token:
        return "claim"  # an honest claimant claims only after our expiry + skew
    if rec is None:
        return "missing" if held_in_time else None
    if rec.token < view.highest:
        return "token_backwards"
    if rec.expires_at > now + settings.duration_seconds + settings.max_clock_skew_seconds:
        return "expiry_too_far"
    if held_in_time and (rec.holder, rec.token) != (me, view.token):
        return "stolen"
    if held_in_time and rec.expires_at != view.expires_at:
        return "tampered"  # our own record, with an expiry we did not write
    return None


def _seen_key(obs: Observation) -> tuple[object, ...]:
    return (obs.record, obs.problem, obs.claim_token, obs.claim, obs.claims_problem)


def _pending_alarm(now: float, local: float, settings: LeaseSettings, view: View, obs: Observation) -> str | None:
    """A standby's look at a claim above the lease file's token: one no honest claimant leaves."""
    file_token = obs.record.token if obs.record is not None else 0
    if view.token is not None or view.claimed is not None or obs.claim_token <= file_token:
        return None
    claim = obs.claim
    if claim is None or claim.token != obs.claim_token:
        return "claim"  # unreadable (garbage, a FIFO, a directory, a link)
    if claim.acquired_at > now + settings.max_clock_skew_seconds:
        return "claim"  # from the future
    if local - view.seen_since > settings.renew_seconds and view.seen == _seen_key(obs):
        return "claim"  # a claimant writes its lease at once, or gives its claim up after renew_seconds
    return None


def decide(
    now: float,
    me: str,
    scope: str,
    settings: LeaseSettings,
    view: View,
    obs: Observation,
    local: float | None = None,
) -> Decision:
    """The next step of process ``me`` after reading ``obs`` at its clock reading ``now`` (Unix
    time, compared with the lease's times) and ``local`` (its monotonic clock, default ``now``:
    how long it has seen one state, never compared with anything read)."""
    local = now if local is None else local
    alarm = _alarm_of(now, me, settings, view, obs) or _pending_alarm(now, local, settings, view, obs)
    seen = _seen_key(obs)
    seen_since = view.seen_since if view.seen == seen else local
    unchanged = local - seen_since
    rec = obs.record if alarm is None else None
    new_alarm = alarm if alarm is not None and alarm != view.alarm else None
    odd_since = (view.odd_since if view.odd_since is not None else local) if alarm is not None else None
    highest = max(view.highest, rec.token if rec is not None else 0)
    base = replace(view, highest=highest, odd_since=odd_since, alarm=alarm, seen=seen, seen_since=seen_since)
    margin_end = view.expires_at - settings.act_margin_seconds

    def mine(token: int, acquired_at: float) -> LeaseRecord:
        return LeaseRecord(scope, me, token, acquired_at, now + settings.duration_seconds)

    if view.token is not None:
        ours = rec is not None and (rec.holder, rec.token) == (me, view.token)
        repairable = alarm in ("malformed", "missing", "tampered") and obs.claim_token <= view.token
        if (ours or repairable) and now < margin_end and obs.claim_token <= view.token:
            acquired = rec.acquired_at if rec is not None and ours else now
            record = mine(view.token, acquired)
            return Decision(replace(base, expires_at=record.expires_at), "renewed", write=record, alarm=new_alarm)
        return Decision(replace(base, token=None, expires_at=0.0, claimed=None), "lost", alarm=new_alarm)

    if view.claimed is not None:
        claimed = view.claimed
        # an unusable lease file does not stop it: the claim was made after it had been so for the lease time
        raw = obs.record
        overtaken = obs.claim_token > claimed.token or (raw is not None and raw.token >= claimed.token)
        if overtaken or now - claimed.acquired_at > settings.renew_seconds:
            return Decision(replace(base, claimed=None), "standby", alarm=new_alarm)
        record = mine(claimed.token, claimed.acquired_at)
        view_after = replace(base, token=claimed.token, expires_at=record.expires_at, claimed=None)
        return Decision(view_after, "acquired", write=record, alarm=new_alarm)

    # A standby trusts no time read from the storage (anyone who writes it wrote them): the lease is
    # free once one state stayed unchanged for the lease time by its own clock, or once the record
    # says it ran out and stayed so for the act margin (a holder that checked before the change has
    # finished its side effect). No lease file while a claim exists is a pending claim, not free.
    skew = settings.max_clock_skew_seconds
    wait = settings.duration_seconds + skew
    file_token = rec.token if rec is not None else 0
    if obs.claims_problem is not None:
        free = False  # no claim can be made (nor seen) there: it pages until repaired
    elif alarm is not None:
        free = odd_since is not None and local > odd_since + wait
    elif obs.claim_token > file_token:  # someone claimed and has not written the lease yet
        free = unchanged > wait
    elif rec is None:
        free = True  # nothing was ever claimed here
    else:
        ran_out = now > rec.expires_at + skew and unchanged >= settings.act_margin_seconds
        free = unchanged > wait or ran_out
    if not free:
        return Decision(base, "standby", alarm=new_alarm)
    token = max(file_token, obs.record.token if obs.record is not None else 0, obs.claim_token, view.highest) + 1
    if token > MAX_TOKEN:  # a planted record at the top of the range: nobody can hold a next token
        exhausted = "exhausted" if view.alarm != "exhausted" else None
        return Decision(replace(base, alarm="exhausted"), "standby", alarm=new_alarm or exhausted)
    claim = LeaseRecord(scope, me, token, now, now + settings.duration_seconds)
    replaced = obs.record.holder if obs.record is not None else None
    return Decision(replace(base, claimed=claim, acquired_from=replaced), "claimed", claim=claim, alarm=new_alarm)


def may_act(now: float, me: str, settings: LeaseSettings, view: View, record: LeaseRecord | None) -> bool:
    """Whether ``me`` may do a side effect now: it holds a lease, the lease file just read names it
    with that token, and its own clock is before the lease's end minus the act margin."""
    return (
        view.token is not None
        and record is not None
        and record.holder == me
        and record.token == view.token
        and record.expires_at == view.expires_at
        and now < view.expires_at - settings.act_margin_seconds
    )


# -- the I/O edge ---------------------------------------------------------------------------------
class LeaseIO(Protocol):
    """The storage the keeper reads and writes (:class:`LeaseFile`)."""

    def read(self, claims: bool = True) -> Observation: ...

    def claim(self, record: LeaseRecord) -> bool: ...

    def write(self, record: LeaseRecord) -> None: ...


class LeaseFile:
    """The lease of ``scope`` in ``directory`` (the operator's choice, typically the run directory):
    ``.warden-lease-<scope>.json`` and the claims in ``.warden-lease-<scope>.claims/``."""

    def __init__(self, directory: str, scope: str) -> None:
        if not _SCOPE.match(scope):
            raise ValueError(f"not a lease scope: {scope!r}")
        self.directory = directory
        self.name = f"{LEASE_PREFIX}{scope}.json"
        self.claims = f"{LEASE_PREFIX}{scope}.claims"

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def read(self, claims: bool = True) -> Observation:
        """The lease file's record (or what is wrong with it) and, with ``claims``, the highest claim."""
        root = open_root(self.directory)
        try:
            record, problem = _read_record(self.name, root)
            if not claims:
                return Observation(record, problem)
            try:
                token, claim = self._highest_claim()
            except OSError as exc:  # UnsafeFile included: a link, a file or FIFO there, EIO
                return Observation(record, problem, claims_problem=_os_problem(exc))
            return Observation(record, problem, token, claim)
        finally:
            os.close(root)

    def _highest_claim(self) -> tuple[int, LeaseRecord | None]:
        try:
            fd = open_dirs_below(self.directory, [self.claims])
        except FileNotFoundError:
            return 0, None
        try:
            highest = 0
            with os.scandir(fd) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_CLAIMS_LISTED:
                        break
                    if _TOKEN_NAME.match(entry.name):
                        highest = max(highest, int(entry.name))
            if not highest:
                return 0, None
            claim, _problem = _read_record(str(highest), fd)
            return highest, claim
        finally:
            os.close(fd)

    def claim(self, record: LeaseRecord) -> bool:
        """Creates the claim of ``record.token`` exclusively; False when it exists already."""
        fd = open_dirs_below(self.directory, [self.claims], create=True)
        try:
            return create_new_at(fd, str(record.token), record.encode())
        finally:
            os.close(fd)

    def write(self, record: LeaseRecord) -> None:
        """Replaces the lease file atomically (UnsafeFile ``swapped`` when it was swapped right after)."""
        root = open_root(self.directory)
        try:
            atomic_write_at(root, self.name, record.encode())
        finally:
            os.close(root)


def _os_problem(exc: OSError) -> str:
    if isinstance(exc, UnsafeFile):
        return f"unsafe: {exc.reason}"
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def _read_record(name: str, dir_fd: int) -> tuple[LeaseRecord | None, str | None]:
    try:
        return LeaseRecord.decode(read_regular(name, MAX_LEASE_BYTES, dir_fd=dir_fd)), None
    except FileNotFoundError:
        return None, None
    except UnsafeFile as exc:
        return None, exc.reason
    except LeaseMalformed as exc:
        return None, f"malformed: {exc}"
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
            return None, "not_regular"
        raise


# -- metrics and the keeper -----------------------------------------------------------------------
class LeaseMetrics:
    """``warden_<scope>_lease_*``: enabled (0/1), held (0/1, computed at each scrape), token,
    takeovers_total, alarms_total{reason}."""

    def __init__(self, registry: CollectorRegistry, scope: str) -> None:
        self.enabled = Gauge(
            f"warden_{scope}_lease_enabled",
            f"1 when this {scope} takes part in a run lease (lease.enabled): WardenLeaseVacant looks only at these.",
            registry=registry,
        )
        self.held = Gauge(
            f"warden_{scope}_lease_held", f"1 while this {scope} holds the run's lease.", registry=registry
        )
        self.token = Gauge(
            f"warden_{scope}_lease_token",
            "Fencing token of the lease held now, or last seen (0: none).",
            registry=registry,
        )
        self.takeovers = Counter(
            f"warden_{scope}_lease_takeovers",
            "Leases this process acquired that another holder had held (a takeover).",
            registry=registry,
        )
        self.alarms = Counter(
            f"warden_{scope}_lease_alarms",
            "Lease files or claims found forged or stolen, or a write made after the lease ran out, by reason "
            "(malformed, token_backwards, stolen, expiry_too_far, missing, tampered, claim, claims_unusable, "
            "exhausted, late_write): each pages (WardenLeaseForged).",
            ["reason"],
            registry=registry,
        )
        for reason in ALARM_REASONS:
            self.alarms.labels(reason)


@dataclass
class LeaseKeeper:
    """Holds (or waits for) the lease of ``scope`` for process ``me``: :meth:`tick` is one read and
    decision (a thread runs it every ``renew_seconds`` after :meth:`start`), :meth:`guard` the check
    right before a side effect. ``clock`` is Unix time (compared across nodes); ``local_clock``
    measures how long a state was seen (monotonic; default ``clock``, for simulated clocks)."""

    io: LeaseIO
    scope: str
    me: str
    settings: LeaseSettings
    clock: Callable[[], float]
    metrics: LeaseMetrics | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("warden"))
    view: View = field(default_factory=View)
    local_clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.metrics is not None:
            # computed at each scrape from the last view and the clock: it drops when the lease runs
            # out even while every read of the storage fails
            self.metrics.held.set_function(lambda: 1.0 if self.held() is not None else 0.0)

    def _local(self) -> float:
        return (self.local_clock or self.clock)()

    def held(self) -> int | None:
        """The token held now (by this process's last read and its clock), or None (no lock: a
        scrape never waits on a tick blocked in the storage)."""
        view = self.view
        if view.token is None or self.clock() >= view.expires_at - self.settings.act_margin_seconds:
            return None
        return view.token

    def tick(self) -> Decision:
        """Reads the storage and does what :func:`decide` says (a claim is followed by its lease at once)."""
        with self._lock:
            decision = self._step()
            if decision.change == "claimed":
                decision = self._step()
            return decision

    def _step(self) -> Decision:
        obs = self.io.read()
        decision = decide(self.clock(), self.me, self.scope, self.settings, self.view, obs, self._local())
        view = decision.view
        if decision.claim is not None:
            try:
                made = self.io.claim(decision.claim)
            except UnsafeFile as exc:  # a link or file planted at the claims path since the read
                problem = _os_problem(exc)
                alarm = "claims_unusable" if self.view.alarm != "claims_unusable" else None
                view = replace(view, claimed=None, alarm="claims_unusable")
                decision = replace(decision, change="standby", alarm=decision.alarm or alarm)
                obs = replace(obs, claims_problem=problem)
                made = True
            if not made:
                view = replace(view, claimed=None)
                decision = replace(decision, change="standby")
        if decision.write is not None:
            try:
                self.io.write(decision.write)
            except UnsafeFile:
                view = replace(view, token=None, expires_at=0.0, alarm="tampered")
                decision = replace(decision, change="lost", alarm="tampered" if self.view.alarm != "tampered" else None)
            except OSError:
                # the write may or may not have landed: hold nothing (the lease then runs out)
                self._record(replace(decision, change="lost"), replace(view, token=None, expires_at=0.0), obs)
                raise
        self._record(decision, view, obs)
        return replace(decision, view=view)

    def _record(self, decision: Decision, view: View, obs: Observation) -> None:
        before, self.view = self.view, view
        fields = log_fields(scope=self.scope, holder=self.me, token=view.token or before.token)
        if decision.alarm is not None:
            if self.metrics is not None:
                self.metrics.alarms.labels(decision.alarm).inc()
            found: object = obs.record.to_data() if obs.record is not None else obs.problem
            if decision.alarm in ("claim", "claims_unusable"):
                found = obs.claims_problem or (
                    obs.claim.to_data() if obs.claim else f"unreadable claim {obs.claim_token}"
                )
            self.log.error(
                f"lease {self.scope}: forged or stolen ({decision.alarm}): found {str(found)[:300]}",
                extra=log_fields(scope=self.scope, holder=self.me, reason=decision.alarm),
            )
        if decision.change == "acquired":
            took_over = view.acquired_from is not None and view.acquired_from != self.me
            if took_over and self.metrics is not None:
                self.metrics.takeovers.inc()
            self.log.info(
                f"lease {self.scope} acquired" + (f" from {view.acquired_from}" if took_over else ""), extra=fields
            )
        elif decision.change == "lost" and before.token is not None:
            self.log.warning(f"lease {self.scope} lost: standing by", extra=fields)
        if self.metrics is not None:
            self.metrics.token.set(view.token or view.highest)

    def guard(self) -> bool:
        """True when a side effect may happen now (:func:`may_act` on a fresh read of the lease file).

        A read that contradicts what this process holds runs a :meth:`tick` (which pages and steps down).
        :meth:`fence` is the same check returning the after-write check of the side effect."""
        return self._check() is not None

    def _check(self) -> tuple[int, float] | None:
        with self._lock:
            view = self.view
            if view.token is None:
                return None
            try:
                obs = self.io.read(claims=False)
            except OSError:
                return None
            if may_act(self.clock(), self.me, self.settings, view, obs.record):
                return view.token, view.expires_at
            with contextlib.suppress(OSError, LeaseError):
                self.tick()
            return None

    def fence(self) -> Callable[[], None]:
        """:meth:`guard`, raising LeaseLost when it says no; returns the check to run right after the
        side effect (:meth:`after_write` for the token and expiry this check passed under)."""
        checked = self._check()
        if checked is None:
            raise LeaseLost(f"{self.scope}: not holding the run's lease with the current token; not acting")
        token, expires_at = checked

        def confirm() -> None:
            self.after_write(token, expires_at)

        return confirm

    def after_write(self, token: int, expires_at: float) -> bool:
        """Right after a side effect a check passed under lease ``token`` (local expiry ``expires_at``):
        False, and a ``late_write`` alarm, when it finished at or after that expiry by this process's
        clock, or the lease file no longer names this holder with that token (a pause between check
        and write: another node may have acted too)."""
        late = self.clock() >= expires_at
        changed = False
        if not late:
            try:
                record = self.io.read(claims=False).record
            except OSError:
                record = None
            changed = record is None or (record.holder, record.token) != (self.me, token)
        if not (late or changed):
            return True
        if self.metrics is not None:
            self.metrics.alarms.labels("late_write").inc()
        self.log.error(
            f"lease {self.scope}: a side effect finished after the lease it was checked under "
            + ("ran out" if late else "passed on")
            + f" (token {token}): another node may have acted too",
            extra=log_fields(scope=self.scope, holder=self.me, token=token, reason="late_write"),
        )
        return False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"lease-{self.scope}", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                self.tick()
            except (OSError, LeaseError) as exc:  # the storage failed: the lease runs out on its own
                self.log.warning(f"lease {self.scope}: {exc}", extra=log_fields(scope=self.scope))
            except Exception:  # a bug must not end renewals for good; held() still ends with the clock
                self.log.exception(f"lease {self.scope}: tick crashed", extra=log_fields(scope=self.scope))
            if self._stop.wait(self.settings.renew_seconds):
                return

    def close(self, release: bool = True) -> None:
        """Stops the thread; with ``release``, ends a held lease now so a standby takes over after the skew."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            view = self.view
            if not release or view.token is None:
                return
            self.view = replace(view, token=None, expires_at=0.0)
            with contextlib.suppress(OSError, LeaseError):
                obs = self.io.read(claims=False)
                if obs.record is not None and (obs.record.holder, obs.record.token) == (self.me, view.token):
                    now = self.clock()
                    self.io.write(replace(obs.record, expires_at=now))


def keeper_for(
    settings: LeaseSettings,
    scope: str,
    run_dir: str | None,
    *,
    clock: Callable[[], float],
    registry: CollectorRegistry,
    log: logging.Logger,
    local_clock: Callable[[], float] | None = None,
) -> LeaseKeeper | None:
    """The keeper a sidecar uses (None when ``settings.enabled`` is false); its metrics are registered
    either way. The lease lies in ``settings.directory``, else ``run_dir`` (ConfigError without either,
    or with a holder name the lease record refuses). ``local_clock``: see :class:`LeaseKeeper`;
    default ``time.monotonic`` when ``clock`` is ``time.time`` (a simulated clock measures its own
    durations)."""
    metrics = LeaseMetrics(registry, scope)
    if not settings.enabled:
        return None
    metrics.enabled.set(1)
    directory = settings.directory or run_dir
    if not directory:
        raise ConfigError(f"{scope} policy: lease.enabled needs a run directory (--run-dir) or lease.directory")
    holder = settings.holder_id()
    if local_clock is None and clock is time.time:
        local_clock = time.monotonic
    return LeaseKeeper(
        LeaseFile(directory, scope), scope, holder, settings, clock, metrics, log, local_clock=local_clock
    )


class LeaseGate:
    """A sidecar's side of its keeper: whether it acts now, and the catch-up on each new token.

    A standby handles no event (the runner's cursor moves on) and runs no check. When this process
    comes to hold a token it has not caught up under, ``on_acquire`` runs (the archiver forgets what
    it spooled before: the store is the truth now), then every event of the journal up to the last
    one the runner delivered is handled again through ``handle`` (handlers are idempotent: what the
    previous owner did is found done), so nothing the previous owner left undone is lost. A
    TryAgainLater during the catch-up (the store down) leaves it to be run again at the next call.
    ``trusted()`` is False while others could write the journal (then nothing is replayed).
    """

    def __init__(
        self,
        keeper: LeaseKeeper,
        journal_path: str | None,
        handles: frozenset[str],
        handle: Callable[[Event], object],
        *,
        on_acquire: Callable[[], None] = lambda: None,
        trusted: Callable[[], bool] = lambda: True,
        seen_seq: int = 0,
        log: logging.Logger | None = None,
    ) -> None:
        self.keeper, self.journal_path, self.handles = keeper, journal_path, handles
        self._handle, self._on_acquire, self._trusted = handle, on_acquire, trusted
        self._seen = seen_seq
        self._caught_up: int | None = None
        self._log = log or keeper.log
        self.replayed = 0

    def seen(self, seq: int) -> None:
        """The runner delivered event ``seq`` (acted on or not)."""
        self._seen = max(self._seen, seq)

    def acting(self, before_seq: int | None = None) -> bool:
        """True when this process holds the lease and has caught up under its token. ``before_seq``:
        the event being handled now (the catch-up replays the events before it); None in a check."""
        token = self.keeper.held()
        if token is None:
            return False
        if token != self._caught_up:
            upto = before_seq - 1 if before_seq is not None else self._seen
            self._on_acquire()
            self._replay(upto)
            self._caught_up = token
        return True

    def _replay(self, upto: int) -> None:
        if not self.journal_path or upto <= 0 or not self._trusted():
            return
        reader = JournalReader(self.journal_path, Cursor())
        for event, _cursor in reader.read_available():
            if event.seq > upto:
                break
            if event.type not in self.handles:
                continue
            try:
                self._handle(event)
            except TryAgainLater:
                raise
            except WardenError as exc:
                self._log.error(
                    f"catch-up after taking the lease: {exc}",
                    extra=log_fields(scope=self.keeper.scope, seq=event.seq, type=event.type),
                )
            self.replayed += 1
        self._log.info(
            f"lease {self.keeper.scope}: caught up on the journal up to seq {upto}",
            extra=log_fields(scope=self.keeper.scope, replayed=self.replayed),
        )
