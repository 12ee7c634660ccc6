"""Preflight for the trainer: probe its paths once, in child processes, before training.

    from warden.paths import preflight, require_healthy
    problems = preflight({"data": (data_dir, False), "checkpoint_root": (ckpt_dir, True)}, deadline=10)
    for p in problems:
        print(p.message)   # "checkpoint root /x: read-only file system (EROFS) while ...; remount it ..."

Uses the same probes as the sidecar (exists, list, read a small file, and with
``need_write`` create/write/fsync/remove a probe file and refuse a read-only mount). It
returns within about ``deadline`` seconds even when a path hangs forever (that path is a
``stuck`` problem; its probe process is left to exit on its own).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from warden.errors import ViolationError
from warden.paths.policy import PathSpec
from warden.paths.scheduler import PathWatcher


@dataclass(frozen=True)
class Problem:
    """One unhealthy path. ``reason`` is one of probe.REASONS; ``message`` says what and what to do."""

    name: str
    path: str
    reason: str
    message: str
    errno: str | None = None
    stuck: bool = False

    def __str__(self) -> str:
        return self.message


class PathsUnhealthy(ViolationError):
    """Raised by :func:`require_healthy`; ``problems`` holds every unhealthy path (exit code 1)."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def _label(name: str) -> str:
    label = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "path"
    return label if label[0].isalpha() else f"p_{label}"


def preflight(
    paths: Mapping[str, tuple[str, bool] | PathSpec],
    deadline: float = 10.0,
    min_free_bytes: int | str | None = None,
) -> list[Problem]:
    """Probes every path once, in parallel, and returns the problems (empty when all are healthy).

    ``paths`` maps a name ("checkpoint root" or "checkpoint_root"; messages use it) to
    ``(path, need_write)`` or to a full :class:`PathSpec`. ``deadline`` bounds each probe
    and so the call. ``min_free_bytes`` (``10GiB``, ``5%``) applies to the paths that need
    writes. A probe process that could not run is a problem with reason ``other``.
    """
    specs = []
    for name, value in paths.items():
        if isinstance(value, PathSpec):
            specs.append(value)
            continue
        path, need_write = value
        specs.append(
            PathSpec(
                name=_label(name),
                path=str(path),
                description=name.replace("_", " "),
                writable=bool(need_write),
                min_free_bytes=min_free_bytes if need_write else None,
                deadline_seconds=deadline,
                interval_seconds=max(deadline, 1.0),
            )
        )
    labels = [s.name for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"preflight: path names collide once made labels: {labels}")
    watcher = PathWatcher(specs)
    try:
        states = watcher.run_round()
    finally:
        watcher.close()
    return [
        Problem(st.name, st.path, st.reason or "other", st.message, st.errno_name, st.stuck)
        for st in states.values()
        if not st.healthy
    ]


def require_healthy(
    paths: Mapping[str, tuple[str, bool] | PathSpec], deadline: float = 10.0, min_free_bytes: int | str | None = None
) -> None:
    """:func:`preflight`, raising :class:`PathsUnhealthy` listing every problem when there is one."""
    problems = preflight(paths, deadline, min_free_bytes)
    if problems:
        raise PathsUnhealthy(problems)
