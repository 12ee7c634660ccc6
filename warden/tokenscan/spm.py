"""A minimal protobuf wire-format walker that validates sentencepiece ``ModelProto`` files.

No sentencepiece or protobuf package is needed. ``ModelProto`` (sentencepiece_model.proto):
1 ``pieces`` (repeated message: 1 piece string, 2 score float, 3 type enum), 2 trainer_spec,
3 normalizer_spec, 4 self_test_data, 5 denormalizer_spec (messages), extensions 200+.
A valid file is consumed exactly, uses only those fields with their wire types, and has at
least one piece whose text is UTF-8. Everything here is pure.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_MODEL_FIELDS = {1: LEN, 2: LEN, 3: LEN, 4: LEN, 5: LEN}
_PIECE_FIELDS = {1: LEN, 2: I32, 3: VARINT}


class ProtobufError(ValueError):
    """The bytes are not valid protobuf wire format, or not a sentencepiece model."""


NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class SentencePieceModel:
    """What validation learned: the pieces' text (for the special-token check), and each
    piece's score and type (id = position; for the id-order check)."""

    pieces: tuple[str, ...]
    scores: tuple[float, ...] = ()
    types: tuple[int, ...] = ()
    charsmaps: tuple[bytes, ...] = ()  # precompiled_charsmap of normalizer_spec, denormalizer_spec


def order_problem(model: SentencePieceModel) -> str | None:
    """Sentencepiece's trainers (unigram and BPE alike) store the normal pieces by descending
    score, so ids follow the trained order; two pieces whose ids were swapped break it. A piece
    text stored twice (two ids for one piece) breaks it too."""
    last, last_piece = float("inf"), ""
    seen: dict[str, int] = {}
    for ident, (piece, score, kind) in enumerate(zip(model.pieces, model.scores, model.types, strict=False)):
        if piece in seen:
            return f"piece {piece!r} has ids {seen[piece]} and {ident}"
        seen[piece] = ident
        if kind != NORMAL:
            continue
        if score > last:
            where = f"piece {piece!r} (id {ident}, score {score:.3f}) follows {last_piece!r} (score {last:.3f})"
            return f"{where}: ids not in score order"
        last, last_piece = score, piece
    return None


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; at most 10 bytes."""
    value = 0
    for i in range(10):
        if pos >= len(data):
            raise ProtobufError(f"varint runs past the end at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos
    raise ProtobufError(f"varint longer than 10 bytes before byte {pos}")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of one message; raises ProtobufError."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = read_varint(data, pos)
            yield number, wire, value
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if pos + width > len(data):
                raise ProtobufError(f"fixed-width field {number} runs past the end")
            yield number, wire, data[pos : pos + width]
            pos += width
        elif wire == LEN:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError(f"field {number} declares {length} bytes, only {len(data) - pos} remain")
            yield number, wire, data[pos : pos + length]
            pos += length
        else:
            raise ProtobufError(f"field {number} uses unsupported wire type {wire} (groups are not allowed)")


def check_message(data: bytes) -> None:
    """Raises ProtobufError unless ``data`` is valid wire format (one message level)."""
    for _field in fields(data):
        pass


def _piece(data: bytes) -> tuple[str, float, int]:
    text, score, kind = None, 0.0, NORMAL
    for number, wire, value in fields(data):
        expected = _PIECE_FIELDS.get(number)
        if expected is not None and wire != expected:
            raise ProtobufError(f"piece field {number} has wire type {wire}, expected {expected}")
        if number == 1:
            assert isinstance(value, bytes)
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtobufError("a piece is not valid UTF-8") from None
        elif number == 2 and isinstance(value, bytes):
            score = struct.unpack("<f", value)[0]
        elif number == 3 and isinstance(value, int):
            if not 1 <= value <= 6:
                raise ProtobufError(f"piece type {value} is not a sentencepiece type (1..6)")
            kind = value
    if text is None:
        raise ProtobufError("a piece has no text (field 1)")
    return text, score, kind


def parse_sentencepiece(data: bytes) -> SentencePieceModel:
    """Validates a sentencepiece model; raises ProtobufError naming the first problem."""
    if not data:
        raise ProtobufError("empty file")
    pieces: list[tuple[str, float, int]] = []
    charsmaps: list[bytes] = []
    for number, wire, value in fields(data):
        expected = _MODEL_FIELDS.get(number)
        if expected is None and number < 200:
            raise ProtobufError(f"field {number} is not part of a sentencepiece ModelProto")
        if expected is not None and wire != expected:
            raise ProtobufError(f"field {number} has wire type {wire}, expected {expected}")
        if number == 1:
            assert isinstance(value, bytes)
            pieces.append(_piece(value))
        elif number in (2, 3, 5):
            assert isinstance(value, bytes)
            check_message(value)
            if number in (3, 5):  # NormalizerSpec: field 2 is precompiled_charsmap
                charsmaps += [v for n, w, v in fields(value) if n == 2 and w == LEN and isinstance(v, bytes) and v]
    if not pieces:
        raise ProtobufError("no pieces (field 1) in the model")
    texts, scores, kinds = zip(*pieces, strict=True)
    return SentencePieceModel(tuple(texts), tuple(scores), tuple(kinds), tuple(charsmaps))


def encode_varint(value: int) -> bytes:
    """Inverse of :func:`read_varint` (tests and fixtures build models with it)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_field(number: int, wire: int, payload: bytes | int) -> bytes:
    """One encoded field: ``payload`` is an int for VARINT, raw bytes otherwise."""
    key = encode_varint(number << 3 | wire)
    if wire == VARINT:
        assert isinstance(payload, int)
        return key + encode_varint(payload)
    assert isinstance(payload, bytes)
    if wire == LEN:
        return key + encode_varint(len(payload)) + payload
    return key + payload
