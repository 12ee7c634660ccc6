"""Sentencepiece's precompiled charsmap, decoded and judged (pure; issue 33).

Layout: a little-endian uint32 ``n``, then ``n`` bytes of a double-array trie (uint32 units)
over the UTF-8 bytes of the input sequences, then a pool of NUL-terminated replacement strings;
a leaf's value is the offset of its replacement in the pool. Unit bits: 0-7 label, 8 has-leaf,
9 offset scale, 10-30 offset, 31 value unit. :func:`mappings` walks the trie from its root
(bounded); :func:`mapping_problem` applies the normaliser rule: a mapping may only do what
Unicode compatibility normalisation, case folding, whitespace and control-character removal do.
"""

from __future__ import annotations

import functools
import struct
import unicodedata
from collections.abc import Iterator

MAX_MAPPINGS = 1_000_000
MAX_KEY_BYTES = 64


class CharsmapError(ValueError):
    """The blob is not a precompiled charsmap."""


def _offset(unit: int) -> int:
    return (unit >> 10) << ((unit & (1 << 9)) >> 6)


def mappings(blob: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(input bytes, replacement bytes) of every entry; raises CharsmapError when malformed."""
    if len(blob) < 4:
        raise CharsmapError("shorter than its length header")
    size = struct.unpack_from("<I", blob)[0]
    if size % 4 or 4 + size > len(blob):
        raise CharsmapError(f"trie of {size} bytes does not fit the {len(blob)}-byte blob")
    units = struct.unpack_from(f"<{size // 4}I", blob, 4)
    pool = blob[4 + size :]
    if not units:
        return
    children: dict[int, list[int]] = {}  # base -> positions whose label leads there (one pass)
    for pos, unit in enumerate(units):
        label = unit & 0xFF
        if label and not unit >> 31:
            children.setdefault(pos ^ label, []).append(pos)
    stack = [(b"", _offset(units[0]))]  # (key so far, base of its children)
    count = 0
    while stack:
        key, base = stack.pop()
        if len(key) >= MAX_KEY_BYTES:
            raise CharsmapError("a key longer than the walk allows")
        for pos in children.get(base, ()):  # shared subtrees (a DAWG) are walked per path; MAX_KEY_BYTES bounds cycles
            unit = units[pos]
            child_key, child_base = key + bytes([pos ^ base]), pos ^ _offset(unit)
            if (unit >> 8) & 1:
                if child_base >= len(units):
                    raise CharsmapError("a leaf outside the trie")
                start = units[child_base] & ((1 << 31) - 1)
                end = pool.find(b"\0", start)
                if start >= len(pool) or end < 0:
                    raise CharsmapError("a replacement outside the string pool")
                count += 1
                if count > MAX_MAPPINGS:
                    raise CharsmapError(f"more than {MAX_MAPPINGS} mappings")
                yield child_key, pool[start:end]
            stack.append((child_key, child_base))


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def _removable(text: str) -> bool:
    """Whitespace, controls, format characters and unassigned marks: removing or spacing them is allowed."""
    return all(
        ch.isspace()
        or ch in "\ufffd\u2581"
        or unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Co", "Cn")
        for ch in text
    )


def _kept(text: str) -> str:
    """``text`` folded, without the characters a normaliser may remove (:func:`_removable`)."""
    return "".join(ch for ch in _fold(text) if not _removable(ch))


def _unassigned_problem(source: str, target: str) -> str | None:
    """A source holding characters newer than this Python's Unicode data (a charsmap built from a
    later Unicode, as sentencepiece's own nmt_nfkc maps U+1CCD6 OUTLINED LATIN CAPITAL A to 'A')
    is judged by its target, as a normal form's image can be: at most one character for each new
    character, every known character of the source kept, one word. A target of several words or
    letters beyond that (an emoji mapped to a sentence) is more than a normalisation."""
    new = sum(1 for ch in source if unicodedata.category(ch) == "Cn")
    known, kept = _kept("".join(ch for ch in source if unicodedata.category(ch) != "Cn")), _kept(target)
    rest = list(kept)
    for ch in known:
        if ch not in rest:
            return f"maps {source!r} to {target!r} (drops {ch!r} of the source)"
        rest.remove(ch)
    if len(rest) > new or len(_fold(target).split()) > 1:
        return f"maps {source!r} (unassigned here) to {target!r} (more than a normal form's image)"
    return None


def mapping_problem(key: bytes, value: bytes) -> str | None:
    """Why mapping ``key`` to ``value`` changes letters, digits or words, or None."""
    try:
        source, target = key.decode("utf-8"), value.decode("utf-8")
    except UnicodeDecodeError:
        return f"maps {key!r} to {value!r} (not UTF-8)"
    if target == unicodedata.normalize("NFKC", source):
        return None
    if any(unicodedata.category(ch) == "Cn" for ch in source):
        return _unassigned_problem(source, target)
    if _fold(source) == _fold(target) or _fold(source).split() == _fold(target).split():
        return None
    if _removable(source) and (not target or target.isspace()):
        return None
    if _kept(source) == _kept(target):
        return None
    return f"maps {source!r} to {target!r} (beyond Unicode normal forms, case and whitespace)"


def one_char_mappings(blob: bytes) -> dict[str, str]:
    """source -> target of every mapping of one character (empty when the blob is malformed):
    the part of the map a vocabulary entry can be checked against character by character."""
    out: dict[str, str] = {}
    try:
        for key, value in mappings(blob):
            try:
                source, target = key.decode("utf-8"), value.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(source) == 1:
                out[source] = target
    except CharsmapError:
        return {}
    return out


@functools.lru_cache(maxsize=16)
def charsmap_problem(blob: bytes, limit: int = 3) -> str | None:
    """The first ``limit`` mappings that rewrite text, joined, or why the blob is not readable
    (cached: every copy of a tokenizer carries the same charsmap; ~0.6 s for nmt_nfkc's)."""
    found = []
    try:
        for key, value in mappings(blob):
            why = mapping_problem(key, value)
            if why:
                found.append(why)
                if len(found) >= limit:
                    break
    except CharsmapError as exc:
        return f"precompiled charsmap not readable: {exc}"
    return "Precompiled charsmap " + "; ".join(found) if found else None
