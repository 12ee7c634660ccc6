"""Exercises a tokenizer in a child process: ``python -I tokenizer_child.py MEMORY``.

Started and kept as a worker by :mod:`.tokenizer_behaviour` (same line protocol as
``sandbox_child.py``). Loads ``tokenizer.json`` with ``tokenizers`` (``Tokenizer.from_str``:
no repository code runs) or a sentencepiece model with ``sentencepiece`` (from bytes), then
encodes every sample of the request's corpus. Native code can panic (``PanicException`` is a
BaseException), abort or hang: the first is caught here, the others end the process and the
parent reports a timeout or a crash. Memory is bounded by ``RLIMIT_AS``; native threads are off.

    request: {"id", "op": "tokenizer" | "sentencepiece", "path", "sha256", "size",
              "corpus": [str], "alphabet": str (optional), "tokens": {name: token}, "timeout": seconds}
    answer:  {"id", "status": "ok" | "load_error" | "panic" | "changed", "message",
              "samples": [{"ids", "ids_special", "decoded", "unk_chars", "byte_chars", "unk_words", "seconds"}],
              "alphabet": [[char, decoded, lost]] (when the request names an "alphabet": each character
              encoded alone and decoded; lost: "unk" or "bytes" when the tokenizer can only write it as
              its unknown token or as byte-fallback pieces, else ""),
              "token_ids": {token: id | null}, "token_pieces": {token: [ids]}, "added": [[content, id, special]],
              "model": model class name, "unk_token": text of the unknown token | null}
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import stat
import sys
import time
from collections.abc import Callable
from typing import Any


def _limit_process(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


class Changed(Exception):
    """The file is not the one the scan saw (swapped, grown, or not a regular file)."""


def read_checked(request: dict[str, Any]) -> bytes:
    """The bytes at ``path`` (no final symlink, no FIFO), only if their SHA-256 is ``sha256``."""
    try:
        fd = os.open(request["path"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # the scan opened it: it was removed, or replaced by a link
        raise Changed(f"the file cannot be opened any more ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(int(request["size"]) + 1)
    finally:
        os.close(fd)
    if hashlib.sha256(data).hexdigest() != request["sha256"]:
        raise Changed("the file changed after it was read by the scan")
    return data


def _unk_chars(encode: Any, unk: int | None, sample: str, ids: list[int]) -> str:
    """Characters of ``sample`` that the tokenizer maps to its unknown token (alone, a character
    may also get a word-start piece such as T5's '▁')."""
    if unk is None or unk not in ids:
        return ""
    return "".join(ch for ch in sorted(set(sample)) if unk in encode(ch))


def _unk_words(encode: Any, unk: int | None, words: list[str], ids: list[int]) -> list[str]:
    """The pre-tokenized words of a sample the tokenizer writes as its unknown token alone
    (WordPiece's rule for a word it cannot segment, a word longer than its limit)."""
    if unk is None or unk not in ids:
        return []
    return [w for w in words[:512] if encode(w) == [unk]]


def _is_byte_piece(piece: Any) -> bool:
    return isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


def _byte_chars(encode: Any, piece: Callable[[int], Any], sample: str, ids: list[int]) -> str:
    """Characters of ``sample`` the tokenizer can only write as byte-fallback pieces (``<0xE2>``):
    outside its vocabulary, kept as bytes (a decoder without ByteFallback shows the pieces)."""
    if not any(_is_byte_piece(piece(i)) for i in ids):
        return ""
    out = []
    for ch in sorted(set(sample)):
        if ch.isspace():
            continue
        pieces = [piece(i) for i in encode(ch)]
        if any(_is_byte_piece(p) for p in pieces) and all(_is_byte_piece(p) or p in ("\u2581", " ") for p in pieces):
            out.append(ch)
    return "".join(out)


def _answer(
    request: dict[str, Any],
    encode: Callable[[str], list[int]],
    encode_special: Callable[[str], list[int]] | None,
    decode: Callable[[list[int]], str],
    token_id: Callable[[str], int | None],
    unk: int | None,
    added: list[list[Any]],
    piece: Callable[[int], Any] = lambda _i: None,
    model: str = "",
    words: Callable[[str], list[str]] = str.split,
    decode_all: Callable[[list[int]], str] | None = None,
) -> dict[str, Any]:
    """The ``ok`` answer: every corpus sample encoded (``encode_special`` None: a tokenizer that
    adds no special tokens, the plain ids), decoded and timed, the request's tokens looked up, and
    each alphabet character encoded alone and decoded by ``decode_all`` (special pieces kept)."""
    samples = []
    for text in request["corpus"]:
        start = time.monotonic()
        ids = encode(text)
        samples.append(
            {
                "ids": ids,
                "ids_special": encode_special(text) if encode_special is not None else ids,
                "decoded": decode(ids),
                "unk_chars": _unk_chars(encode, unk, text, ids),
                "byte_chars": _byte_chars(encode, piece, text, ids),
                "unk_words": _unk_words(encode, unk, words(text), ids),
                "seconds": round(time.monotonic() - start, 4),
            }
        )
    tokens = {t: token_id(t) for t in request["tokens"].values() if t}
    pieces = {t: encode(t) for t in request["tokens"].values() if t}
    unk_text = piece(unk) if unk is not None else None
    chars = str(request.get("alphabet") or "")[:4096]
    alphabet = _alphabet(chars, encode, decode_all or decode, unk, piece)
    return {"status": "ok", "samples": samples, "token_ids": tokens, "token_pieces": pieces, "added": added,
            "model": model, "unk_token": unk_text if isinstance(unk_text, str) else None,
            "alphabet": alphabet}  # fmt: skip


def _alphabet(
    chars: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], unk: int | None, piece: Any
) -> list[list[str]]:
    """[char, decode(encode(char)), lost] for every character of ``chars`` (lost: "unk" when the
    tokenizer writes it with its unknown token, "bytes" when only as byte-fallback pieces)."""
    out = []
    for ch in dict.fromkeys(chars):
        ids = encode(ch)
        lost = "unk" if unk is not None and unk in ids else "bytes" if _byte_chars(encode, piece, ch, ids) else ""
        out.append([ch, decode(ids), lost])
    return out


FLAGS = ("single_word", "lstrip", "rstrip", "normalized")
MAX_ADDED = 1 << 16  # added tokens loaded from the config and matched inside text (more: reported, unchecked)


def _add_loader_tokens(tok: Any, entries: Any) -> None:
    """The added tokens the loader adds from the config (``added_tokens_decoder``: ``[content,
    special, flags]``), those tokenizer.json lacks, added as transformers adds them."""
    from tokenizers import AddedToken

    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    new = []
    for entry in entries[:MAX_ADDED] if isinstance(entries, list) else ():
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and entry[0]):
            continue
        if entry[0] in have:
            continue
        flags = {k: bool(v) for k, v in (entry[2] or {}).items() if k in FLAGS} if isinstance(entry[2], dict) else {}
        new.append(AddedToken(entry[0], special=bool(entry[1]), **flags))
        have.add(entry[0])
    if new:
        tok.add_tokens(new)


def _unmatched(tok: Any) -> list[str]:
    """The special added tokens not matched where they stand between two letters (``x<tok>x``):
    text the template puts right after a word is then plain text, not that token."""
    out = []
    for t in list(tok.get_added_tokens_decoder().values())[:MAX_ADDED]:
        ident = tok.token_to_id(t.content)
        inside = t.special and t.content.strip() and ident is not None
        if inside and ident not in tok.encode(f"x{t.content}x", add_special_tokens=False).ids:
            out.append(t.content)
    return out


def _hf(request: dict[str, Any]) -> dict[str, Any]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return {"status": "unavailable", "message": "tokenizers is not installed"}

    tok = Tokenizer.from_str(read_checked(request).decode("utf-8", "replace"))
    _add_loader_tokens(tok, request.get("loader_added"))
    added = [[t.content, tok.token_to_id(t.content), bool(t.special)] for t in tok.get_added_tokens_decoder().values()]
    unk_name = getattr(tok.model, "unk_token", None) or request["tokens"].get("unk")
    unk = tok.token_to_id(unk_name) if isinstance(unk_name, str) else None
    if unk is None and isinstance(getattr(tok.model, "unk_id", None), int):
        unk = tok.model.unk_id

    def encode(text: str, special: bool = False) -> list[int]:
        return list(tok.encode(text, add_special_tokens=special).ids)

    def encode_special(text: str) -> list[int]:
        return encode(text, True)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    def decode_all(ids: list[int]) -> str:  # byte pieces may be special added tokens (they are text)
        return tok.decode(ids, skip_special_tokens=False)

    def words(text: str) -> list[str]:
        normal = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
        split = tok.pre_tokenizer.pre_tokenize_str(normal) if tok.pre_tokenizer is not None else None
        return [w for w, _span in split] if split is not None else normal.split()

    model = type(tok.model).__name__
    piece = tok.id_to_token
    answer = _answer(
        request, encode, encode_special, decode, tok.token_to_id, unk, added, piece, model, words, decode_all
    )
    answer["unmatched"] = _unmatched(tok)
    total = len(tok.get_added_tokens_decoder())
    if total > MAX_ADDED or (
        isinstance(request.get("loader_added"), list) and len(request["loader_added"]) > MAX_ADDED
    ):
        answer["unchecked"] = f"{total} added tokens: past {MAX_ADDED} not matched inside text or loaded"
    return answer


def _spm(request: dict[str, Any]) -> dict[str, Any]:
    try:
        import sentencepiece
    except ImportError:
        return {"status": "unavailable", "message": "sentencepiece is not installed"}

    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(read_checked(request))
    unk = sp.unk_id()

    def encode(text: str) -> list[int]:
        return list(sp.EncodeAsIds(text))

    def piece(ident: int) -> str | None:
        return str(sp.IdToPiece(ident)) if 0 <= ident < sp.GetPieceSize() else None

    return _answer(request, encode, None, sp.DecodeIds, sp.PieceToId, unk, [], piece, "sentencepiece")


def serve_one(request: dict[str, Any]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        result = _spm(request) if request.get("op") == "sentencepiece" else _hf(request)
    except Changed as exc:  # not an answer about the content asked about: the parent retries next scan
        result = {"status": "changed", "message": str(exc)}
    except Exception as exc:  # a malformed file: tokenizers/sentencepiece refuse it
        result = {"status": "load_error", "message": f"{type(exc).__name__}: {exc}"[:300]}
    except BaseException as exc:  # pyo3's PanicException (a native panic) is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        result = {"status": "panic", "message": f"{type(exc).__name__}: {exc}"[:300]}
    result.update(id=request.get("id"), seconds=round(time.monotonic() - start, 4))
    return result


def main() -> int:
    sys.path.extend(sys.argv[2:])  # started with -I -S: the parent names where its libraries live
    _limit_process(int(sys.argv[1]))
    for line in sys.stdin:
        result = serve_one(json.loads(line))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
