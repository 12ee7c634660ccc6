"""The child side of a path probe, and the pure functions that judge what it saw.

This module is standard-library only and has no package-relative imports, so the parent
runs it as a script in a fresh interpreter (``python -I -S probe.py path=/data writable=1``,
see :func:`spec_to_args`): the serving process never touches a watched path. The child
prints ``@step`` progress lines, then one JSON object (a :func:`run_probe` result) and
exits 0; it may hang in the kernel forever, and the parent (scheduler.py) copes with that.
It imports no ``json``, ``re`` or ``typing``: a probe costs about one bare interpreter start.

Steps, in order, each stopping the probe at its first OSError:
``stat`` (exists), ``statvfs`` (free bytes/inodes, the read-only mount flag), ``list``
(a directory's first entries), ``read`` (a small file: ``read_file``, the path itself when
it is a file, or the first regular file listed), ``write`` (create a probe file, write,
fsync, remove it). Then the expectations: not read-only, free space and inodes, latency.

Contract of the result: ``reason`` is ``None`` (healthy) or one of :data:`REASONS`;
``errno``/``errno_name``/``step`` tell where an OSError came from; ``detail`` is a short
human text; the remaining keys are observations (``None`` when not observed).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the child imports as little as it can: it starts once per probe
    from collections.abc import Callable, Mapping
    from typing import Any

# The fixed set of failure reasons (label values of warden_path_failure{reason}).
MISSING = "missing"
PERMISSION = "permission"
READ_ONLY = "read_only"
FULL = "full"
STALE_HANDLE = "stale_handle"
IO_ERROR = "io_error"
DISCONNECTED = "disconnected"
STUCK = "stuck"
SLOW = "slow"
OTHER = "other"
REASONS: tuple[str, ...] = (
    MISSING,
    PERMISSION,
    READ_ONLY,
    FULL,
    STALE_HANDLE,
    IO_ERROR,
    DISCONNECTED,
    STUCK,
    SLOW,
    OTHER,
)

_ERRNO_REASONS: dict[int, str] = {
    errno.ENOENT: MISSING,
    errno.ENOTDIR: MISSING,
    errno.EACCES: PERMISSION,
    errno.EPERM: PERMISSION,
    errno.EROFS: READ_ONLY,
    errno.ENOSPC: FULL,
    errno.EDQUOT: FULL,
    errno.ESTALE: STALE_HANDLE,
    errno.EIO: IO_ERROR,
    errno.EREMOTEIO: IO_ERROR,
    errno.ENXIO: IO_ERROR,
    errno.ENOTCONN: DISCONNECTED,
    errno.ECONNABORTED: DISCONNECTED,
    errno.ECONNREFUSED: DISCONNECTED,
    errno.ECONNRESET: DISCONNECTED,
    errno.EHOSTDOWN: DISCONNECTED,
    errno.EHOSTUNREACH: DISCONNECTED,
    errno.ENETUNREACH: DISCONNECTED,
    errno.ETIMEDOUT: DISCONNECTED,
    errno.ENOLINK: DISCONNECTED,
    errno.ESHUTDOWN: DISCONNECTED,
    errno.ENODEV: DISCONNECTED,
}

LIST_LIMIT = 64  # directory entries looked at, at most
READ_BYTES = 4096  # bytes read from the small file
PROBE_PAYLOAD = b"warden path probe\n"
PROBE_PREFIX = ".warden-probe-"
STALE_PROBE_SECONDS = 600.0  # probe files of this host older than this were left by killed probes
STALE_SCAN_LIMIT = 256


def classify_errno(err: int | None) -> str:
    """The failure reason of an errno: ENOENT -> missing, EROFS -> read_only, ...; unknown -> other."""
    if err is None:
        return OTHER
    return _ERRNO_REASONS.get(err, OTHER)


def errno_name(err: int | None) -> str | None:
    """``EROFS`` for errno.EROFS; None for None; ``E<n>`` for a number Python does not know."""
    if err is None:
        return None
    return errno.errorcode.get(err, f"E{err}")


def percent(part: int | None, whole: int | None) -> float | None:
    """``part`` as a percentage of ``whole``; None when either is unknown or ``whole`` is 0."""
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def observe(spec: Mapping[str, Any], progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the probe steps on ``spec["path"]``; never raises OSError (it is recorded instead).

    ``spec`` keys used: path, exists, readable, writable, read_file. ``progress(step)`` is
    called before each step (the child reports it so a stuck probe names its step).
    Returns the observations plus ``error`` = (step, errno, strerror) or None.
    """
    report = progress or (lambda step: None)
    path = str(spec["path"])
    obs: dict[str, Any] = {
        "path": path,
        "realpath": None,
        "dev": None,
        "is_dir": None,
        "free_bytes": None,
        "total_bytes": None,
        "free_inodes": None,
        "total_inodes": None,
        "read_only": None,
        "read_target": None,
        "error": None,
    }
    started = time.monotonic()
    step = "stat"
    try:
        report(step)
        st = os.stat(path)
        obs["dev"] = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        obs["is_dir"] = stat.S_ISDIR(st.st_mode)
        obs["realpath"] = os.path.realpath(path)
        step = "statvfs"
        report(step)
        vfs = os.statvfs(path)
        obs["free_bytes"] = vfs.f_bavail * vfs.f_frsize
        obs["total_bytes"] = vfs.f_blocks * vfs.f_frsize
        obs["free_inodes"] = vfs.f_favail if vfs.f_files else None
        obs["total_inodes"] = vfs.f_files or None
        obs["read_only"] = bool(vfs.f_flag & os.ST_RDONLY)
        if spec.get("readable", True):
            step = "list"
            report(step)
            candidates = _list(path) if obs["is_dir"] else []
            step = "read"
            target = _read_target(spec, path, obs["is_dir"], candidates)
            if target is not None:
                report(step)
                obs["read_target"] = target
                _read_small(target)
        if spec.get("writable", False):
            step = "write"
            report(step)
            _write_probe(path, obs["is_dir"])
    except OSError as exc:
        obs["error"] = (step, exc.errno, exc.strerror or str(exc))
    obs["duration_seconds"] = time.monotonic() - started
    return obs


def _list(path: str) -> list[str]:
    """Names of regular files among the first LIST_LIMIT entries (d_type, no extra stat mostly)."""
    files = []
    with os.scandir(path) as it:
        for i, entry in enumerate(it):
            if i >= LIST_LIMIT:
                break
            if not entry.name.startswith(PROBE_PREFIX) and entry.is_file(follow_symlinks=False):
                files.append(entry.path)
    return files


def _read_target(spec: Mapping[str, Any], path: str, is_dir: bool, candidates: list[str]) -> str | None:
    read_file = spec.get("read_file")
    if read_file:
        return os.path.join(path, str(read_file)) if is_dir else str(read_file)
    if not is_dir:
        return path
    return candidates[0] if candidates else None


def _read_small(target: str) -> None:
    # No O_NONBLOCK: a FIFO or a hung server blocks here, which is exactly what we detect.
    fd = os.open(target, os.O_RDONLY | os.O_NOCTTY)
    try:
        os.read(fd, READ_BYTES)
    finally:
        os.close(fd)


def _write_probe(path: str, is_dir: bool) -> None:
    """Creates, writes, fsyncs and removes a probe file (for a file path: opens it for append)."""
    if not is_dir:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY))
        return
    prefix = f"{PROBE_PREFIX}{os.uname().nodename}-"
    name = os.path.join(path, f"{prefix}{os.getpid()}")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOCTTY, 0o600)
    created = True
    try:
        os.write(fd, PROBE_PAYLOAD)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.unlink(name)
        created = False
    finally:
        if fd >= 0:
            os.close(fd)
        if created:
            _unlink_quietly(name)
    _remove_stale_probes(path, prefix)


def _remove_stale_probes(path: str, prefix: str) -> None:
    """Removes this host's probe files that a killed (stuck) probe could not remove; best effort."""
    now = time.time()
    try:
        with os.scandir(path) as it:
            for i, entry in enumerate(it):
                if i >= STALE_SCAN_LIMIT:
                    break
                if entry.name.startswith(prefix):
                    try:
                        if now - entry.stat(follow_symlinks=False).st_mtime > STALE_PROBE_SECONDS:
                            os.unlink(entry.path)
                    except OSError:
                        continue
    except OSError:
        return


def _unlink_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        return


STEP_WORDS = {
    "stat": "looking it up",
    "statvfs": "reading free space (statvfs)",
    "list": "listing the directory",
    "read": "reading a small file",
    "write": "creating, writing and fsyncing a probe file",
}


def evaluate(spec: Mapping[str, Any], obs: Mapping[str, Any]) -> dict[str, Any]:
    """Judges observations against the expectations in ``spec``; pure.

    Returns ``obs`` plus ``reason`` (None when healthy), ``errno``, ``errno_name``,
    ``step`` and ``detail``. Precedence: an OSError, then read-only, full, slow.
    """
    out: dict[str, Any] = {k: v for k, v in obs.items() if k != "error"}
    out.update(reason=None, errno=None, errno_name=None, step=None, detail="ok")
    error = obs.get("error")
    if error is not None:
        step, err, text = error
        reason = classify_errno(err)
        if reason == MISSING and step == "stat" and not spec.get("exists", True):
            out["detail"] = "absent, which the policy allows (exists: false)"
            return out
        where = STEP_WORDS.get(step, step)
        target = f" {obs['read_target']}" if step == "read" and obs.get("read_target") else ""
        out.update(
            reason=reason,
            errno=err,
            errno_name=errno_name(err),
            step=step,
            detail=f"{str(text).lower()} ({errno_name(err)}) while {where}{target}",
        )
        return out
    if obs.get("read_only") and spec.get("not_read_only", spec.get("writable", False)):
        out.update(reason=READ_ONLY, step="statvfs", detail="mounted read-only (ST_RDONLY)")
        return out
    full = _full_detail(spec, obs)
    if full:
        out.update(reason=FULL, step="statvfs", detail=full)
        return out
    limit = spec.get("max_latency_seconds")
    took = obs.get("duration_seconds")
    if limit is not None and took is not None and took > float(limit):
        out.update(reason=SLOW, detail=f"probe took {took:.3f}s, over max_latency_seconds {float(limit):g}")
    return out


def _full_detail(spec: Mapping[str, Any], obs: Mapping[str, Any]) -> str | None:
    """The first free-space threshold that is not met, as text; None when all are met."""
    checks = (
        ("free_bytes", "total_bytes", "min_free_bytes", "min_free_bytes_percent", "bytes"),
        ("free_inodes", "total_inodes", "min_free_inodes", "min_free_inodes_percent", "inodes"),
    )
    for free_key, total_key, abs_key, pct_key, unit in checks:
        free, total = obs.get(free_key), obs.get(total_key)
        minimum = spec.get(abs_key)
        if minimum is not None and free is not None and free < int(minimum):
            return f"{free} {unit} free, below {abs_key} {int(minimum)}"
        min_pct = spec.get(pct_key)
        share = percent(free, total)
        if min_pct is not None and share is not None and share < float(min_pct):
            return f"{share:.2f}% of {unit} free, below {pct_key} {float(min_pct):g}%"
    return None


def run_probe(spec: Mapping[str, Any], progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """:func:`observe` then :func:`evaluate`: what the child prints."""
    return evaluate(spec, observe(spec, progress))


def _report_step(step: str) -> None:
    sys.stdout.write(f"@{step}\n")
    sys.stdout.flush()


BOOL_KEYS = frozenset({"exists", "readable", "writable", "not_read_only"})
INT_KEYS = frozenset({"min_free_bytes", "min_free_inodes"})
FLOAT_KEYS = frozenset({"min_free_bytes_percent", "min_free_inodes_percent", "max_latency_seconds"})
STR_KEYS = frozenset({"name", "path", "read_file"})


def spec_to_args(spec: Mapping[str, Any]) -> list[str]:
    """The child's argv for ``spec``: ``key=value`` words, None values left out."""
    args = []
    for key, value in spec.items():
        if value is None:
            continue
        if key in BOOL_KEYS:
            value = "1" if value else "0"
        args.append(f"{key}={value}")
    return args


def args_to_spec(args: list[str]) -> dict[str, Any]:
    """Parses :func:`spec_to_args` words; raises ValueError on an unknown key or a bad value."""
    spec: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {arg!r}")
        if key in BOOL_KEYS:
            if raw not in ("0", "1", "true", "false"):
                raise ValueError(f"{key}: expected 0 or 1, got {raw!r}")
            spec[key] = raw in ("1", "true")
        elif key in INT_KEYS:
            spec[key] = int(raw)
        elif key in FLOAT_KEYS:
            spec[key] = float(raw)
        elif key in STR_KEYS:
            spec[key] = raw
        else:
            raise ValueError(f"unknown key {key!r}")
    if "path" not in spec:
        raise ValueError("path=... is required")
    return spec


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t"})


def _json_str(text: str) -> str:
    out = text.translate(_ESCAPES)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from undecodable file names
        out = "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else f"\\u{ord(c):04x}" for c in out)
    return f'"{out}"'


def to_json(value: Any) -> str:
    """JSON text of None/bool/int/float/str/list/tuple/dict, without importing ``json``."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else "null"
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_str(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    return _json_str(str(value))


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``probe.py key=value...`` prints the result as one JSON line, exits 0.

    Exit 2 on a malformed spec; an unexpected crash exits non-zero, and the parent
    reports that as an incomplete probe.
    """
    try:
        spec = args_to_spec(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        sys.stderr.write(f"usage: probe.py path=PATH [writable=1 ...] ({exc})\n")
        return 2
    result = run_probe(spec, _report_step)
    sys.stdout.write(to_json(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
