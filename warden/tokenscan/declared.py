"""What a directory's config files declare: the special tokens and the vocabulary.

Pure functions of a :class:`~.snapshot.Snapshot`'s parsed JSON (and, for the vocabulary, the
shared cache of :class:`~.resources.ScanResources`: a 150k-entry set is built once per content).
"""

from __future__ import annotations

from typing import Any

from warden.tokenscan.resources import ScanResources
from warden.tokenscan.snapshot import Snapshot

SPECIAL_NAMES = ("bos", "eos", "pad", "unk", "cls", "sep")
SET_ENTRY_WEIGHT = 100  # bytes per entry of a set of short strings (the entry, the string object)


def token(value: Any) -> str | None:
    """The text of a token as configs write it (a string, or an object with ``content``), or None."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _declared(config: dict[str, Any], smap: dict[str, Any], name: str) -> str | None:
    """The loader's value of ``<name>_token``: special_tokens_map.json's replaces the config's
    unless the config has ``added_tokens_decoder`` (transformers 4.50+ and 5.x; see
    :func:`~.loader_files.special_token_sources`; a disagreement is TS1006)."""
    first, second = (config, smap) if "added_tokens_decoder" in config else (smap, config)
    key = f"{name}_token"
    return token(first.get(key)) if key in first else token(second.get(key))


def _overridden(config: dict[str, Any], smap: dict[str, Any]) -> dict[str, str]:
    """``<name>(other)`` -> the value of the file that loses where both set ``<name>_token``
    differently: some loader (a version, a path without the legacy merge) may still use it, so
    it is judged as a special token too."""
    out: dict[str, str] = {}
    for name in SPECIAL_NAMES:
        values = {t for t in (token(config.get(f"{name}_token")), token(smap.get(f"{name}_token"))) if t}
        values.discard(_declared(config, smap, name))  # type: ignore[arg-type]
        out |= {f"{name}(other)": v for v in sorted(values)}
    return out


def config_tokens(snap: Snapshot) -> dict[str, str | None]:
    """The special tokens the config files declare (tokenizer_config.json and
    special_tokens_map.json, as the loader merges them): what the tokenizer child is asked
    about. Known before tokenizer.json is parsed, so the child can load it meanwhile."""
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    tokens: dict[str, str | None] = {n: _declared(config, smap, n) for n in SPECIAL_NAMES}
    tokens |= _overridden(config, smap)
    extra = [t for t in (token(t) for t in as_list(config.get("additional_special_tokens"))) if t]
    return tokens | {f"additional[{i}]": t for i, t in enumerate(extra)}


def special_tokens(snap: Snapshot) -> None:
    """Fills ``snap.special_tokens`` and ``snap.extra_special`` from the configs and tokenizer.json."""
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    for name in SPECIAL_NAMES:
        snap.special_tokens[name] = _declared(config, smap, name)
    extra: list[str | None] = list(_overridden(config, smap).values())
    extra += [token(t) for t in as_list(config.get("additional_special_tokens"))]
    tok = snap.top("tokenizer.json") or {}
    extra += [token(t) for t in as_list(tok.get("added_tokens")) if isinstance(t, dict) and t.get("special")]
    snap.extra_special = tuple(t for t in extra if t)


def declared_tokens(snap: Snapshot) -> dict[str, str | None]:
    tokens = dict(snap.special_tokens)
    tokens |= {f"additional[{i}]": t for i, t in enumerate(snap.extra_special)}
    return tokens


def specials(snap: Snapshot) -> tuple[str, ...]:
    return tuple(v for v in snap.special_tokens.values() if v) + snap.extra_special


def _tokenizer_vocab(tok: dict[str, Any]) -> frozenset[str]:
    vocab: set[str] = set()
    raw = as_dict(tok.get("model")).get("vocab")
    if isinstance(raw, dict):
        vocab.update(map(str, raw))
    elif isinstance(raw, list):
        vocab.update(str(p[0]) for p in raw if isinstance(p, list) and p)
    vocab.update(t for t in (token(a) for a in as_list(tok.get("added_tokens"))) if t)
    return frozenset(vocab)


def _set_weight(value: frozenset[str]) -> int:
    return SET_ENTRY_WEIGHT * len(value)


def vocabulary(snap: Snapshot, pieces: set[str], res: ScanResources) -> None:
    """Fills ``snap.vocabulary``: tokenizer.json's, vocab.json's, vocab.txt's, added tokens,
    sentencepiece ``pieces``."""
    parts: list[frozenset[str]] = [frozenset(pieces)] if pieces else []
    tok = snap.top("tokenizer.json")
    if tok is not None:
        digest = snap.digests.get("tokenizer.json", "")
        parts.append(res.memo.get_or_make(("vocab", digest), lambda: _tokenizer_vocab(tok), nbytes=_set_weight))
    for name in ("vocab.json", "added_tokens.json"):
        doc = snap.top(name)
        if doc is not None:
            make = lambda d=doc: frozenset(map(str, d))  # noqa: E731
            parts.append(res.memo.get_or_make(("keys", snap.digests.get(name, "")), make, nbytes=_set_weight))
    if "vocab.txt" in snap.vocab_lines:  # a slow WordPiece layout: the vocabulary is its lines
        lines = snap.vocab_lines["vocab.txt"]
        make_lines = lambda: frozenset(t for t in lines if t)  # noqa: E731
        parts.append(res.memo.get_or_make(("lines", snap.digests.get("vocab.txt", "")), make_lines, nbytes=_set_weight))
    decoder = (snap.top("tokenizer_config.json") or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict):
        parts.append(frozenset(t for t in (token(v) for v in decoder.values()) if t))
    # one part (the usual tokenizer.json) is used as is: no copy of a 150k-entry set per scan
    snap.vocabulary = None if not parts else parts[0] if len(parts) == 1 else frozenset().union(*parts)
