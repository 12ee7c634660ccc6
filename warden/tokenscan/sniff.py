"""Content sniffing: what a file *is*, whatever its name says.

:func:`magic_kind` classifies the first bytes (pure); :func:`sniff_file` opens the file and
goes one level deeper where the format can carry code: every pickle stream is analysed
with :mod:`.pickle_scan` (never loaded), zip archives (``torch.save``'s format) are listed
and their pickle and ``.npy`` members analysed, NPY headers are parsed and an object
dtype's pickle payload analysed. Reads are bounded by the caller's ``pickle_cap``.
"""

from __future__ import annotations

import ast
import io
import json
import struct
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from warden.safeio import open_regular
from warden.tokenscan.pickle_scan import (
    PickleReport,
    is_confirmed_pickle,
    looks_like_pickle,
    scan_pickles,
)

Opener = Callable[[], BinaryIO]  # a new file object of the sniffed file, at offset 0

HEAD_BYTES = 4096
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")
MACHO_MAGICS = (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe")
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
MAX_ZIP_MEMBERS = 100_000


@dataclass(frozen=True)
class PickleHit:
    """A pickle found in a file: ``where`` is ``""`` (the file), a zip member, or ``npy data``."""

    where: str
    report: PickleReport


@dataclass(frozen=True)
class Sniff:
    """``kind``: empty, safetensors, zip, npy, pickle, elf, macho, pe, gguf, text or binary.
    ``also``: other formats the same bytes are (a safetensors/pickle polyglot, a zip tail);
    ``problems``: why part of the content could not be analysed (a finding, never "safe")."""

    kind: str
    detail: str = ""
    pickles: tuple[PickleHit, ...] = ()
    npy_object: tuple[str, ...] = ()
    error: str | None = None
    problems: tuple[str, ...] = ()
    also: tuple[str, ...] = ()


@dataclass
class Budget:
    """Bytes per pickle stream (``cap``) and a monotonic ``deadline`` for one file."""

    cap: int
    deadline: float = float("inf")

    def spent(self) -> bool:
        return time.monotonic() > self.deadline


def _is_pe(head: bytes) -> bool:
    if not head.startswith(b"MZ") or len(head) < 64:
        return False
    offset = int.from_bytes(head[60:64], "little")
    return head[offset : offset + 4] == b"PE\0\0"


def magic_kind(head: bytes) -> str:
    """The format the first bytes announce: zip, npy, pickle (protocol 2-5), elf, macho, pe,
    gguf, safetensors-candidate, text, binary or empty. Protocol 0/1 pickles have no magic:
    :func:`sniff_file` confirms them by parsing."""
    if not head:
        return "empty"
    if head.startswith(ZIP_MAGICS):
        return "zip"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.startswith(b"\x7fELF"):
        return "elf"
    if head.startswith(MACHO_MAGICS):
        return "macho"
    if _is_pe(head):
        return "pe"
    if head.startswith(b"GGUF"):
        return "gguf"
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= MAX_SAFETENSORS_HEADER:
        return "safetensors-candidate"
    return "text" if _looks_text(head) else "binary"


def _looks_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # a multi-byte character cut by the head
    return True


def safetensors_header(fh: BinaryIO, size: int) -> dict[str, Any] | None:
    """The parsed JSON header of a safetensors file, None when it is not one."""
    fh.seek(0)
    raw = fh.read(8)
    if len(raw) < 8:
        return None
    (length,) = struct.unpack("<Q", raw)
    if length < 2 or length > min(MAX_SAFETENSORS_HEADER, size - 8):
        return None
    try:
        header = json.loads(fh.read(length))
    except (ValueError, UnicodeDecodeError):
        return None  # RecursionError (a header nested 100k deep) propagates: the caller reports it
    return header if isinstance(header, dict) else None


def parse_npy_header(data: bytes) -> tuple[dict[str, Any], int]:
    """(header dict, offset of the array data) of NPY bytes; raises ValueError."""
    if not data.startswith(NPY_MAGIC) or len(data) < 10:
        raise ValueError("not an NPY file")
    major = data[6]
    if major == 1:
        length, start = int.from_bytes(data[8:10], "little"), 10
    elif major in (2, 3):
        length, start = int.from_bytes(data[8:12], "little"), 12
    else:
        raise ValueError(f"unknown NPY version {major}")
    text = data[start : start + length].decode("utf-8" if major == 3 else "latin-1")
    header = ast.literal_eval(text)
    if not isinstance(header, dict) or "descr" not in header:
        raise ValueError("NPY header is not a dict with 'descr'")
    return header, start + length


def descr_has_object(descr: Any) -> bool:
    """Whether a NumPy dtype description (``'|O'``, structured lists) contains an object field."""
    if isinstance(descr, str):
        return descr.lstrip("<>|=").startswith("O")
    if isinstance(descr, (list, tuple)):
        return any(descr_has_object(part) for part in descr)
    return False


def _npy_findings(fh: BinaryIO, where: str, budget: Budget) -> tuple[bool, list[PickleHit]]:
    head = fh.read(HEAD_BYTES * 16)
    header, offset = parse_npy_header(head)
    if not descr_has_object(header["descr"]):
        return False, []
    rest = io.BytesIO(head[offset:])
    stream = io.BufferedReader(_Chain(rest, fh))  # type: ignore[arg-type]
    reports = scan_pickles(stream, budget.cap, deadline=budget.deadline)  # type: ignore[arg-type]
    return True, [PickleHit(where or "npy data", r) for r in reports]


class _Chain(io.RawIOBase):
    """Reads ``first`` then ``second`` (the NPY header read-ahead, then the rest of the file)."""

    def __init__(self, first: BinaryIO, second: BinaryIO) -> None:
        self.parts = [first, second]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.parts:
            data = self.parts[0].read(len(buffer))
            if data:
                buffer[: len(data)] = data
                return len(data)
            self.parts.pop(0)
        return 0


NPY_ERRORS = (ValueError, SyntaxError, MemoryError, RecursionError, TypeError, KeyError, UnicodeDecodeError)


def _zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget) -> tuple[list[PickleHit], bool, str | None]:
    """(pickle hits, object NPY?, analysis problem) of one archive member."""
    with zf.open(info) as member:
        head = member.read(16)
    if head.startswith(NPY_MAGIC):
        try:
            with zf.open(info) as member:
                is_obj, found = _npy_findings(member, info.filename, budget)  # type: ignore[arg-type]
        except NPY_ERRORS as exc:
            return [], False, f"{info.filename}: NPY header unreadable ({type(exc).__name__})"
        return found, is_obj, None
    if info.filename.endswith(".pkl") or looks_like_pickle(head):
        with zf.open(info) as member:
            reports = scan_pickles(member, budget.cap, deadline=budget.deadline)  # type: ignore[arg-type]
        if info.filename.endswith(".pkl") or is_confirmed_pickle(reports[0], head):
            return [PickleHit(info.filename, r) for r in reports], False, None
        return [], False, None
    return [], False, None


def _sniff_zip(opener: Opener, budget: Budget) -> Sniff:
    hits: list[PickleHit] = []
    objects: list[str] = []
    problems: list[str] = []
    try:
        with opener() as raw, zipfile.ZipFile(raw) as zf:
            members = zf.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                problems.append(f"more than {MAX_ZIP_MEMBERS} members; the rest not analysed")
            for info in members[:MAX_ZIP_MEMBERS]:
                if info.is_dir():
                    continue
                if budget.spent():
                    problems.append(f"time budget spent at member {info.filename!r}; the rest not analysed")
                    break
                found, is_obj, problem = _zip_member(zf, info, budget)
                hits += found
                objects += [info.filename] if is_obj else []
                problems += [problem] if problem else []
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError, OSError) as exc:
        return Sniff("zip", error=f"archive unreadable: {exc}"[:200])
    detail = f"{len(members)} members"
    return Sniff("zip", detail, tuple(hits), tuple(objects), problems=tuple(problems))


def _pickle_at_start(fh: BinaryIO, head: bytes, budget: Budget) -> tuple[PickleHit, ...]:
    """Pickle streams at offset 0 (where pickle.load and torch.load's legacy path read),
    whatever else the file also parses as; empty when parsing does not confirm a pickle."""
    if not looks_like_pickle(head):
        return ()
    fh.seek(0)
    reports = scan_pickles(fh, budget.cap, deadline=budget.deadline)
    if not is_confirmed_pickle(reports[0], head):
        return ()
    return tuple(PickleHit("", r) for r in reports)


def sniff_file(path: str, size: int, cap: int, budget: Budget | None = None, opener: Opener | None = None) -> Sniff:
    """Sniffs the file at ``path`` (already known to be a regular file inside the scan).

    Every file is tried as a pickle at offset 0 and as a zip (end of central directory,
    what torch.load looks for), whatever its first bytes also are. Raises OSError when it
    cannot be read (the scan is then incomplete). ``opener``: how to open it (each call a new file
    object at offset 0; default: :func:`~warden.safeio.open_regular` of ``path``)."""
    budget = budget or Budget(cap)
    opener = opener or (lambda: open_regular(path))
    with opener() as fh:
        head = fh.read(HEAD_BYTES)
        kind = magic_kind(head)
        problems: tuple[str, ...] = ()
        if kind == "safetensors-candidate":
            try:
                header = safetensors_header(fh, size)
            except RecursionError:
                header, problems = None, ("safetensors header nested too deeply to parse",)
            kind = "safetensors" if header is not None else "binary"
        if kind == "zip":
            return _sniff_zip(opener, budget)
        if kind == "npy":
            fh.seek(0)
            try:
                is_obj, hits = _npy_findings(fh, "", budget)
            except NPY_ERRORS as exc:
                return Sniff("npy", error=f"NPY header unreadable: {type(exc).__name__}: {exc}"[:200])
            return Sniff("npy", "object dtype" if is_obj else "", tuple(hits), ("",) if is_obj else ())
        pickles = _pickle_at_start(fh, head, budget)
        if pickles and kind in ("text", "binary", "pickle"):
            return Sniff("pickle", f"{len(pickles)} pickle stream(s)", pickles, problems=problems)
    if size > 22 and _has_zip_tail(opener):
        inner = _sniff_zip(opener, budget)
        return Sniff(kind, f"{kind} with a zip archive at its end", pickles + inner.pickles, inner.npy_object,
                     inner.error, ("zip", *problems, *inner.problems))  # fmt: skip
    return Sniff(kind, "", pickles, problems=problems, also=("pickle",) if pickles else ())


def _has_zip_tail(opener: Opener) -> bool:
    try:
        with opener() as fh:
            return zipfile.is_zipfile(fh)
    except OSError:
        return False
