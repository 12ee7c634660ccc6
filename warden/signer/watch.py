"""Finding checkpoints in a root directory and deciding when one is complete and stable.

Layouts (the trainer that writes the root decides):

- ``warden``: ``step-NNNNNNNNN/`` written as ``.tmp-step-N/`` and renamed, so a name
  without ``.tmp-`` is complete at once;
- ``hf``: HF Trainer's ``checkpoint-N/``, written in place; ``trainer_state.json`` is
  its last file, so a directory is complete when it holds that file and stable when no
  entry changed (size and mtime) for ``stable_seconds``;
- ``verl``: ``global_step_N/`` written in place, then ``latest_checkpointed_iteration.txt``
  (``N``, not written atomically) beside them. The step that file names is complete, and
  so is one whose role directories hold verl's ``ckpt_contents.json`` (``async_save``),
  once the file and the directory have both been stable for ``stable_seconds``; the rule
  lives in :mod:`warden.layouts`, shared with the bridge.

Stability is judged twice, so it works both for a service and for one ``--once`` pass:
the same fingerprint seen ``stable_seconds`` ago, or no entry's mtime/ctime newer than
``stable_seconds``. :class:`RootWatcher` marks roots dirty on inotify events (watchdog);
callers still rescan on a timer, because inotify misses writes by other NFS clients.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import warden.layouts as verl_layout
from warden.safeio import open_root
from warden.signing.dsse import SIGNATURE_SUFFIX, signature_path_for
from warden.stability import Stability
from warden.stability import TreeState as TreeState  # re-exported for the sidecar
from warden.stability import tree_state as tree_state
from warden.watching import Change, TreeWatcher

HF_STATE_FILE = "trainer_state.json"
VERL_TRACKER = verl_layout.TRACKER
DIR_PATTERNS: dict[str, re.Pattern[str]] = {
    "warden": re.compile(r"step-([0-9]{9,})"),
    "hf": re.compile(r"checkpoint-([0-9]+)"),
    "verl": re.compile(r"global_step_([0-9]+)"),
}
"""Names *like* a checkpoint of each layout (matched whole: ``fullmatch``, so no trailing newline)."""
CANONICAL: dict[str, str] = {"warden": "step-{:09d}", "hf": "checkpoint-{}", "verl": "global_step_{}"}
"""The one spelling of step N in each layout; any other spelling of a step is no checkpoint of it."""
NAME_MAX = 255


def step_in_layout(layout: str, name: str) -> tuple[int, bool] | None:
    """(step, canonical) for a name like a checkpoint of ``layout``; None for any other name.
    ``canonical`` is False for an alias such as ``step-0000000004`` (step 4, not its name). A name
    over :data:`NAME_MAX` characters is none (no file system holds one; nor is its number parsed)."""
    if len(name) > NAME_MAX:
        return None
    match = DIR_PATTERNS[layout].fullmatch(name)
    if match is None:
        return None
    step = int(match.group(1))
    return step, CANONICAL[layout].format(step) == name


_TEMP_SIGNATURE = re.compile(r"^\.tmp-.+\.sig\.([0-9]+)\.([0-9]+)\Z")
_TEMP_SIGNATURE_RANDOM = re.compile(r"^\.tmp-.+\.sig\.[0-9a-f]{16}\Z")
STALE_TEMP_SECONDS = 600.0


@dataclass(frozen=True)
class Candidate:
    """A checkpoint directory found in a root: absolute path, step, layout."""

    path: str
    step: int
    layout: str

    @property
    def root(self) -> str:
        """The directory holding the checkpoint."""
        return os.path.dirname(self.path)

    @property
    def signature_path(self) -> str:
        """``<root>/<name>.sig``."""
        return signature_path_for(self.path)


def layout_of(name: str) -> tuple[str, int] | None:
    """``("hf", 500)`` for ``checkpoint-500``; None for a name no layout knows."""
    for layout in DIR_PATTERNS:
        found = step_in_layout(layout, name)
        if found is not None and found[1]:
            return layout, found[0]
    return None


def _named_entries(root: str, layout: str, real_dirs: bool) -> list[Candidate]:
    """Entries of ``root`` named like a checkpoint of ``layout`` that are (``real_dirs``) or are not
    (a symlink is never one; neither is a directory under another spelling of its step) checkpoint
    directories, by ascending step; [] for a missing or unreadable root."""
    found = []
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                named = step_in_layout(layout, entry.name)
                if named is None:
                    continue
                with contextlib.suppress(OSError):
                    if (entry.is_dir(follow_symlinks=False) and named[1]) == real_dirs:
                        found.append(Candidate(os.path.join(root, entry.name), named[0], layout))
    except OSError:
        return []
    return sorted(found, key=lambda c: c.step)


def list_checkpoints(root: str, layout: str) -> list[Candidate]:
    """Checkpoint directories of ``layout`` under ``root`` (not symlinks), by ascending step."""
    return _named_entries(root, layout, real_dirs=True)


def unsafe_entries(root: str, layout: str) -> list[Candidate]:
    """Entries of ``root`` named like a checkpoint of ``layout`` that are not real directories
    (a symlink, even one to a directory, a FIFO, a file...), by ascending step.

    :func:`list_checkpoints` never lists them, so they are never signed or verified; the
    signer reports them as ``unsafe_path`` violations.
    """
    return _named_entries(root, layout, real_dirs=False)


def signed_steps_before(root: str, layout: str, step: int) -> list[tuple[int, str]]:
    """(step, signature path) of the ``.sig`` files of ``layout`` below ``step``, newest first."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        if not name.endswith(SIGNATURE_SUFFIX):
            continue
        named = step_in_layout(layout, name[: -len(SIGNATURE_SUFFIX)])
        if named is not None and named[1] and named[0] < step:
            out.append((named[0], os.path.join(root, name)))
    return sorted(out, reverse=True)


def read_tracker(root: str) -> int | None:
    """The step in verl's ``latest_checkpointed_iteration.txt``; None if absent or not (yet) a number."""
    return verl_layout.tracker_step(root)


def completion_blocker(candidate: Candidate, tracker_step: int | None) -> str | None:
    """Why ``candidate`` is not complete yet, or None when it is (stability aside).

    verl's rule (the tracker, or verl's own manifests for ``async_save``) is
    :func:`warden.layouts.completion_blocker`, shared with the bridge.
    """
    if candidate.layout == "hf" and not os.path.isfile(os.path.join(candidate.path, HF_STATE_FILE)):
        return f"no {HF_STATE_FILE} yet"
    if candidate.layout == "verl":
        return verl_layout.completion_blocker(candidate.step, tracker_step, verl_layout.observe(candidate.path))
    return None


class StabilityTracker:
    """How long each checkpoint path has been quiet (:class:`warden.stability.Stability`)."""

    def __init__(self, stable_seconds: float) -> None:
        self.stable_seconds = stable_seconds
        self._stability = Stability()

    def remaining(self, path: str, state: TreeState, now: float) -> float:
        """Seconds until ``path`` counts as stable (<= 0: stable now), recording this observation."""
        return self.stable_seconds - self._stability.quiet_for(path, state.fingerprint, state.last_change, now)

    def forget(self, keep: Iterable[str]) -> None:
        """Drops every path not in ``keep`` (deleted or signed)."""
        self._stability.forget(keep)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_signature_temps(root: str, now: float | None = None) -> list[str]:
    """Deletes the temporaries of ``.sig`` writes a killed signer left behind; returns their paths.

    ``.tmp-<name>.sig.<16 hex>`` (:func:`warden.safeio.temp_name`) is stale when it is over
    :data:`STALE_TEMP_SECONDS` old: a write takes milliseconds. ``.tmp-<name>.sig.<pid>.<tid>``
    (written by older versions) also when its writer's process is gone and it is over a second old.
    Only the entry is unlinked, relative to the root's descriptor: a link there is never followed.
    """
    moment = time.time() if now is None else now
    removed = []
    try:
        root_fd = open_root(root)
    except OSError:
        return []
    try:
        for name in os.listdir(root_fd):
            legacy, current = _TEMP_SIGNATURE.match(name), _TEMP_SIGNATURE_RANDOM.match(name)
            if not (legacy or current) or (legacy and int(legacy.group(1)) == os.getpid()):
                continue
            try:
                age = moment - os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mtime
                dead = legacy is not None and age > 1.0 and not _pid_alive(int(legacy.group(1)))
                if age > STALE_TEMP_SECONDS or dead:
                    os.unlink(name, dir_fd=root_fd)
                    removed.append(os.path.join(root, name))
            except OSError:
                continue
    finally:
        os.close(root_fd)
    return sorted(removed)


class RootWatcher:
    """Marks roots dirty when inotify (watchdog) reports a change under them.

    Roots that do not exist yet are watched once they appear (:meth:`refresh`). Without
    watchdog, or when inotify fails (watch limit, NFS), nothing is marked and the caller's
    periodic rescan does the work. Events on signature files (our own writes), opens and
    reads (our own hashing) and directory mtime updates that echo a child's event are ignored.
    """

    def __init__(self, roots: Iterable[str], use_watchdog: bool = True) -> None:
        self.roots = list(dict.fromkeys(roots))
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._tree = TreeWatcher(self._changed, enabled=use_watchdog)

    def _changed(self, change: Change) -> None:
        if change.is_directory and change.kind == "modified":
            return
        if all(_is_signature_file(p) for p in change.paths):
            return
        with self._lock:
            self._dirty.add(change.root)

    def refresh(self) -> bool:
        """Starts watching roots that exist now; True when every existing root is watched."""
        if not self._tree.active:
            return False
        results = [self._tree.watch(root) for root in self.roots if os.path.isdir(root)]  # every root, no short cut
        return all(results)

    def take_dirty(self) -> set[str]:
        """The roots changed since the last call (and clears them)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        return dirty

    def close(self) -> None:
        self._tree.close()


def _is_signature_file(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(SIGNATURE_SUFFIX) or bool(_TEMP_SIGNATURE.match(name))
