"""safetensors files encoded without copying the tensors: a header, then each tensor's own memory.

``safetensors.torch.save`` builds the whole file as one ``bytes`` (two copies of every tensor);
:func:`encode` returns the header and a memoryview of each tensor instead, so the checkpoint
writer hashes and writes the very bytes it serialised in one pass over memory. The layout is the
safetensors format: an 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
``data_offsets`` of every tensor and ``__metadata__``) padded with spaces to a multiple of 8, then
the tensors back to back; ``safetensors.safe_open`` and ``load_file`` read it.

:func:`decode` is the inverse, for bytes a resume has verified: tensors are views of that buffer
(``torch.frombuffer``, no copy), and the bytes are validated as hostile (in integrity-only mode
whoever can write a file can write the manifest too): every refusal is a :class:`TensorFileError`,
never another exception, a hang or an allocation beyond the buffer's own size.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


BY_NAME: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPES.items()}
HEADER_CAP = 100_000_000
"""The largest header :func:`decode` parses: safetensors' own ``MAX_HEADER_SIZE``."""
SIZE_MAX = (1 << 63) - 1
"""A tensor's dimensions, and the product of them counting a 0 as 1, must fit torch's int64 sizes and
strides (safetensors' own rule, that the product fit a u64, follows from it)."""


class TensorFileError(ValueError):
    """A tensor that the safetensors format cannot hold (its dtype), or bytes that are not a
    safetensors file :func:`decode` accepts; the message names the problem."""


def encode(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> list[memoryview]:
    """The file as a list of buffers: the header, then one view per non-empty tensor (CPU, contiguous;
    the views keep the tensors alive). Tensors are laid out in name order."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    views: list[memoryview] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if tensor.dtype not in DTYPES:
            raise TensorFileError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        tensor = tensor.cpu().contiguous()
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        if size:
            views.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [memoryview(struct.pack("<Q", len(text)) + text), *views]


def decode(buffer: Any) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file in ``buffer`` (a bytes-like object), as views of it.

    Tensors share the buffer's memory (a read-only buffer is copied once first, so no tensor aliases
    immutable bytes); only a tensor whose address is not a multiple of its element size is copied.
    The rules are safetensors' own, or stricter: header length under :data:`HEADER_CAP` and within
    the buffer, a UTF-8 JSON object without duplicate keys, ``__metadata__`` a str -> str map, each
    tensor exactly ``dtype`` (one of :data:`DTYPES`), ``shape`` (non-negative ints, see
    :data:`SIZE_MAX`) and ``data_offsets`` ``[begin, end]`` with ``end - begin`` its byte size, the
    tensors covering the data area exactly, without overlap. Raises TensorFileError naming the problem.
    """
    view = memoryview(buffer).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    length, entries = _header(view)
    start = 8 + length
    spans = _spans(entries, len(view) - start)
    address = torch.frombuffer(view, dtype=torch.uint8).data_ptr() if len(view) else 0
    return {
        name: _tensor(view, address, start + begin, start + end, dtype, shape)
        for name, (dtype, shape, begin, end) in spans
    }


def _header(view: memoryview) -> tuple[int, dict[str, Any]]:
    """(header length, the header's tensor entries) of a safetensors file; TensorFileError."""
    if len(view) < 8:
        raise TensorFileError(f"{len(view)} bytes: shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", view[:8])
    if length > HEADER_CAP:
        raise TensorFileError(f"header of {length} bytes: over the {HEADER_CAP} bytes allowed")
    if 8 + length > len(view):
        raise TensorFileError(f"header of {length} bytes: past the end of the {len(view)}-byte file")
    try:
        header = json.loads(str(view[8 : 8 + length], "utf-8"), object_pairs_hook=_unique)
    except TensorFileError:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TensorFileError(f"header: not UTF-8 JSON ({_short(exc)})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"header: a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(_text(k) and _text(v) for k, v in metadata.items()):
        raise TensorFileError("header: __metadata__ must map strings to strings")
    return length, header


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; TensorFileError for a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TensorFileError(f"header: key {_short(key)} given twice")
        out[key] = value
    return out


def _text(value: object) -> bool:
    """A str that is valid Unicode (JSON lets a lone surrogate through, safetensors does not)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


Span = tuple[torch.dtype, list[int], int, int]


def _spans(entries: dict[str, Any], data_length: int) -> list[tuple[str, Span]]:
    """Every entry checked, in offset order; the spans must tile ``0..data_length`` exactly."""
    spans = sorted(((_entry(name, info), name) for name, info in entries.items()), key=lambda s: s[0][2:])
    position = 0
    for (_, _, begin, end), name in spans:
        if begin != position:
            raise TensorFileError(f"{_short(name)}: data starts at {begin}, not at {position} (a gap or an overlap)")
        position = end
    if position != data_length:
        raise TensorFileError(f"the tensors cover {position} bytes of a {data_length}-byte data area")
    return [(name, span) for span, name in spans]


def _entry(name: str, info: Any) -> Span:
    """(dtype, shape, begin, end) of one header entry; TensorFileError unless it is exactly valid."""
    if not _text(name):
        raise TensorFileError(f"{_short(name)}: not a valid tensor name")
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise TensorFileError(f"{_short(name)}: an entry must be exactly dtype, shape and data_offsets")
    dtype = BY_NAME.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise TensorFileError(f"{_short(name)}: dtype {_short(info['dtype'])} is not one of {sorted(BY_NAME)}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise TensorFileError(f"{_short(name)}: shape {_short(shape)} is not a list of non-negative ints")
    numel, extent = 1, 1
    for dim in shape:
        numel, extent = numel * dim, extent * max(dim, 1)
        if extent > SIZE_MAX:
            raise TensorFileError(f"{_short(name)}: shape {_short(shape)} too large for a tensor")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(o) for o in offsets):
        raise TensorFileError(f"{_short(name)}: data_offsets {_short(offsets)} is not [begin, end]")
    begin, end = offsets
    if end - begin != numel * dtype.itemsize:
        raise TensorFileError(
            f"{_short(name)}: data_offsets {begin}..{end} do not hold {numel} {info['dtype']} elements"
        )
    return dtype, shape, begin, end


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SIZE_MAX


def _tensor(view: memoryview, address: int, begin: int, end: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """``view[begin:end]`` as a tensor of ``dtype`` and ``shape`` (``address``: the buffer's): its own
    storage over that memory (storage offset 0, as torch's state setters assume), a copy only where
    ``begin`` is not a multiple of the element size."""
    if begin == end:
        return torch.empty(shape, dtype=dtype)
    if (address + begin) % dtype.itemsize:
        raw = torch.frombuffer(view, dtype=torch.uint8, count=end - begin, offset=begin).clone()
        return raw.view(dtype).reshape(shape)
    return torch.frombuffer(view, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=begin).reshape(shape)
