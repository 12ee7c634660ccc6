"""verl checkpoints: which ``global_step_N/`` is complete, and when.

verl's trainer (``RayPPOTrainer._save_checkpoint``) writes, in ``trainer.default_local_dir``::

    global_step_N/actor/model_world_size_W_rank_R.pt      (+ optim_..., extra_state_...)
    global_step_N/actor/huggingface/                      config, generation config, tokenizer
    global_step_N/critic/...                              same layout, when there is a critic
    global_step_N/data.pt                                 the dataloader state, written last
    latest_checkpointed_iteration.txt                     "N", rewritten in place afterwards

Nothing is renamed into place and the tracker is written without fsync, so a reader can
see a half-written directory or an empty or half-written tracker ("1" of "12"). The only
complete checkpoint is the step the tracker names, and only once the tracker and that
directory have both stayed unchanged for ``stable_seconds``. Other ``global_step_*``
directories are never reported complete (an older one was named in its time; a newer one
is still being written, or was abandoned by a crash before its tracker write).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass

from sidecars.bridge.verl_log import open_regular

TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR_PREFIX = "global_step_"
MAX_TRACKER_BYTES = 64


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"{STEP_DIR_PREFIX}{step}")


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
    """Reads ``root/latest_checkpointed_iteration.txt``; None when it does not exist.

    Raises OSError when it exists but cannot be read.
    """
    path = os.path.join(root, TRACKER)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        raw = os.read(fd, MAX_TRACKER_BYTES)
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace")
    return Tracker(parse_tracker(text), text, st.st_size, st.st_mtime_ns, max(st.st_mtime, st.st_ctime))


@dataclass(frozen=True)
class TreeState:
    """Fingerprint of a directory tree ((relative path, size, mtime_ns) per entry) and its newest change."""

    fingerprint: tuple[tuple[str, int, int], ...]
    newest_change: float


def tree_state(path: str) -> TreeState | None:
    """Walks ``path`` without following links; None when ``path`` is not a directory (any more)."""
    entries: list[tuple[str, int, int]] = []
    newest = 0.0
    pending = [path]
    while pending:
        directory = pending.pop()
        try:
            st = os.lstat(directory)
            with os.scandir(directory) as scan:
                children = list(scan)
        except (FileNotFoundError, NotADirectoryError):
            if directory == path:
                return None
            continue
        entries.append((os.path.relpath(directory, path), st.st_size, st.st_mtime_ns))
        newest = max(newest, st.st_mtime, st.st_ctime)
        for child in children:
            with contextlib.suppress(FileNotFoundError):
                cst = child.stat(follow_symlinks=False)
                if stat.S_ISDIR(cst.st_mode):
                    pending.append(child.path)
                    continue
                entries.append((os.path.relpath(child.path, path), cst.st_size, cst.st_mtime_ns))
                newest = max(newest, cst.st_mtime, cst.st_ctime)
    return TreeState(tuple(sorted(entries)), newest)


def in_progress_steps(root: str, named: int | None) -> list[int]:
    """Steps of ``global_step_*`` directories above the tracker's step (being written, or abandoned)."""
    out = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        suffix = name[len(STEP_DIR_PREFIX) :]
        if name.startswith(STEP_DIR_PREFIX) and suffix.isdigit() and (named is None or int(suffix) > named):
            out.append(int(suffix))
    return sorted(out)
