"""Is a ``.pyc`` the compiled form of the source beside it? (stdlib only: runs in worker processes)

A ``.pyc`` matters only if Python would load it instead of compiling the source: for a
timestamp pyc, when its header's source mtime and size match the source; for a hash pyc,
when it is unchecked or its source hash matches. Such a pyc must hold the same code as a
fresh ``compile()`` of the source (code objects compare equal ignoring ``co_filename``).
A stale pyc (header does not match) is never loaded, so it is reported as ``stale``.

``marshal.loads`` of hostile data may crash the interpreter, which is why the auditor runs
this in worker processes for large batches: a crash costs a worker, not the sidecar.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import re

_OPT = re.compile(r"\.opt-(\d)\.pyc$")

OK, STALE, MISMATCH = "ok", "stale", "mismatch"


def _optimize_level(pyc_path: str) -> int:
    m = _OPT.search(pyc_path)
    return int(m.group(1)) if m else 0


def _header_is_current(header: bytes, source: bytes, source_stat: os.stat_result) -> bool:
    """Whether the import system would use this pyc for ``source`` (PEP 552)."""
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:  # hash-based
        if not flags & 0b10:
            return True  # unchecked: loaded whatever the source says
        return header[8:16] == importlib.util.source_hash(source)
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == (int(source_stat.st_mtime) & 0xFFFFFFFF) and size == (source_stat.st_size & 0xFFFFFFFF)


def verify_pyc(pyc_path: str, source_path: str) -> tuple[str, str]:
    """(verdict, reason): verdict is ``ok``, ``stale`` or ``mismatch``. Raises OSError if unreadable."""
    with open(pyc_path, "rb") as fh:
        data = fh.read()
    with open(source_path, "rb") as fh:
        source = fh.read()
        source_stat = os.fstat(fh.fileno())
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return STALE, "different bytecode magic; the import system ignores it"
    if not _header_is_current(data[:16], source, source_stat):
        return STALE, "header does not match the source; the import system recompiles instead"
    try:
        code = marshal.loads(data[16:])
    except (ValueError, EOFError, TypeError) as exc:
        return MISMATCH, f"the .pyc body is not valid bytecode ({exc})"
    try:
        fresh = compile(source, source_path, "exec", dont_inherit=True, optimize=_optimize_level(pyc_path))
    except (SyntaxError, ValueError) as exc:
        return MISMATCH, f"the source does not compile ({exc.__class__.__name__}) but its .pyc would be loaded"
    if fresh != code:
        return MISMATCH, "its code differs from a fresh compile of the source"
    return OK, ""


def verify_batch(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(pyc path, verdict, reason) per pair; an unreadable file gives verdict ``error``."""
    out = []
    for pyc_path, source_path in pairs:
        try:
            verdict, reason = verify_pyc(pyc_path, source_path)
        except OSError as exc:
            verdict, reason = "error", f"cannot read: {exc.strerror or exc}"
        out.append((pyc_path, verdict, reason))
    return out


def main() -> None:
    """Worker entry point: a JSON list of [pyc, source] pairs on stdin, results as JSON on stdout."""
    import json
    import sys

    pairs = [(str(p), str(s)) for p, s in json.load(sys.stdin)]
    json.dump(verify_batch(pairs), sys.stdout)


if __name__ == "__main__":
    main()
