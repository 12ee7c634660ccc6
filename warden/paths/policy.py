"""Schema of ``policies/paths.yaml``: the watched paths and what each must satisfy.

Loaded with :func:`warden.policy.load_policy`; a bad value raises PolicyError naming the
file and key, e.g. ``policies/paths.yaml: paths[1]: min_free_bytes: ...``.
Thresholds of free space take bytes (``1073741824``), a size with a unit (``10GiB``,
``500MB``) or a percentage of the filesystem (``5%``); inode thresholds a count or a
percentage.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}\Z")
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGTP]i?B|[kKMGTP]|B)?\s*\Z")
_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*\Z")
_UNITS = {
    "B": 1,
    "K": 1024,
    "KB": 1000,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1000**3,
    "GIB": 1024**3,
    "T": 1024**4,
    "TB": 1000**4,
    "TIB": 1024**4,
    "P": 1024**5,
    "PB": 1000**5,
    "PIB": 1024**5,
}


@dataclass(frozen=True)
class Threshold:
    """A minimum as an absolute count and/or a percentage; both None means no minimum."""

    absolute: int | None = None
    percent: float | None = None


def parse_threshold(value: Any, key: str, sizes: bool) -> Threshold:
    """Parses ``5%``, an integer, or (when ``sizes``) ``10GiB``; raises ValueError naming ``key``."""
    if value is None:
        return Threshold()
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{key}: must be >= 0, got {value}")
        return Threshold(absolute=value)
    if isinstance(value, str):
        pct = _PERCENT_RE.match(value)
        if pct:
            share = float(pct.group(1))
            if share > 100:
                raise ValueError(f"{key}: a percentage must be <= 100%, got {value!r}")
            return Threshold(percent=share)
        size = _SIZE_RE.match(value)
        if size and (sizes or size.group(2) is None):
            unit = (size.group(2) or "B").upper()
            return Threshold(absolute=int(float(size.group(1)) * _UNITS[unit]))
    example = "1073741824, '10GiB' or '5%'" if sizes else "10000 or '5%'"
    raise ValueError(f"{key}: expected a count or a percentage like {example}, got {value!r}")


@dataclass(frozen=True)
class PathSpec:
    """One watched path and its expectations (see policies/paths.yaml for the field notes)."""

    name: str
    path: str
    description: str | None = None
    exists: bool = True
    readable: bool = True
    writable: bool = False
    not_read_only: bool | None = None
    read_file: str | None = None
    min_free_bytes: Any = None
    min_free_inodes: Any = None
    max_latency_seconds: float | None = None
    interval_seconds: float = 30.0
    deadline_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ValueError(f"name: {self.name!r} must match {NAME_RE.pattern} (it is a metric label)")
        if not self.path:
            raise ValueError("path: must not be empty")
        for key in ("interval_seconds", "deadline_seconds"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}: must be > 0")
        if self.max_latency_seconds is not None and self.max_latency_seconds <= 0:
            raise ValueError("max_latency_seconds: must be > 0")
        self.free_bytes_min  # noqa: B018 - validates
        self.free_inodes_min  # noqa: B018

    @property
    def free_bytes_min(self) -> Threshold:
        return parse_threshold(self.min_free_bytes, "min_free_bytes", sizes=True)

    @property
    def free_inodes_min(self) -> Threshold:
        return parse_threshold(self.min_free_inodes, "min_free_inodes", sizes=False)

    @property
    def expanded_path(self) -> str:
        """``path`` with ``~`` and ``$VARS`` expanded (text only; relative paths stay relative)."""
        return os.path.expanduser(os.path.expandvars(self.path))

    @property
    def display_name(self) -> str:
        """How messages name the path: ``description``, else ``checkpoint root`` for ``checkpoint_root``."""
        return self.description or self.name.replace("_", " ")

    def probe_spec(self) -> dict[str, Any]:
        """The JSON-able spec the probe child receives (probe.py's contract)."""
        size, inodes = self.free_bytes_min, self.free_inodes_min
        return {
            "name": self.name,
            "path": self.expanded_path,
            "exists": self.exists,
            "readable": self.readable,
            "writable": self.writable,
            "not_read_only": self.writable if self.not_read_only is None else self.not_read_only,
            "read_file": self.read_file,
            "min_free_bytes": size.absolute,
            "min_free_bytes_percent": size.percent,
            "min_free_inodes": inodes.absolute,
            "min_free_inodes_percent": inodes.percent,
            "max_latency_seconds": self.max_latency_seconds,
        }


@dataclass(frozen=True)
class PathsPolicy:
    """``paths``: the watched paths; ``check_interval_seconds``: how often the sidecar's loop
    starts due probes, collects finished ones and marks overdue ones stuck."""

    paths: tuple[PathSpec, ...]
    check_interval_seconds: float = 0.2

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("paths: list at least one path")
        if self.check_interval_seconds <= 0:
            raise ValueError("check_interval_seconds: must be > 0")
        seen: set[str] = set()
        for i, spec in enumerate(self.paths):
            if spec.name in seen:
                raise ValueError(f"paths[{i}].name: {spec.name!r} is used twice; names must be unique")
            seen.add(spec.name)
