"""safetensors files encoded without copying the tensors: a header, then each tensor's own memory.

``safetensors.torch.save`` builds the whole file as one ``bytes`` (two copies of every tensor);
:func:`encode` returns the header and a memoryview of each tensor instead, so the checkpoint
writer hashes and writes the very bytes it serialised in one pass over memory. The layout is the
safetensors format: an 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
``data_offsets`` of every tensor and ``__metadata__``) padded with spaces to a multiple of 8, then
the tensors back to back; ``safetensors.safe_open`` and ``load_file`` read it.
"""

from __future__ import annotations

import json
import struct

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


class TensorFileError(ValueError):
    """A tensor that the safetensors format cannot hold (its dtype), named."""


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
