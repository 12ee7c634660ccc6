"""trainer/tensorfile.py: encode / decode round trips, and decode against hostile bytes.

decode must accept what encode and safetensors write (every dtype of DTYPES), give what
``safetensors.torch.load`` gives, and on any other bytes either return or raise TensorFileError:
never another exception, and never accept what safetensors itself refuses.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from trainer.tensorfile import DTYPES, TensorFileError, decode, encode  # noqa: E402

EXAMPLES = int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6).filter(
    lambda n: n != "__metadata__"
)
SHAPES = st.lists(st.integers(0, 5), max_size=3)


def raw_bytes(tensor):
    """A tensor's bytes (float8 has no torch.equal; NaNs compare by bit pattern)."""
    return bytes(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def same(got, expected) -> bool:
    return set(got) == set(expected) and all(
        got[k].dtype == expected[k].dtype
        and tuple(got[k].shape) == tuple(expected[k].shape)
        and raw_bytes(got[k]) == raw_bytes(expected[k])
        for k in expected
    )


@st.composite
def tensors(draw, dtype=None):
    """A tensor of ``dtype`` (else any of DTYPES) of random shape and random bytes."""
    dtype = dtype or draw(st.sampled_from(sorted(DTYPES, key=str)))
    shape = draw(SHAPES)
    numel = 1
    for dim in shape:
        numel *= dim
    data = bytearray(draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize)))
    if dtype == torch.bool:
        data = bytearray(b % 2 for b in data)
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.clone().reshape(shape)


TENSOR_DICTS = st.dictionaries(NAMES, tensors(), max_size=5)
METADATA = st.one_of(st.none(), st.dictionaries(NAMES, st.text(max_size=5), max_size=3))


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("dtype", sorted(DTYPES, key=str), ids=str)
@FUZZ
@given(data=st.data())
def test_every_dtype_round_trips_through_encode_and_safetensors(dtype, data):
    named = data.draw(st.dictionaries(NAMES, tensors(dtype), min_size=1, max_size=3))
    metadata = data.draw(METADATA)
    assert same(decode(joined(encode(named, metadata))), named)
    written = safetensors_torch.save(named, metadata)
    got = decode(bytearray(written))
    assert same(got, named)
    assert same(got, safetensors_torch.load(written))


def within(tensor, buffer) -> bool:
    base = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    return base <= tensor.data_ptr() < base + len(buffer)


def test_tensors_are_views_of_the_buffer_and_misaligned_ones_are_copies():
    buffer = bytearray(joined(encode({"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)})))
    decoded = decode(buffer)
    assert within(decoded["a"], buffer) and within(decoded["b"], buffer)
    buffer[-8:] = bytes(8)  # the tail of the buffer is "b": the tensor sees it
    assert torch.equal(decoded["b"], torch.zeros(2))
    text = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    text += b" " * ((-len(text) % 8) + 1)  # data starts at an address that is not a multiple of 4
    unaligned = bytearray(struct.pack("<Q", len(text)) + text + struct.pack("<2f", 1.5, -2.0))
    copied = decode(unaligned)["x"]
    assert copied.tolist() == [1.5, -2.0]
    assert not within(copied, unaligned)


def test_each_tensor_starts_its_own_storage_as_torchs_state_setters_assume():
    """torch.set_rng_state reads a state tensor from its storage's start: a view at an offset into one
    storage of the whole file is refused (or worse), so each tensor has a storage of its own."""
    state = torch.get_rng_state()
    decoded = decode(bytearray(joined(encode({"a": torch.ones(3), "state": state}))))
    assert decoded["state"].storage_offset() == 0
    torch.set_rng_state(decoded["state"])
    assert torch.equal(torch.get_rng_state(), state)


def header_file(header: object, data: bytes, pad: int = 0) -> bytes:
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\x01\x00", "shorter than the 8-byte header length"),
        (struct.pack("<Q", 100_000_001) + b"{}", "over the 100000000 bytes allowed"),
        (struct.pack("<Q", 50) + b"{}", "past the end"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "not UTF-8 JSON"),
        (header_file([1], b""), "a JSON list, not an object"),
        (struct.pack("<Q", 14) + b'{"a":1, "a":2}', "key 'a' given twice"),
        (header_file({"__metadata__": {"k": 1}}, b""), "__metadata__ must map strings to strings"),
        (header_file({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 0}}, b"...."), "exactly"),
        (header_file({"t": {"dtype": "U16", "shape": [1], "data_offsets": [0, 2]}}, b".."), "dtype 'U16'"),
        (header_file({"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b""), "non-negative"),
        (header_file({"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"."), "non-negative"),
        (header_file({"t": {"dtype": "U8", "shape": [0, 1 << 62, 4], "data_offsets": [0, 0]}}, b""), "too large"),
        (header_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0]}}, b".."), "is not [begin, end]"),
        (header_file({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"...."), "do not hold 2"),
        (
            header_file(
                {
                    "t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                    "u": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
                },
                b"...",
            ),
            "data starts at 1, not at 2",
        ),
        (header_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"..."), "cover 2 bytes of a 3"),
        (header_file({"t\ud800": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}}, b"."), "not a valid tensor"),
    ],
)
def test_each_violation_is_named(raw, why):
    with pytest.raises(TensorFileError, match=why.replace("[", r"\[").replace("]", r"\]")):
        decode(raw)


# -- hostile bytes ----------------------------------------------------------------------------
@st.composite
def valid_files(draw) -> bytes:
    named = draw(TENSOR_DICTS)
    if draw(st.booleans()):
        return joined(encode(named, draw(METADATA)))
    return safetensors_torch.save(named, draw(METADATA))


ODD_VALUES = st.one_of(
    st.integers(-3, 1 << 65), st.booleans(), st.none(), st.floats(allow_nan=True), st.text(max_size=3)
)


@st.composite
def random_headers(draw) -> bytes:
    """A header of random entries laid out mostly consistently, each field sometimes replaced."""
    header: dict[str, object] = {}
    offset = 0
    for name in draw(st.lists(NAMES, max_size=4, unique=True)):
        dtype = draw(st.sampled_from(sorted(DTYPES, key=str)))
        shape = draw(SHAPES)
        size = dtype.itemsize
        for dim in shape:
            size *= dim
        entry: dict[str, object] = {"dtype": DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
        for key in ("dtype", "shape", "data_offsets"):
            if draw(st.integers(0, 9)) == 0:
                entry[key] = draw(st.one_of(ODD_VALUES, st.lists(ODD_VALUES, max_size=3)))
        if draw(st.integers(0, 19)) == 0:
            entry["extra"] = 1
        header[name] = entry
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(NAMES, st.one_of(st.text(max_size=3), ODD_VALUES), max_size=2))
    data = draw(st.binary(min_size=max(0, offset - 2), max_size=offset + 2))
    return header_file(header, data, draw(st.integers(0, 9)))


@st.composite
def mutated(draw, source) -> bytes:
    raw = bytearray(draw(source))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "append", "length"]))
        if kind == "flip" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del raw[draw(st.integers(0, len(raw))) :]
        elif kind == "append":
            raw += draw(st.binary(min_size=1, max_size=16))
        elif len(raw) >= 8:
            (length,) = struct.unpack("<Q", raw[:8])
            changed = draw(st.one_of(st.integers(length - 9, length + 9), st.integers(0, (1 << 64) - 1)))
            raw[:8] = struct.pack("<Q", changed % (1 << 64))
    return bytes(raw)


@FUZZ
@given(raw=st.one_of(mutated(valid_files()), mutated(random_headers()), st.binary(max_size=64)))
def test_hostile_bytes_are_refused_at_least_where_safetensors_refuses(raw):
    try:
        got = decode(raw)
    except TensorFileError:
        got = None
    try:
        expected = safetensors_torch.load(raw)
    except Exception:  # whatever safetensors raises for bytes it refuses
        expected = None
    if expected is None:
        assert got is None, "decode accepted bytes safetensors refuses"
    elif got is not None:
        assert same(got, expected)
