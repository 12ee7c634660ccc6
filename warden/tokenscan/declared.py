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


STANDARD_NAMES = (*SPECIAL_NAMES, "mask")  # transformers' SPECIAL_TOKENS_ATTRIBUTES, without "_token"


def _named_extras(doc: dict[str, Any]) -> dict[str, str]:
    """name (without ``_token``) -> token of one config's model-specific named special tokens:
    every other ``<name>_token`` key holding a token, and ``extra_special_tokens`` as a mapping
    (transformers 5 ``_set_model_specific_special_tokens``; the mapping wins on a clash)."""
    out: dict[str, str] = {}
    for key, value in doc.items():
        name = str(key).removesuffix("_token")
        if str(key).endswith("_token") and name not in STANDARD_NAMES and (text := token(value)):
            out[name] = text
    extra = doc.get("extra_special_tokens")
    for key, value in as_dict(extra).items():
        if (text := token(value)) is not None:
            out[str(key).removesuffix("_token")] = text
    return out


def _unnamed_extras(doc: dict[str, Any]) -> list[str]:
    """One config's unnamed special tokens: ``extra_special_tokens`` as a list, else the
    deprecated ``additional_special_tokens`` it replaces (transformers 5 reads it as the list)."""
    extra = doc.get("extra_special_tokens")
    listed = extra if isinstance(extra, list) and extra else as_list(doc.get("additional_special_tokens"))
    return [t for t in (token(v) for v in listed) if t]


def loader_special_tokens(
    config: dict[str, Any], smap: dict[str, Any], tok: dict[str, Any] | None = None
) -> dict[str, str]:
    """Every token transformers 5 loads as special, name -> token: the standard ones (bos, eos,
    pad, unk, cls, sep, mask; special_tokens_map.json's replace the config's without
    ``added_tokens_decoder``, :func:`_declared`), each model-specific ``<name>_token`` and named
    ``extra_special_tokens`` (``image`` for ``image_token``), the unnamed ``extra[i]`` (the list
    form, ``additional_special_tokens``; the map's merged in on the legacy path), the losing
    value of a disagreement (``<name>(other)``), tokenizer.json's padding ``pad_token`` where no
    pad is declared, and ``added[i]``: every added token marked special (tokenizer.json's
    ``added_tokens``, the config's ``added_tokens_decoder``). ``tok``: the parsed tokenizer.json."""
    out: dict[str, str] = {n: t for n in STANDARD_NAMES if (t := _declared(config, smap, n))}
    legacy = "added_tokens_decoder" not in config
    named = _named_extras(config) | (_named_extras(smap) if legacy else {})
    out |= {n: t for n, t in named.items() if n not in out}
    out |= _overridden(config, smap)
    unnamed = _unnamed_extras(config) + (_unnamed_extras(smap) if legacy else [])
    out |= {f"extra[{i}]": t for i, t in enumerate(dict.fromkeys(unnamed))}
    padding = as_dict((tok or {}).get("padding"))
    if "pad" not in out and (pad := token(padding.get("pad_token"))):
        out["pad"] = pad  # TokenizersBackend: pad_token defaults to the padding block's
    added = [a for a in as_list((tok or {}).get("added_tokens")) if isinstance(a, dict) and a.get("special")]
    added += [
        a for a in as_dict(config.get("added_tokens_decoder")).values() if isinstance(a, dict) and a.get("special")
    ]
    out |= {f"added[{i}]": t for i, t in enumerate(dict.fromkeys(t for t in map(token, added) if t))}
    return out


def config_tokens(snap: Snapshot) -> dict[str, str | None]:
    """The special tokens the config files declare (:func:`loader_special_tokens` of
    tokenizer_config.json and special_tokens_map.json, without tokenizer.json's): what the
    tokenizer child is asked about. Known before tokenizer.json is parsed, so the child can load
    it meanwhile."""
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    resolved = loader_special_tokens(config, smap)
    tokens: dict[str, str | None] = {n: resolved.get(n) for n in SPECIAL_NAMES}
    return tokens | {n: t for n, t in resolved.items() if n not in SPECIAL_NAMES and not n.startswith("added[")}


def special_tokens(snap: Snapshot) -> None:
    """Fills ``snap.special_tokens`` (bos, eos, pad, unk, cls, sep) and ``snap.extra_special``
    (every other token the loader treats as special) from :func:`loader_special_tokens`: the one
    resolution every special-token check consumes."""
    config = snap.top("tokenizer_config.json") or {}
    smap = snap.top("special_tokens_map.json") or {}
    resolved = loader_special_tokens(config, smap, snap.top("tokenizer.json"))
    for name in SPECIAL_NAMES:
        snap.special_tokens[name] = resolved.get(name)
    snap.extra_special = tuple(t for n, t in resolved.items() if n not in SPECIAL_NAMES)


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
