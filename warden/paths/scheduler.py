"""The parent side: runs probe children with deadlines and keeps each path's last verdict.

Contracts (issue 8):

* Probes run in a fresh child process (``python -I -S probe.py SPEC``, started with
  ``subprocess``, i.e. fork+exec, safe beside the HTTP threads); this process never
  stats, opens or resolves a watched path. Mount information comes from parsing
  ``/proc/self/mountinfo`` text (:mod:`warden.paths.mountinfo`).
* At most one probe per path is alive. When its deadline passes the path is marked stuck
  at once, the child is sent SIGKILL (a child in uninterruptible sleep ignores it until
  its system call returns) and abandoned: it is only ever reaped with ``waitpid(WNOHANG)``
  (``Popen.poll``), and no new probe starts for that path until it has ended. A
  permanent hang therefore costs one process per path, never more.
* :meth:`PathWatcher.tick` never blocks: it collects finished children, marks overdue
  ones stuck and starts probes that are due. :meth:`PathWatcher.run_round` is the
  blocking "one round" used by ``warden paths check``, ``--once`` and preflight.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from warden.paths import probe
from warden.paths.mountinfo import Mount, find_mount, lexical_abspath, mount_fields, read_mountinfo
from warden.paths.policy import PathSpec

PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
PROBE_PYTHON_ENV = "WARDEN_PROBE_PYTHON"  # the interpreter of probe children; default: this one


def probe_python() -> str:
    """``$WARDEN_PROBE_PYTHON`` or ``sys.executable``. probe.py is stdlib-only, so any Python 3.8+
    works: useful when the sidecar runs as a user that cannot execute this interpreter's path."""
    return os.environ.get(PROBE_PYTHON_ENV) or sys.executable


MAX_OUTPUT = 64 * 1024  # bytes kept from a child's output

ADVICE: dict[str, str] = {
    probe.MISSING: "create it, mount the volume, or fix the path in the policy",
    probe.PERMISSION: (
        "grant this user (uid {uid}) access: check owner and mode (ls -ld), ACLs (getfacl) "
        "and the immutable attribute (lsattr)"
    ),
    probe.READ_ONLY: (
        "remount it read-write (mount -o remount,rw) or point the policy at a writable path; "
        "a filesystem that went read-only after errors needs dmesg and fsck"
    ),
    probe.FULL: "free space or inodes (delete old checkpoints, clean caches) or grow the volume",
    probe.STALE_HANDLE: (
        "the NFS file handle is stale (the export changed under the client): remount it (umount -l, then mount)"
    ),
    probe.IO_ERROR: "the device or server returned an I/O error: check dmesg and the storage server",
    probe.DISCONNECTED: (
        "the FUSE daemon or network filesystem client is gone: unmount it (fusermount3 -u or umount -l) and remount"
    ),
    probe.STUCK: (
        "the filesystem does not answer (hard NFS mount, dead server or FUSE daemon): check the server "
        "and network; `umount -l` detaches it"
    ),
    probe.SLOW: "the filesystem answers slowly: check server load and network, or raise max_latency_seconds",
    probe.OTHER: "an unexpected error: check dmesg and the filesystem's server or daemon",
}
INCOMPLETE_ADVICE = (
    "the probe itself could not run, so the path's health is unknown: check the sidecar's log, "
    "process limits (ulimit -u) and the probe interpreter ($WARDEN_PROBE_PYTHON)"
)


@dataclass
class PathState:
    """The last verdict on one path. ``checked`` is False until a first verdict exists.

    ``reason`` is None when healthy, else one of :data:`probe.REASONS`. ``incomplete``
    means the probe itself could not run (spawn failure, crash): the path's health is
    unknown, which callers report as exit code 3.
    """

    name: str
    path: str
    display_name: str
    checked: bool = False
    reason: str | None = None
    detail: str = "not probed yet"
    errno_name: str | None = None
    step: str | None = None
    stuck: bool = False
    incomplete: bool = False
    duration_seconds: float | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    free_inodes: int | None = None
    total_inodes: int | None = None
    read_only: bool | None = None
    realpath: str | None = None
    dev: str | None = None
    mount: Mount | None = None
    last_success: float | None = None
    verdict_time: float | None = None

    @property
    def healthy(self) -> bool:
        return self.checked and self.reason is None and not self.incomplete

    @property
    def message(self) -> str:
        """``checkpoint root /x: read-only file system (EROFS) while ...; remount it ...``."""
        head = f"{self.display_name} {self.path}: {self.detail}"
        if self.healthy or self.reason is None:
            return head
        advice = INCOMPLETE_ADVICE if self.incomplete else ADVICE.get(self.reason, "").format(uid=os.geteuid())
        return f"{head}; {advice}" if advice else head

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "healthy": self.healthy,
            "reason": self.reason,
            "stuck": self.stuck,
            "incomplete": self.incomplete,
            "errno": self.errno_name,
            "step": self.step,
            "detail": self.detail,
            "message": self.message,
            "duration_seconds": self.duration_seconds,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "free_inodes": self.free_inodes,
            "total_inodes": self.total_inodes,
            "read_only": self.read_only,
            "realpath": self.realpath,
            "mount": mount_fields(self.mount),
            "last_success_timestamp_seconds": self.last_success,
        }


class ProbeChild:
    """One probe process. Reads its output without blocking; never waits for it.

    Protocol: argv ``key=value`` words (:func:`probe.spec_to_args`); output: progress
    lines ``@<step>`` then one JSON result line.
    """

    def __init__(self, spec: PathSpec, started: float, python: str | None = None) -> None:
        self.spec = spec
        self.started = started
        self.abandoned = False
        self._out = bytearray()
        self.proc = subprocess.Popen(
            [python or probe_python(), "-I", "-S", PROBE_SCRIPT, *probe.spec_to_args(spec.probe_spec())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._eof = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pump(self) -> None:
        """Reads whatever output is available now."""
        while not self._eof:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                self._eof = True
                return
            if not chunk:
                self._eof = True
                return
            if len(self._out) < MAX_OUTPUT:
                self._out += chunk[: MAX_OUTPUT - len(self._out)]

    def exited(self) -> bool:
        """True once the child has ended (reaped with WNOHANG); drains its output then."""
        self.pump()
        if self.proc.poll() is None:
            return False
        self.pump()
        self.close_pipe()
        return True

    def close_pipe(self) -> None:
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def last_step(self) -> str | None:
        steps = [line[1:] for line in self._out.decode(errors="replace").splitlines() if line.startswith("@")]
        return steps[-1] if steps else None

    def kill(self) -> None:
        """SIGKILL, ignoring a child that is already gone; never waits."""
        with contextlib.suppress(OSError):
            self.proc.kill()

    def result(self) -> dict[str, Any] | str:
        """The parsed result, or a text saying why there is none."""
        text = self._out.decode(errors="replace")
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith("@")]
        if self.proc.returncode == 0 and lines:
            try:
                obj = json.loads(lines[-1])
                if isinstance(obj, dict) and "reason" in obj:
                    return obj
            except ValueError:
                pass
        code = self.proc.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with {code}"
        tail = " | ".join(lines[-3:])[-300:]
        return f"probe process {how}" + (f": {tail}" if tail else "")


def process_state(pid: int) -> str:
    """``D (fuse_wait_answer)`` from /proc/<pid>/stat and wchan; '' when unknown. Never blocks on the path."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    try:
        with open(f"/proc/{pid}/wchan", encoding="utf-8") as fh:
            wchan = fh.read().strip()
    except OSError:
        wchan = ""
    return f"{state} ({wchan})" if wchan and wchan != "0" else state


@dataclass
class _Slot:
    spec: PathSpec
    state: PathState
    child: ProbeChild | None = None
    next_due: float = 0.0


class PathWatcher:
    """Schedules probes for ``specs`` and keeps their states; see the module docstring.

    ``clock`` is monotonic (deadlines, intervals); ``wall`` gives the timestamps of
    ``last_success``. ``on_verdict(state)`` is called for each new verdict. ``python`` is
    the probe interpreter (default :func:`probe_python`).
    """

    def __init__(
        self,
        specs: Sequence[PathSpec],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        python: str | None = None,
        on_verdict: Callable[[PathState], None] | None = None,
        mountinfo_path: str = "/proc/self/mountinfo",
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.python = python
        self.on_verdict = on_verdict
        self.mountinfo_path = mountinfo_path
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {
            s.name: _Slot(s, PathState(s.name, s.expanded_path, s.display_name)) for s in specs
        }

    @property
    def states(self) -> dict[str, PathState]:
        return {name: slot.state for name, slot in self._slots.items()}

    def live_probes(self) -> dict[str, int]:
        """Probe processes not yet reaped, per path (0 or 1 by construction)."""
        return {name: int(slot.child is not None) for name, slot in self._slots.items()}

    def probe_pid(self, name: str) -> int | None:
        child = self._slots[name].child
        return child.pid if child is not None else None

    # -- one non-blocking step -------------------------------------------------------
    def tick(self, start_due: bool = True) -> list[PathState]:
        """Collects finished probes, marks overdue ones stuck, starts due ones. Never blocks.

        Returns the states that got a new verdict in this tick.
        """
        with self._lock:
            verdicts: list[PathState] = []
            mounts: list[Mount] | None = None
            for slot in self._slots.values():
                new = self._advance(slot, start_due)
                if new is not None:
                    if mounts is None:
                        mounts = self._mounts()
                    self._attach_mount(slot, mounts)
                    verdicts.append(slot.state)
            for state in verdicts:
                if self.on_verdict is not None:
                    self.on_verdict(state)
            return verdicts

    def _advance(self, slot: _Slot, start_due: bool) -> PathState | None:
        now = self.clock()
        verdict: PathState | None = None
        child = slot.child
        if child is not None:
            if child.exited():
                slot.child = None
                if not child.abandoned:
                    verdict = self._finish(slot, child, now)
            elif child.abandoned:
                slot.state.duration_seconds = now - child.started
            elif now >= child.started + slot.spec.deadline_seconds:
                verdict = self._mark_stuck(slot, child, now)
        if slot.child is None and start_due and now >= slot.next_due and not self._start(slot, now):
            verdict = slot.state
        return verdict

    def _start(self, slot: _Slot, now: float) -> bool:
        """Starts a probe; False (and an incomplete verdict) when no process could be started."""
        slot.next_due = now + slot.spec.interval_seconds
        try:
            slot.child = ProbeChild(slot.spec, now, self.python)
        except OSError as exc:
            self._set_incomplete(slot, f"could not start a probe process: {exc.strerror or exc}", now)
            return False
        return True

    def _finish(self, slot: _Slot, child: ProbeChild, now: float) -> PathState | None:
        result = child.result()
        if isinstance(result, str):
            self._set_incomplete(slot, result, now)
            return slot.state
        st = slot.state
        st.checked, st.stuck, st.incomplete = True, False, False
        st.reason = result.get("reason")
        st.detail = str(result.get("detail", ""))
        st.errno_name = result.get("errno_name")
        st.step = result.get("step")
        st.duration_seconds = result.get("duration_seconds")
        for key in ("free_bytes", "total_bytes", "free_inodes", "total_inodes", "read_only", "realpath"):
            setattr(st, key, result.get(key))
        st.dev = result.get("dev")
        st.verdict_time = now
        if st.reason is None:
            st.last_success = self.wall()
        return st

    def _mark_stuck(self, slot: _Slot, child: ProbeChild, now: float) -> PathState:
        child.abandoned = True
        child.pump()
        step = child.last_step()
        pstate = process_state(child.pid)
        child.kill()
        st = slot.state
        where = f" while {probe.STEP_WORDS.get(step, step)}" if step else ""
        pinfo = f" (probe pid {child.pid} was in state {pstate}; killed, left to exit on its own)" if pstate else ""
        st.checked, st.stuck, st.incomplete = True, True, False
        st.reason = probe.STUCK
        st.errno_name = None
        st.step = step
        st.detail = f"no answer within the {slot.spec.deadline_seconds:g}s deadline{where}{pinfo}"
        st.duration_seconds = now - child.started
        st.verdict_time = now
        return st

    def _set_incomplete(self, slot: _Slot, text: str, now: float) -> None:
        st = slot.state
        st.checked, st.stuck, st.incomplete = True, False, True
        st.reason = probe.OTHER
        st.errno_name = None
        st.step = None
        st.detail = text
        st.verdict_time = now

    def _mounts(self) -> list[Mount]:
        try:
            return read_mountinfo(self.mountinfo_path)
        except OSError:
            return []

    def _attach_mount(self, slot: _Slot, mounts: list[Mount]) -> None:
        st = slot.state
        where = st.realpath or lexical_abspath(st.path)
        st.mount = find_mount(mounts, where, st.dev)
        if st.mount is not None and st.mount.read_only:
            st.read_only = True
            wants_rw = slot.spec.writable if slot.spec.not_read_only is None else slot.spec.not_read_only
            if wants_rw and st.reason is None:
                st.reason = probe.READ_ONLY
                st.step = "mountinfo"
                st.detail = f"mounted read-only ({st.mount.describe()})"

    # -- blocking round --------------------------------------------------------------
    def run_round(self, stop: threading.Event | None = None, poll_seconds: float = 0.02) -> dict[str, PathState]:
        """Probes every path once now and waits until each has a fresh verdict.

        A path whose previous probe is still hung keeps its stuck verdict (no second probe
        is started). Returns early, with what it has, when ``stop`` is set. Bounded by the
        longest deadline plus the poll period.
        """
        start = self.clock()
        with self._lock:
            for slot in self._slots.values():
                slot.next_due = start
        pending = set(self._slots)
        while True:
            self.tick()
            for name in list(pending):
                slot = self._slots[name]
                fresh = slot.state.verdict_time is not None and slot.state.verdict_time >= start
                if fresh or (slot.child is not None and slot.child.abandoned):
                    pending.discard(name)
            if not pending or (stop is not None and stop.is_set()):
                return self.states
            if stop is not None:
                stop.wait(poll_seconds)
            else:
                time.sleep(poll_seconds)

    def close(self) -> None:
        """Kills probes still in flight (SIGKILL) and reaps those already gone; never waits."""
        with self._lock:
            for slot in self._slots.values():
                if slot.child is not None:
                    slot.child.kill()
                    if slot.child.exited():
                        slot.child = None
                    else:
                        slot.child.close_pipe()


def states_outcome(states: Iterable[PathState]) -> int:
    """0 all healthy, 1 some path unhealthy, 3 some probe could not run (exit codes)."""
    worst = 0
    for st in states:
        if st.incomplete or not st.checked:
            worst = max(worst, 3)
        elif not st.healthy:
            worst = max(worst, 1)
    return worst
