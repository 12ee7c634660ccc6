"""Is a ``.pyc`` the compiled form of the source beside it? (stdlib + warden.safeio: runs in worker processes)

A ``.pyc`` matters only if Python would load it instead of compiling the source: for a
timestamp pyc, when its header's source mtime and size match the source; for a hash pyc,
when it is unchecked or its source hash matches. Such a pyc must hold the same code as a
fresh ``compile()`` of the source (code objects compare equal ignoring ``co_filename``).
A stale pyc (header does not match) is never loaded, so it is reported as ``stale``.

The PEP 552 source hash in a checked-hash header says only that the import system will
*load* the pyc for this source; it says nothing about the body (anyone can write the right
hash in front of other bytecode), so it never replaces the compile. What makes a full pass
cheap is :func:`verdict_key`: the verdict of a pair is a function of the pyc's bytes, the
source's bytes, the compiling interpreter and the optimisation level, so an ``ok`` verdict is
cached under the digests of exactly the bytes the worker verified (returned with the verdict).

``marshal.loads`` of hostile data may crash the interpreter, which is why the auditor runs
this in worker processes: a crash costs a worker, not the sidecar. Files are opened with
``warden.safeio`` (no link followed, a FIFO never blocks, capped).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import os
import re
import sys

if not __package__:  # run as a script by the auditor (python -I): put the package root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from warden.safeio import open_regular

_OPT = re.compile(r"\.opt-([0-9])\.pyc\Z")
MAX_BYTES = 64 * 1024 * 1024

OK, STALE, MISMATCH, ERROR = "ok", "stale", "mismatch", "error"


def optimize_level(pyc_path: str) -> int:
    m = _OPT.search(pyc_path)
    return int(m.group(1)) if m else 0


def record_form(data: bytes) -> str:
    """``sha256=urlsafe-b64-nopad`` of ``data``, the form RECORD (and the integrity cache) uses."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def interpreter_id() -> str:
    """What decides the result of ``compile()`` here: version, build and bytecode magic."""
    return f"{sys.version}|{sys.implementation.cache_tag}|{importlib.util.MAGIC_NUMBER.hex()}"


def verdict_key(pyc_digest: str, source_digest: str, interpreter: str, optimize: int) -> str:
    """The cache key of a pair's verdict: every input of the comparison, nothing else."""
    material = "\0".join((pyc_digest, source_digest, interpreter, str(optimize)))
    return hashlib.sha256(material.encode()).hexdigest()


def header_state(header: bytes, source_mtime: int, source_size: int) -> str:
    """``stale`` (never loaded), ``current`` (loaded), or ``source_hash`` (a checked-hash pyc:
    loaded only if its hash equals :func:`importlib.util.source_hash` of the source) (PEP 552)."""
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return "stale"
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:  # hash-based
        return "source_hash" if flags & 0b10 else "current"  # unchecked: loaded whatever the source says
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    current = mtime == (source_mtime & 0xFFFFFFFF) and size == (source_size & 0xFFFFFFFF)
    return "current" if current else "stale"


def is_loaded(header: bytes, source: bytes | None, source_mtime: int, source_size: int) -> bool | None:
    """Whether the import system would use this pyc; None when that needs ``source`` and it was not given."""
    state = header_state(header, source_mtime, source_size)
    if state != "source_hash":
        return state == "current"
    if source is None:
        return None
    return header[8:16] == importlib.util.source_hash(source)


def verify_bytes(data: bytes, source: bytes, mtime: int, size: int, source_path: str, optimize: int) -> tuple[str, str]:
    """(verdict, reason) of pyc bytes ``data`` against ``source`` (whose stat gave ``mtime``, ``size``)."""
    if not is_loaded(data[:16], source, mtime, size):
        return STALE, "header does not match the source; the import system recompiles instead"
    try:
        code = marshal.loads(data[16:])
    except (ValueError, EOFError, TypeError) as exc:
        return MISMATCH, f"the .pyc body is not valid bytecode ({exc})"
    try:
        fresh = compile(source, source_path, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError) as exc:
        return MISMATCH, f"the source does not compile ({exc.__class__.__name__}) but its .pyc would be loaded"
    if fresh != code:
        return MISMATCH, "its code differs from a fresh compile of the source"
    return OK, ""


def read_pair(pyc_path: str, source_path: str) -> tuple[bytes, bytes, int, int]:
    """(pyc bytes, source bytes, source mtime, source size), both regular files read without
    following a link. Raises OSError (warden.safeio.UnsafeFile for a link or special file)."""
    with open_regular(pyc_path, max_bytes=MAX_BYTES) as fh:
        data = fh.read(MAX_BYTES)
    with open_regular(source_path, max_bytes=MAX_BYTES) as fh:
        source = fh.read(MAX_BYTES)
        st = os.fstat(fh.fileno())
    return data, source, int(st.st_mtime), st.st_size


def verify_pyc(pyc_path: str, source_path: str) -> tuple[str, str, str, str]:
    """(verdict, reason, pyc digest, source digest) of the bytes read. Raises OSError if unreadable."""
    data, source, mtime, size = read_pair(pyc_path, source_path)
    verdict, reason = verify_bytes(data, source, mtime, size, source_path, optimize_level(pyc_path))
    return verdict, reason, record_form(data), record_form(source)


def verify_batch(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str, str, str]]:
    """(pyc path, verdict, reason, pyc digest, source digest) per pair; unreadable: verdict ``error``."""
    out = []
    for pyc_path, source_path in pairs:
        try:
            out.append((pyc_path, *verify_pyc(pyc_path, source_path)))
        except OSError as exc:
            out.append((pyc_path, ERROR, f"cannot read: {exc.strerror or exc}", "", ""))
    return out


def main() -> None:
    """Worker entry point: a JSON list of [pyc, source] pairs on stdin, results as JSON on stdout."""
    import json

    pairs = [(str(p), str(s)) for p, s in json.load(sys.stdin)]
    json.dump(verify_batch(pairs), sys.stdout)


if __name__ == "__main__":
    main()
