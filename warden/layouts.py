"""verl checkpoints: which ``global_step_N/`` is complete, and which was pruned by retention.

This module is the one place that knows verl's checkpoint layout; the bridge and the
signer's ``verl`` roots both use it. verl's trainer (``RayPPOTrainer._save_checkpoint``)
writes, in ``trainer.default_local_dir``::

    global_step_N/actor/model_world_size_W_rank_R.pt      (+ optim_..., extra_state_...)  FSDP
    global_step_N/actor/{model,optimizer,extra}/...       + ckpt_contents.json, last   Megatron
    global_step_N/critic/...                              same layout, when there is a critic
    global_step_N/data.pt                                 the dataloader state
    latest_checkpointed_iteration.txt                     "N", rewritten in place afterwards

Nothing is renamed into place and the tracker is written without fsync, so a reader can
see a half-written directory or an empty or half-written tracker ("1" of "12").

A step is complete (:func:`completion_blocker`), once it has also been stable for
``stable_seconds``, when either

- the tracker names it (a synchronous save writes the tracker after everything else), or
- verl's Megatron manifest says so: ``data.pt`` and ``actor/`` exist and every role
  directory present (``actor/``, ``critic/``) holds ``ckpt_contents.json``, which verl
  writes last, atomically, once the role's (possibly asynchronous) writes finished. With
  ``async_save`` the trainer never writes the tracker itself, and the Megatron finalizer
  that does may be overtaken by the next save, so this is how those steps are found.

A directory that is neither (an FSDP save that crashed before the tracker write, or one
saved while no reader was looking and whose step the tracker no longer names) is never
reported complete.

Retention (``max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``) removes
``global_step_M/actor`` and ``global_step_M/critic`` with ``shutil.rmtree`` and keeps the
directory (``data.pt`` stays). :func:`pruned_roles` tells that apart from tampering.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from warden.safeio import open_regular_fd

TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR_PREFIX = "global_step_"
MAX_TRACKER_BYTES = 64
CONTENTS_MANIFEST = "ckpt_contents.json"
DATALOADER_STATE = "data.pt"
ACTOR = "actor"
ROLES = (ACTOR, "critic")
"""Role directories verl's checkpoint managers write and its retention removes."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"{STEP_DIR_PREFIX}{step}")


def step_of(name: str) -> int | None:
    """``12`` for ``global_step_12``; None for any other name."""
    suffix = name[len(STEP_DIR_PREFIX) :]
    if not (name.startswith(STEP_DIR_PREFIX) and suffix.isascii() and suffix.isdigit()):
        return None
    return int(suffix) if str(int(suffix)) == suffix else None  # one spelling per step: no leading zeros


def parse_tracker(text: str) -> int | None:
    """The step in the tracker's text; None when it is empty or not (yet) a decimal number."""
    value = text.strip()
    return int(value) if value.isascii() and value.isdigit() else None


@dataclass(frozen=True)
class Tracker:
    """The tracker file as read once: its step (None if not a number), text and times."""

    step: int | None
    text: str
    size: int
    mtime_ns: int
    newest_change: float


def read_tracker(root: str) -> Tracker | None:
    """Reads ``root/latest_checkpointed_iteration.txt`` (no link followed, never blocking);
    None when it does not exist.

    Raises OSError when it exists but cannot be read (a symlink, FIFO or directory included).
    """
    path = os.path.join(root, TRACKER)
    try:
        fd = open_regular_fd(path)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        raw = os.read(fd, MAX_TRACKER_BYTES)
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace")
    return Tracker(parse_tracker(text), text, st.st_size, st.st_mtime_ns, max(st.st_mtime, st.st_ctime))


def tracker_step(root: str) -> int | None:
    """The step the tracker names; None when it is absent, unreadable or not (yet) a number."""
    try:
        tracker = read_tracker(root)
    except OSError:
        return None
    return tracker.step if tracker is not None else None


@dataclass(frozen=True)
class StepContents:
    """What a ``global_step_N/`` holds that decides its completeness (from :func:`observe`)."""

    roles: tuple[str, ...]
    """Role directories present (real directories, not links)."""
    manifests: tuple[str, ...]
    """Roles whose ``ckpt_contents.json`` is a regular file."""
    dataloader: bool
    """``data.pt`` is a regular file."""
    marker_mtime_ns: int = 0
    """Newest mtime of the manifests (identifies one save of the step)."""


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def observe(path: str) -> StepContents:
    """Looks at ``path``'s role directories, their manifests and ``data.pt`` (no link followed)."""
    roles, manifests, newest = [], [], 0
    for role in ROLES:
        st = _lstat(os.path.join(path, role))
        if st is None or not stat.S_ISDIR(st.st_mode):
            continue
        roles.append(role)
        mst = _lstat(os.path.join(path, role, CONTENTS_MANIFEST))
        if mst is not None and stat.S_ISREG(mst.st_mode):
            manifests.append(role)
            newest = max(newest, mst.st_mtime_ns)
    dst = _lstat(os.path.join(path, DATALOADER_STATE))
    return StepContents(tuple(roles), tuple(manifests), dst is not None and stat.S_ISREG(dst.st_mode), newest)


def completion_blocker(step: int, named: int | None, contents: StepContents) -> str | None:
    """Why ``global_step_<step>`` is not complete (stability aside); None when it is.

    Complete when the tracker names it, or when verl's manifests say every role present
    finished (``async_save``): see the module docstring.
    """
    pending = [role for role in contents.roles if role not in contents.manifests]
    if named == step:
        # Megatron writes the tracker after each role's manifest: once one role has its manifest,
        # the tracker may name the step while another role (async_save) is still writing.
        if contents.manifests and pending:
            return f"{TRACKER} names it, but {', '.join(pending)}/ has no {CONTENTS_MANIFEST} yet"
        return None
    if ACTOR not in contents.roles:
        return f"no {ACTOR}/ and not the step named by {TRACKER} ({named})"
    if pending:
        return f"not the step named by {TRACKER} ({named}) and no {CONTENTS_MANIFEST} in {', '.join(pending)}/"
    if not contents.dataloader:
        return f"not the step named by {TRACKER} ({named}) and no {DATALOADER_STATE} yet"
    return None


def list_steps(root: str) -> list[int]:
    """Steps of the ``global_step_*`` directories (real directories, not links) under ``root``, ascending.

    A missing root yields []; raises OSError when it cannot be read.
    """
    out = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    for entry in entries:
        step = step_of(entry.name)
        try:
            if step is not None and entry.is_dir(follow_symlinks=False):
                out.append(step)
        except OSError:
            continue
    return sorted(out)


def pruned_roles(missing: Iterable[str], changed: int, roles_present: Iterable[str]) -> tuple[str, ...] | None:
    """The role directories verl's retention removed, when that alone explains a verification
    failure; None when it does not (a violation).

    ``missing``: signed file names (``/``-separated, relative) absent on disk; ``changed``:
    how many files were modified, added or unsafe; ``roles_present``: role directories that
    still exist. Pruned means: nothing changed or added, something missing, and every
    missing file lies under a role directory (``actor/``, ``critic/``) that is gone as a
    whole. One shard deleted from a role directory that is still there, ``data.pt``
    deleted, or any modified or extra file is not retention.
    """
    names = list(missing)
    if changed or not names:
        return None
    present = set(roles_present)
    tops = {PurePosixPath(name).parts[0] for name in names}
    if any(len(PurePosixPath(name).parts) < 2 for name in names):
        return None
    if not tops <= set(ROLES) or tops & present:
        return None
    return tuple(sorted(tops))
