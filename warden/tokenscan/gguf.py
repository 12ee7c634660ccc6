"""A bounded, iterative reader of GGUF metadata (the key/value header before the tensors).

Only what the scanner needs: string values of chosen keys (``tokenizer.chat_template``,
``tokenizer.chat_template.*``). Arrays are skipped element by element without recursion
(nested arrays are refused), every length is checked against the bytes left, and the
number of keys is capped. Raises :class:`GGUFError` for anything malformed.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

MAX_KEYS = 1_000_000
MAX_STRING = 64 << 20
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


class GGUFError(ValueError):
    """The bytes are not a well-formed GGUF header."""


class _Reader:
    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.left = fh, size

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.left:
            raise GGUFError(f"a field of {n} bytes runs past the end of the file")
        data = self.fh.read(n)
        if len(data) != n:
            raise GGUFError("the file is shorter than its header says")
        self.left -= n
        return data

    def skip(self, n: int) -> None:
        if n < 0 or n > self.left:
            raise GGUFError(f"a field of {n} bytes runs past the end of the file")
        self.fh.seek(n, 1)
        self.left -= n

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, keep: bool = True) -> str | None:
        n = self.u64()
        if n > MAX_STRING:
            raise GGUFError(f"a string of {n} bytes")
        if not keep:
            self.skip(n)
            return None
        return self.take(n).decode("utf-8", "replace")

    def skip_value(self, kind: int) -> None:
        if kind in _FIXED:
            self.skip(_FIXED[kind])
        elif kind == STRING:
            self.string(keep=False)
        elif kind == ARRAY:
            inner, count = self.u32(), self.u64()
            if inner == ARRAY:
                raise GGUFError("nested arrays are not supported")
            if inner in _FIXED:
                self.skip(_FIXED[inner] * count)
            elif inner == STRING:
                if count * 8 > self.left:
                    raise GGUFError(f"an array of {count} strings runs past the end")
                for _ in range(count):
                    self.string(keep=False)
            else:
                raise GGUFError(f"unknown array element type {inner}")
        else:
            raise GGUFError(f"unknown value type {kind}")


def read_strings(fh: BinaryIO, size: int, prefix: str = "tokenizer.chat_template") -> dict[str, str]:
    """String values of the metadata keys starting with ``prefix``; raises GGUFError."""
    r = _Reader(fh, size)
    if r.take(4) != b"GGUF":
        raise GGUFError("no GGUF magic")
    version = r.u32()
    if version not in (1, 2, 3):
        raise GGUFError(f"unknown GGUF version {version}")
    if version == 1:
        _tensors, keys = r.u32(), r.u32()
    else:
        _tensors, keys = r.u64(), r.u64()
    if keys > MAX_KEYS:
        raise GGUFError(f"{keys} metadata keys")
    out: dict[str, str] = {}
    for _ in range(keys):
        key = r.string() or ""
        kind = r.u32()
        if kind == STRING and key.startswith(prefix):
            out[key] = r.string() or ""
        else:
            r.skip_value(kind)
    return out
