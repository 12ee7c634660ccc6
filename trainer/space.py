"""Will the next checkpoint fit? Free space, checkpoint sizes, and the plan for a save that would not fit.

The issue behind this module: 32 GB checkpoints with ``keep_last: 2`` on a disk that could not hold a
third; the save died with ``ENOSPC`` after the step's work, nothing warned before, and retention could
only free space once the new checkpoint was complete. Now, before each save, the trainer measures
(:func:`free_bytes`, :func:`tree_bytes`, :func:`estimate_needed`), plans (:func:`plan_save`, pure) and,
when a write fails anyway, says why in one line (:func:`describe_write_failure`).

Only :func:`free_bytes` and :func:`tree_bytes` touch the filesystem: descriptor-relative, never
following a link below the root, bounded like :mod:`warden.safeio`'s tree walks. Torch is not imported
here (:func:`state_bytes` is duck-typed).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from warden import safeio
from warden.errors import IncompleteError, quote_untrusted

GIB = 1 << 30
NEEDED_SLACK_BYTES = 1 << 20
"""Added to the state's tensor bytes for what is not tensors: JSON skeletons, trainer state, the
config, the manifest (kilobytes to a megabyte in practice). A measured checkpoint holds them already."""
MODES = ("prune_first", "skip", "fail")
"""The choices of ``checkpoint.on_no_space`` (trainer/config.py)."""
CHAIN_LIMIT = 64
"""Most exceptions of a ``__cause__``/``__context__`` graph :func:`find_errno` visits (chains can loop)."""
_OS_ERROR_TEXT = re.compile(r"\(os error ([0-9]{1,4})\)")
"""How Rust's std::io::Error (safetensors' SafetensorError) prints an errno: ``... (os error 28)``."""


class SpaceError(IncompleteError):
    """Free space or a checkpoint's size could not be measured; the message names the path and the
    OSError is the ``__cause__`` (so :func:`describe_write_failure` finds its errno)."""


# -- measuring ---------------------------------------------------------------------------------------
def free_bytes(root: str) -> int:
    """Bytes an unprivileged writer may still write on the filesystem of checkpoint root ``root``
    (``f_bavail * f_frsize``: the blocks reserved for uid 0 do not count, a trainer cannot rely on them).

    ``root`` is opened as :func:`warden.safeio.open_root` opens it (the operator's path, links in it
    followed); when it does not exist yet (``make_root`` creates it at the first save) its nearest
    existing parent is measured: that is where ``make_root`` will create it. A dangling link is not
    walked past (the mount it pointed to is gone). Raises SpaceError naming ``root`` on any OSError."""
    try:
        fd = _open_nearest_existing(os.path.abspath(root))
        try:
            info = os.fstatvfs(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SpaceError(f"{root}: free space of the checkpoint root not measured: {_os_detail(exc)}") from exc
    return info.f_bavail * info.f_frsize


def _open_nearest_existing(path: str) -> int:
    while True:
        try:
            return safeio.open_root(path)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path or os.path.lexists(path):  # "/" itself, or a dangling link: not ours to skip
                raise
            path = parent


def tree_bytes(path: str, *, max_entries: int = safeio.MAX_TREE_ENTRIES, max_depth: int = safeio.MAX_TREE_DEPTH) -> int:
    """Bytes on disk of the complete checkpoint directory ``path``: the sum over it and every entry
    below of ``st_blocks * 512`` (a regular file whose filesystem reports no blocks counts its size
    rounded up to ``st_blksize``). What removing it frees, and what the next one of the same state takes.

    ``path`` itself is opened ``O_NOFOLLOW`` relative to its parent (a link named like a checkpoint is
    refused), entries below relative to their directory's descriptor; links are counted, never followed.
    Iterative, holding one descriptor per level; more than ``max_entries`` entries or ``max_depth``
    levels is refused (:class:`warden.safeio.TreeTooLarge`). Raises SpaceError naming ``path`` on any
    OSError."""
    try:
        return _walk_bytes(os.path.abspath(path), max_entries, max_depth)
    except OSError as exc:
        raise SpaceError(f"{path}: checkpoint size not measured: {_os_detail(exc)}") from exc


@dataclass
class _Walk:
    """What :func:`_walk_bytes` has counted so far."""

    path: str
    max_entries: int
    total: int = 0
    listed: int = 0

    def scan(self, fd: int) -> list[str]:
        """Counts the open directory ``fd`` and its entries; returns the names of its real subdirectories."""
        self.total += _disk_bytes(os.fstat(fd))
        subdirs = []
        with os.scandir(fd) as entries:
            for entry in entries:
                self.listed += 1
                if self.listed > self.max_entries:
                    raise safeio.TreeTooLarge(self.path, f"more than {self.max_entries} entries; not measured")
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    subdirs.append(entry.name)  # counted when opened: it may be swapped meanwhile
                else:
                    self.total += _disk_bytes(info)
        return subdirs


def _walk_bytes(path: str, max_entries: int, max_depth: int) -> int:
    walk = _Walk(path, max_entries)
    parent = safeio.open_root(os.path.dirname(path))
    try:
        top = os.open(os.path.basename(path), safeio.DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    stack: list[tuple[int, list[str]]] = [(top, [])]  # each level: its descriptor, its subdirectories to visit
    try:
        stack[-1][1].extend(walk.scan(top))
        while stack:
            fd, pending = stack[-1]
            if not pending:
                os.close(stack.pop()[0])
                continue
            if len(stack) >= max_depth:
                raise safeio.TreeTooLarge(path, f"deeper than {max_depth} levels; not measured")
            stack.append((os.open(pending.pop(), safeio.DIR_FLAGS, dir_fd=fd), []))
            stack[-1][1].extend(walk.scan(stack[-1][0]))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return walk.total


def _disk_bytes(info: os.stat_result) -> int:
    blocks = getattr(info, "st_blocks", 0)
    if blocks or not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return blocks * 512
    block = getattr(info, "st_blksize", 0) or 4096  # FUSE and some network filesystems report no blocks
    return -(-info.st_size // block) * block


def state_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the tensors of a state to save: each one's ``nbytes`` (torch and numpy have it), else
    ``numel() * element_size()``. Shared storage is counted once per tensor given (as saving it would
    unless the writer deduplicates). Raises TypeError for anything else."""
    total = 0
    for tensor in tensors:
        size = getattr(tensor, "nbytes", None)
        if size is None:
            try:
                size = tensor.numel() * tensor.element_size()
            except AttributeError:
                raise TypeError(f"{type(tensor).__name__}: not a tensor (no nbytes, numel or element_size)") from None
        total += int(size)
    return total


def estimate_needed(last_bytes: int | None, state_bytes: int) -> int:
    """Bytes the next checkpoint is expected to take: ``last_bytes`` (the newest checkpoint's
    :func:`tree_bytes`) when known, else ``state_bytes`` (the state's tensor bytes, with the optimizer
    moments it will have by then) plus :data:`NEEDED_SLACK_BYTES` for the non-tensor files."""
    base = state_bytes if last_bytes is None else last_bytes
    if base < 0:
        raise ValueError(f"a negative checkpoint size: {base}")
    return base + NEEDED_SLACK_BYTES if last_bytes is None else base


# -- planning (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpacePlan:
    """What to do about the next save.

    ``action``: ``write`` (it fits), ``prune_then_write`` (remove ``prune_steps`` first, oldest first,
    then write), ``skip`` (no checkpoint this time; nothing pruned) or ``fail`` (stop the run).
    ``freed_bytes``: what removing ``prune_steps`` frees. ``needed_bytes`` excludes the margin.
    ``reason``: one line for the log and the event naming the root, what is needed and free (GiB), and
    what to do."""

    action: str
    prune_steps: tuple[int, ...]
    free_bytes: int
    needed_bytes: int
    freed_bytes: int
    reason: str


def plan_save(
    *,
    root: str,
    free: int,
    needed: int,
    checkpoints: list[tuple[int, int]],
    keep_last: int,
    mode: str,
    margin: int,
) -> SpacePlan:
    """The plan for a save of ``needed`` bytes onto a filesystem with ``free`` bytes. Pure.

    ``checkpoints``: the announced, live checkpoints as (step, bytes on disk), any order (steps unique).
    The rule, exactly:

    1. The save fits when ``free >= needed + margin``: ``write``, nothing pruned (retention after the
       save removes all but the newest ``keep_last``, as before).
    2. Otherwise ``mode`` decides. ``fail``: ``fail``. ``skip``: ``skip``. Neither prunes anything.
    3. ``prune_first``: remove announced checkpoints oldest first, as few as make
       ``free + freed >= needed + margin``. The oldest ``len(checkpoints) - (keep_last - 1)`` are the
       ones retention would remove right after this save anyway (it keeps the new one and the newest
       ``keep_last - 1`` existing), so removing them before the write loses nothing retention would
       have kept. Pruning goes further when it must, down to ONE existing checkpoint: the newest is
       never pruned, so a complete checkpoint survives until the new one is complete. The ``reason``
       says how many pruned checkpoints retention would have kept.
    4. When even pruning all but the newest would not make room: ``skip`` and nothing is pruned (a
       partial prune would destroy checkpoints and still not save one).

    Raises ValueError for an unknown ``mode``, a ``keep_last`` below 1, a negative size or repeated steps.
    """
    _check_plan_inputs(free, needed, checkpoints, keep_last, mode, margin)
    required = needed + margin
    plan = _Planner(root, free, needed, margin)
    if free >= required:
        return plan.make("write", (), 0, "fits")
    if mode == "fail":
        return plan.make("fail", (), 0, "checkpoint.on_no_space is fail: the run stops" + _remedy("fail"))
    if mode == "skip":
        return plan.make("skip", (), 0, "checkpoint.on_no_space is skip: no checkpoint this time" + _remedy("skip"))
    return _plan_pruning(plan, sorted(checkpoints), required - free, keep_last)


def _plan_pruning(plan: _Planner, oldest_first: list[tuple[int, int]], lacking: int, keep_last: int) -> SpacePlan:
    """Rules 3 and 4 of :func:`plan_save` for checkpoints sorted oldest first, ``lacking`` bytes short."""
    chosen = _fewest_oldest(oldest_first[:-1], lacking)  # the newest existing one is never a candidate
    if chosen is None:
        older = oldest_first[:-1]
        why = (
            f"pruning all {len(older)} checkpoint(s) but the newest would free only "
            f"{gib(sum(size for _, size in older))}"
            if older
            else "no older checkpoint to prune"
        )
        return plan.make("skip", (), 0, f"{why}; no checkpoint this time{_remedy('prune_first')}")
    steps, freed = tuple(step for step, _ in chosen), sum(size for _, size in chosen)
    doomed_anyway = max(0, len(oldest_first) - (keep_last - 1))  # what retention removes after this save
    kept_otherwise = max(0, len(steps) - doomed_anyway)
    why = (
        f"pruning the {len(steps)} oldest checkpoint(s) first (step {', '.join(map(str, steps))}; "
        f"{kept_otherwise} of them keep_last {keep_last} would have kept) frees {gib(freed)}"
    )
    return plan.make("prune_then_write", steps, freed, why + _remedy("prune_first" if kept_otherwise else None))


def _fewest_oldest(candidates: list[tuple[int, int]], lacking: int) -> list[tuple[int, int]] | None:
    """The shortest prefix of ``candidates`` (oldest first) whose bytes reach ``lacking``; None if none does."""
    freed = 0
    for count, (_, size) in enumerate(candidates, 1):
        freed += size
        if freed >= lacking:
            return candidates[:count]
    return None


@dataclass(frozen=True)
class _Planner:
    root: str
    free: int
    needed: int
    margin: int

    def make(self, action: str, steps: tuple[int, ...], freed: int, why: str) -> SpacePlan:
        head = (
            f"checkpoint root {quote_untrusted(self.root, 400)}: the save needs {gib(self.needed + self.margin)} "
            f"({gib(self.needed)} + {gib(self.margin)} margin), {gib(self.free)} free"
        )
        return SpacePlan(action, steps, self.free, self.needed, freed, f"{head}; {why}")


def _remedy(mode: str | None) -> str:
    """What an operator can do; ``mode`` is the on_no_space in force (None: nothing is wrong enough)."""
    if mode is None:
        return ""
    other = {"fail": "prune_first or skip", "skip": "prune_first or fail", "prune_first": "skip or fail"}[mode]
    return (
        "; do: free space on that filesystem, lower checkpoint.keep_last, move checkpoint.root, "
        f"or set checkpoint.on_no_space to {other}"
    )


def _check_plan_inputs(
    free: int, needed: int, checkpoints: list[tuple[int, int]], keep_last: int, mode: str, margin: int
) -> None:
    if mode not in MODES:
        raise ValueError(f"checkpoint.on_no_space {mode!r}: not one of {', '.join(MODES)}")
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last}: at least 1")
    if min(free, needed, margin, *(size for _, size in checkpoints)) < 0:
        raise ValueError("a negative byte count")
    if len({step for step, _ in checkpoints}) != len(checkpoints):
        raise ValueError("a step listed twice")


def gib(n: int) -> str:
    """``n`` bytes in GiB with two decimals; below 0.01 GiB the exact bytes follow (small test roots)."""
    shown = f"{n / GIB:.2f} GiB"
    return shown if n >= GIB // 100 or n == 0 else f"{shown} ({n} bytes)"


# -- explaining a failed write -----------------------------------------------------------------------
_HINTS: dict[int, str] = {
    errno.ENOSPC: "free space on the checkpoint root's filesystem (df -h), lower checkpoint.keep_last or move "
    "checkpoint.root; checkpoint.on_no_space (prune_first, skip, fail) decides what the next save does",
    errno.EDQUOT: "the disk quota is exhausted: raise the quota, free space under it, lower checkpoint.keep_last "
    "or move checkpoint.root",
    errno.EIO: "check the storage and its mount (dmesg); the paths sidecar's warden_path_* alerts name the path",
    errno.EREMOTEIO: "check the storage and its mount (dmesg); the paths sidecar's warden_path_* alerts name the path",
    errno.ESTALE: "a stale NFS handle: remount the checkpoint root (umount -l, mount); see the paths sidecar's "
    "warden_path_* alerts",
    errno.ENOTCONN: "the mount's server or FUSE daemon is gone: check the mount (mount, dmesg) and the paths "
    "sidecar's warden_path_* alerts",
    errno.ENOENT: "the checkpoint root or the directory being written vanished (an unmounted volume?): check the "
    "mount and the paths sidecar's warden_path_* alerts",
    errno.EROFS: "the filesystem is read-only (ext4 remounts so after errors): check dmesg, remount read-write or "
    "move checkpoint.root",
    errno.EACCES: "the trainer's user may not write there: fix the checkpoint root's permissions",
    errno.EPERM: "the trainer's user may not write there: fix the checkpoint root's permissions",
}
_GENERIC_HINT = "see the trainer log and the storage; the paths sidecar's warden_path_* alerts name a sick path"


def describe_write_failure(exc: BaseException, *, path: str, needed: int, free: int | None) -> tuple[str, str | None]:
    """``(reason, errno name)`` of a failed checkpoint write.

    ``reason`` is one line for ``checkpoint.rejected`` and the log: ``path``, what failed (the OSError's
    text, else the exception's, sanitised), the errno name, the bytes needed and free (``free`` None:
    not measured), and what to do for that errno. The errno is the first OSError's found by
    :func:`find_errno` (``ENOSPC``, ``EDQUOT``, ``EIO``, ``ESTALE``, ``ENOTCONN``, ``EROFS``, ...), None
    when the chain holds none."""
    number, source = find_errno(exc)
    if number is None:
        what = quote_untrusted(f"{type(exc).__name__}: {exc}")
    elif isinstance(source, OSError) and source.strerror:
        what = f"{quote_untrusted(source.strerror, 120)} ({errno_name(number)})"
    else:
        what = f"{os.strerror(number)} ({errno_name(number)})"
    space = f"needs {gib(needed)}, {'free space unknown' if free is None else gib(free) + ' free'}"
    hint = _HINTS.get(number, _GENERIC_HINT) if number is not None else _GENERIC_HINT
    return f"{quote_untrusted(path, 400)}: checkpoint not saved: {what}; {space}; {hint}", errno_name(number)


def find_errno(exc: BaseException) -> tuple[int | None, BaseException | None]:
    """The errno behind ``exc`` and the exception that carries it.

    First the outermost ``OSError`` with an errno along ``__cause__``/``__context__`` (and an exception
    group's members): the trainer wraps OSErrors in CheckpointError. Failing that, the first exception
    whose text has Rust's ``(os error N)``: safetensors raises its own SafetensorError. (None, None) if
    neither is there. At most :data:`CHAIN_LIMIT` exceptions are visited."""
    chain = list(_exception_chain(exc))
    for link in chain:
        if isinstance(link, OSError) and link.errno is not None:
            return link.errno, link
    for link in chain:
        match = _OS_ERROR_TEXT.search(str(link))
        if match:
            return int(match.group(1)), link
    return None, None


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it, breadth first, each once."""
    queue: list[BaseException] = [exc]
    seen: set[int] = set()
    while queue and len(seen) < CHAIN_LIMIT:
        link = queue.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        queue.extend(e for e in (link.__cause__, link.__context__) if e is not None)
        queue.extend(getattr(link, "exceptions", ()))  # BaseExceptionGroup (a thread pool's errors)


def errno_name(number: int | None) -> str | None:
    """``ENOSPC`` for 28; ``E<n>`` for a number Python does not know; None for None."""
    if number is None:
        return None
    return errno.errorcode.get(number, f"E{number}")


def _os_detail(exc: OSError) -> str:
    name = errno_name(exc.errno)
    text = quote_untrusted(exc.strerror or exc, 200)
    return f"{text} ({name})" if name else text
