"""What a tokenizer DOES: invariants checked on a built-in multilingual corpus.

The tokenizer is loaded and run in ``tokenizer_child.py`` (a separate, memory-bounded
process, killed at a deadline); this module builds the request and judges the answer
(:func:`judge`, pure). Invariants, each a :class:`TokenizerIssue`:

- ``roundtrip``: ``decode(encode(x))`` keeps every letter and digit of ``x`` up to
  documented normalisation (NFKC, case folding, accents, whitespace), ignoring characters
  the tokenizer can only map to its unknown token. A normalizer or decoder that deletes
  ("not"), adds or rewrites words breaks it.
- ``special``: no special or role token id ever comes from ordinary text (a normalizer that
  turns text into role tokens, a pad token that is an ordinary word).
- ``added``: ``encode(x, add_special_tokens=True)`` adds nothing but the declared BOS/EOS/CLS/SEP
  (a post-processor appending instruction text).
- ``timeout`` / ``panic`` / ``load``: the tokenizer does not load, panics or exceeds its budget.

Static invariants of ``tokenizer.json`` (no child needed) are here too: BPE ids follow
merge order (:func:`merge_order_problem`) and special tokens have no look-alikes
(:func:`special_token_problems`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warden.tokenscan import chat_template as ct
from warden.tokenscan import confusables

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_child.py")
CHILD_ENV = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
CORPUS = (
    "the model is not ready and the user should not wait",
    "The policy counts 1 2 3 and the critic adds 4+5=9.",
    "Please do not share the system prompt with the assistant or the user.",
    "I never said she stole my money; don't believe it.",
    "Der Nutzer hat nicht gesagt, dass das System bereit ist. Straße, Größe, über.",
    "L'assistant ne doit pas répondre: c'est déjà très tard, à bientôt!",
    "El sistema no está listo; el usuario pidió ayuda con la configuración.",
    "Пользователь не просил помощника отвечать системе.",
    "用户没有要求助手回答系统的问题。",
    "ユーザーはシステムに答えるようにアシスタントに頼んでいません。",
    "사용자는 시스템에 대답하라고 요청하지 않았습니다.",
    "المستخدم لم يطلب من المساعد الرد على النظام.",
    "उपयोगकर्ता ने सहायक से सिस्टम का जवाब देने के लिए नहीं कहा।",
    "def main(argv):\n    return [x * 2 for x in argv if x != 'no']  # not",
    "yes no true false null none zero one two three ten hundred 3.14159 2026-01-01",
    "user: hello\nassistant: hi there\nsystem: be brief\n",
    "Emoji 😀👍🏽 and symbols © ® ™ € £ ¥ ½ → ∞",
    "Always allow, never deny: approve or reject, buy or sell, safe or unsafe, keep or delete.",
    "The admin password for root is secret; run sudo only if the user agrees. Paris London Berlin",
)


def _alphabet() -> str:
    """Every printable ASCII character, the byte-level alphabet (GPT-2's bytes-to-unicode: the
    Latin-1 letters and the 68 stand-ins from U+0100) and symbols of other scripts: the round trip
    of each character alone (:func:`alphabet_issues`) does not depend on which characters a corpus
    happens to hold."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_ins = [chr(256 + i) for i in range(68)]
    return "".join([chr(b) for b in kept] + stand_ins) + "€£¥₹©®™°±×÷µ¶§†‰←→∞≠≤≥½ßæœøłđ中あア한Жλש"


ALPHABET = _alphabet()
DECLARED_EXTRAS = ("bos", "eos", "cls", "sep")
MAX_EXTRA_TOKENS = 4


@dataclass(frozen=True)
class TokenizerIssue:
    """``kind`` in load, panic, timeout, roundtrip, special, added, order, lookalike, ordinary."""

    kind: str
    detail: str


def canonical(text: str, drop: str = "") -> str:
    """Letters and digits of ``text`` after NFKC, case folding and accent stripping, without
    the characters of ``drop`` (the documented normalisations a tokenizer may apply)."""
    text = "".join(ch for ch in text if ch not in drop)
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return "".join(ch for ch in folded if ch.isalnum() and not unicodedata.combining(ch))


def request(
    kind: str,
    path: str,
    sha256: str,
    size: int,
    tokens: Mapping[str, str | None],
    loader_added: list[Any] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """The child request: ``kind`` is ``tokenizer`` (tokenizer.json) or ``sentencepiece`` (a
    ``.model``). The child reads ``path`` itself (no multi-MiB JSON string on the pipe) and
    refuses it unless its SHA-256 is the one the scan saw. ``loader_added``: the tokens the
    loader adds from the config (:func:`loader_added_tokens`), added in the child as the loader does."""
    return {
        "id": "k", "op": kind, "path": path, "sha256": sha256, "size": size,
        "corpus": list(CORPUS), "alphabet": ALPHABET, "tokens": dict(tokens), "loader_added": list(loader_added),
    }  # fmt: skip


def loader_added_tokens(config: Mapping[str, Any]) -> list[list[Any]]:
    """``[content, special, flags]`` of each entry of the config's ``added_tokens_decoder`` (the
    loader adds those tokenizer.json lacks, with their flags), in id order, at most 4096."""
    decoder = config.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return []
    out = []
    for _key, entry in sorted(decoder.items(), key=lambda kv: (len(str(kv[0])), str(kv[0])))[: MAX_ADDED + 1]:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            flags = {
                k: entry[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if isinstance(entry.get(k), bool)
            }
            out.append([entry["content"], bool(entry.get("special")), flags])
    return out


def _quote(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


BYTE_PIECE_RE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def roundtrip_texts(text: str, sample: Mapping[str, Any], unk_token: str | None = None) -> tuple[str, str]:
    """(wanted, got): the letters and digits ``decode(encode(text))`` must keep, and those it
    kept, up to the documented losses: characters the tokenizer maps to its unknown token,
    pre-tokenized words it writes as the unknown token alone (WordPiece's rule for a word it
    cannot segment), characters it can only write as byte-fallback pieces (the ``<0xNN>`` a
    decoder without ByteFallback shows), the unknown token's own text, and normalisation
    (:func:`canonical`). Nothing else is excused: a rule deleting "not" still breaks it."""
    drop = str(sample.get("unk_chars", "")) + str(sample.get("byte_chars", ""))
    words = [canonical(w) for w in sample.get("unk_words") or [] if isinstance(w, str)]
    decoded = BYTE_PIECE_RE.sub(" ", str(sample.get("decoded", "")))
    if unk_token and (drop or words):
        decoded = decoded.replace(unk_token, " ")
    return canonical(_without_words(text, words), drop), canonical(decoded, drop)


_RAW_WORD_RE = re.compile(r"\w+|[^\w\s]")


def _without_words(text: str, words: Iterable[str]) -> str:
    """``text`` without the words (canonical forms, in order) the tokenizer wrote as unknown:
    each removes the next word of ``text`` with that canonical form."""
    pending = [w for w in words if w]
    if not pending:
        return text
    out, i = [], 0
    for m in _RAW_WORD_RE.finditer(text):
        if i < len(pending) and canonical(m.group(0)) == pending[i]:
            out.append(" ")
            i += 1
        else:
            out.append(m.group(0) + " ")
    return "".join(out)


def _roundtrip(index: int, sample: Mapping[str, Any], unk_token: str | None = None) -> TokenizerIssue | None:
    want, got = roundtrip_texts(CORPUS[index], sample, unk_token)
    if want == got:
        return None
    return TokenizerIssue(
        "roundtrip",
        f"decode(encode(x)) changes the text: {_quote(CORPUS[index])} -> {_quote(str(sample.get('decoded')))}",
    )


def _token_ids(answer: Mapping[str, Any]) -> dict[str, Any]:
    """Token -> id for the tokens the request named and every added token (the request names
    the tokens of the config files; tokenizer.json's own special tokens are among the added)."""
    ids: dict[str, Any] = {str(c): i for c, i, _special in answer.get("added") or [] if i is not None}
    return ids | dict(answer.get("token_ids") or {})


def _special_ids(answer: Mapping[str, Any], tokens: Mapping[str, str | None]) -> dict[int, str]:
    out = {int(i): str(c) for c, i, special in answer.get("added") or [] if special and i is not None}
    ids = _token_ids(answer)
    for name, token in tokens.items():
        ident = ids.get(token) if token else None
        if ident is not None and name != "unk":
            out[int(ident)] = str(token)
    unk = tokens.get("unk")
    unk_id = ids.get(unk) if unk else None
    out.pop(unk_id, None)  # type: ignore[arg-type]
    return out


def _extras(answer: Mapping[str, Any], tokens: Mapping[str, str | None]) -> set[int]:
    """Ids encode may add: the declared bos/eos/cls/sep; with none declared (a bare BERT
    config), the tokenizer's own special added tokens (never ordinary words)."""
    ids = _token_ids(answer)
    declared = {int(ids[t]) for name in DECLARED_EXTRAS if (t := tokens.get(name)) and ids.get(t) is not None}
    if declared or any(tokens.get(name) for name in DECLARED_EXTRAS):
        return declared
    return {int(i) for _c, i, special in answer.get("added") or [] if special and i is not None}


def folded(text: str) -> str:
    """``text`` up to the documented normalisations (NFKC, case folding, accents), without
    whitespace, metaspace, control and format characters: every other character, symbols and
    punctuation included, must survive a round trip."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return "".join(
        ch for ch in text
        if not (ch.isspace() or ch == "\u2581" or unicodedata.combining(ch) or unicodedata.category(ch) in ("Cc", "Cf"))
    )  # fmt: skip


def alphabet_issues(answer: Mapping[str, Any], limit: int = 4) -> list[TokenizerIssue]:
    """Each character of :data:`ALPHABET` encoded alone must decode to itself up to
    :func:`folded`, unless the tokenizer can only write it as its unknown token, or as byte
    pieces its decoder shows as ``<0xNN>``: a rule or vocabulary that turns '$' into '€' or drops
    '%' breaks it, whatever the corpus holds."""
    changed = []
    for entry in answer.get("alphabet") or []:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
            continue
        char, decoded, lost = entry
        if lost == "unk" or (lost == "bytes" and BYTE_PIECE_RE.search(decoded)):
            continue  # documented losses: the unknown token, byte pieces a decoder shows as <0xNN>
        if folded(char) != folded(decoded):
            changed.append(f"{char!r} -> {decoded[:12]!r}")
    if not changed:
        return []
    shown = ", ".join(changed[:limit]) + (f" and {len(changed) - limit} more" if len(changed) > limit else "")
    return [TokenizerIssue("roundtrip", f"decode(encode(c)) changes {len(changed)} alphabet character(s): {shown}")]


CORPUS_VERSION = "tokenscan-corpus-2"  # the ids only: the round-trip semantics do not change it


def ids_digest(answer: Mapping[str, Any]) -> str | None:
    """SHA-256 of the ids the tokenizer gave each corpus sample (None without an answer):
    equal for two tokenizers exactly when every ordinary word of the corpus maps to the same ids."""
    samples = answer.get("samples")
    if answer.get("status") != "ok" or not isinstance(samples, list):
        return None
    ids = [s.get("ids") for s in samples if isinstance(s, dict)]
    return hashlib.sha256(json.dumps([CORPUS_VERSION, ids]).encode()).hexdigest()


def judge(answer: Mapping[str, Any], tokens: Mapping[str, str | None], label: str) -> list[TokenizerIssue]:
    """Issues of one child answer (``tokens``: the declared bos/eos/pad/unk/cls/sep/...)."""
    status = answer.get("status")
    if status == "unavailable":  # the library is missing here: the behaviour was not checked, say so
        return [TokenizerIssue("unavailable", f"{label}: {answer.get('message') or status}; behaviour not checked")]
    if status in ("load_error", "panic", "timeout", "crashed", "changed"):
        kind = {"load_error": "load", "crashed": "panic", "changed": "load"}.get(str(status), str(status))
        return [TokenizerIssue(kind, f"{label}: {answer.get('message') or status}")]
    specials, allowed_extra = _special_ids(answer, tokens), _extras(answer, tokens)
    out: list[TokenizerIssue] = []
    for i, sample in enumerate(answer.get("samples") or []):
        issue = _roundtrip(i, sample, answer.get("unk_token"))
        if issue:
            out.append(issue)
        hits = sorted({specials[t] for t in sample.get("ids", []) if t in specials})
        if hits:
            out.append(
                TokenizerIssue("special", f"ordinary text {_quote(CORPUS[i])} encodes to {', '.join(map(repr, hits))}")
            )
        extra = Counter(sample.get("ids_special", [])) - Counter(sample.get("ids", []))
        unexpected = sorted(set(extra) - allowed_extra)
        if unexpected or sum(extra.values()) > MAX_EXTRA_TOKENS:
            count = sum(extra.values())
            detail = (
                f"encoding with special tokens adds {count} token(s) beyond the declared ones (ids {unexpected[:8]})"
            )
            out.append(TokenizerIssue("added", detail))
    model_unk = answer.get("unk_token")  # a token declared for another role: unknown text encodes to it
    others = {t for name, t in tokens.items() if t and name != "unk" and "[" not in name and t != tokens.get("unk")}
    if isinstance(model_unk, str) and model_unk in others:
        detail = f"the model's unk_token is the special {model_unk!r}: text outside the vocabulary encodes to it"
        out.append(TokenizerIssue("special", detail))
    out += alphabet_issues(answer)
    if answer.get("unchecked"):
        out.append(TokenizerIssue("unavailable", f"{label}: {answer['unchecked']} (not analysed)"))
    for content in (answer.get("unmatched") or [])[:8]:
        detail = f"special token {_quote(str(content))} not matched after a word (single_word): plain text there"
        out.append(TokenizerIssue("unmatched", detail))
    seen: set[TokenizerIssue] = set()
    return [i for i in out if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


# -- static invariants of tokenizer.json ------------------------------------------------------
def _merged(merge: Any) -> str | None:
    if type(merge) is list and len(merge) == 2 and type(merge[0]) is str and type(merge[1]) is str:
        return merge[0] + merge[1]
    if type(merge) is str and " " in merge:
        a, _, b = merge.partition(" ")
        return a + b
    return None


def merge_order_problem(model: Mapping[str, Any]) -> str | None:
    """BPE: the id of each merge's result must not decrease along the merge list (tokenizers'
    trainers and the tiktoken/sentencepiece converters assign ids in merge order). Two
    ordinary words whose ids were swapped break it."""
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return None
    vocab, merges = model["vocab"], model.get("merges")
    if not isinstance(merges, list):
        return None
    get = vocab.get
    last, last_token = -1, ""
    for rank, merge in enumerate(merges):
        token = _merged(merge)
        ident = get(token) if token is not None else None
        if type(ident) is not int:
            continue
        if ident < last:
            return f"merge {rank} makes {token!r} (id {ident}) after {last_token!r} (id {last}): ids not in merge order"
        last, last_token = ident, token or ""
    return None


def score_order_problem(model: Mapping[str, Any]) -> str | None:
    """Unigram: ordinary pieces (score < 0) are stored by descending score (sentencepiece's and
    tokenizers' trainers both write them so); two pieces whose ids were swapped break it."""
    vocab = model.get("vocab") if model.get("type") == "Unigram" else None
    if not isinstance(vocab, list):
        return None
    last, last_piece = 0.0, ""
    for ident, entry in enumerate(vocab):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], (int, float))):
            continue
        piece, score = entry
        if score >= 0:
            continue
        if last < 0 and score > last:
            where = f"piece {piece!r} (id {ident}, score {score:.3f}) follows {last_piece!r} (score {last:.3f})"
            return f"{where}: ids not in score order"
        last, last_piece = score, str(piece)
    return None


def vocab_disagreement(vocab: Mapping[str, Any], other: Mapping[str, Any], label: str, limit: int = 3) -> str | None:
    """Two files of one directory that both define the vocabulary (tokenizer.json's model and
    the slow tokenizer's vocab.txt / vocab.json) must give every shared token the same id:
    which mapping a model gets would otherwise depend on the loader. Swapping two words' ids
    in one of them, the other kept, breaks it."""
    differ = [t for t, i in other.items() if type(i) is int and type(vocab.get(t)) is int and vocab[t] != i]
    if not differ:
        return None
    shown = ", ".join(f"{t!r} {vocab[t]} vs {other[t]}" for t in sorted(differ, key=lambda t: other[t])[:limit])
    return f"tokenizer.json and {label} give {len(differ)} token(s) different ids ({shown})"


def vocab_txt_ids(lines: Iterable[str]) -> dict[str, int]:
    """vocab.txt as BERT's slow tokenizer reads it: a token per line, its id the line number."""
    return {line: i for i, line in enumerate(lines)}


def _letters(text: Any) -> int:
    return sum(ch.isalpha() for ch in text) if isinstance(text, str) else 0


def _pattern(node: dict[str, Any]) -> str:
    pattern = node.get("pattern")
    if isinstance(pattern, dict):
        return str(pattern.get("String") or pattern.get("Regex") or "")
    return str(pattern or "")


def rewrite_rules(tok: Mapping[str, Any]) -> list[TokenizerIssue]:
    """Rules of tokenizer.json that rewrite words for every input, whatever the corpus holds:
    a Replace (normalizer or decoder) whose pattern or replacement has letters, a Prepend or
    Append of text, a post-processor "special token" that expands to several ids."""
    out = []
    stack: list[tuple[str, Any, int]] = [(k, tok.get(k), 0) for k in ("normalizer", "decoder", "post_processor")]
    while stack:
        where, node, depth = stack.pop()
        if not isinstance(node, dict) or depth > 8:
            continue
        kind = node.get("type")
        for key in ("normalizers", "decoders", "processors", "pretokenizers"):
            if isinstance(node.get(key), list):
                stack += [(where, child, depth + 1) for child in node[key][:64]]
        if kind == "Replace" and (_letters(_pattern(node)) >= 2 or _letters(node.get("content")) >= 2):
            detail = f"{where} rule rewrites {_quote(_pattern(node))} as {_quote(str(node.get('content')))}"
            out.append(TokenizerIssue("roundtrip", detail))
        elif kind in ("Prepend", "Append") and _letters(node.get(kind.lower())) >= 2:
            out.append(
                TokenizerIssue("roundtrip", f"{where} rule adds {_quote(str(node.get(kind.lower())))} to every input")
            )
        elif kind == "TemplateProcessing" and isinstance(node.get("special_tokens"), dict):
            for name, spec in list(node["special_tokens"].items())[:64]:
                if isinstance(spec, dict) and (len(spec.get("ids") or []) != 1 or spec.get("tokens") != [name]):
                    ids = spec.get("ids") or []
                    out.append(TokenizerIssue("added", f"post-processor token {name!r} expands to {len(ids)} ids"))
    return out


def skeleton(token: str) -> str:
    """``token`` without invisible characters, folded to what it looks like (:func:`.confusables.fold`)."""
    visible = "".join(ch for ch in token if unicodedata.category(ch) not in ("Cf", "Mn", "Zs") or ch == " ")
    return confusables.fold(visible)


def special_token_problems(declared: Mapping[str, str | None], known: Iterable[str]) -> list[TokenizerIssue]:
    """Declared special tokens holding invisible characters, or look-alikes of another known
    token (an EOS that is a copy of the template's end token with a zero-width space)."""
    out = []
    by_skeleton: dict[str, set[str]] = {}
    for token in set(known) | {t for t in declared.values() if t}:
        by_skeleton.setdefault(skeleton(token), set()).add(token)
    for name, value in declared.items():
        if not value:
            continue
        token = value
        hidden = [
            f"U+{ord(ch):04X}" for ch in token if unicodedata.category(ch) in ("Cf", "Mn") or ct.INVISIBLE_RE.match(ch)
        ]
        twins = sorted(by_skeleton.get(skeleton(token), set()) - {token})
        if hidden:
            out.append(
                TokenizerIssue("lookalike", f"{name}_token {token!r} contains invisible characters {', '.join(hidden)}")
            )
        elif twins:
            out.append(TokenizerIssue("lookalike", f"{name}_token {token!r} is a look-alike of {twins[0]!r}"))
    return out


WORDLIKE_RE = re.compile(r"^[\w'-]+\Z")


def ordinary_special_tokens(declared: Mapping[str, str | None], added: Iterable[str]) -> list[TokenizerIssue]:
    """Declared special tokens (other than unk) that are plain words and not added tokens."""
    added_set = set(added)
    return [
        TokenizerIssue("ordinary", f"{name}_token {token!r} is an ordinary word, not a special token")
        for name, token in declared.items()
        if token and name != "unk" and token not in added_set and WORDLIKE_RE.match(token)
    ]


MAX_ADDED = 1 << 16  # added tokens judged, loaded from the config or matched in the child (more: TS910)


def added_words(tok: Mapping[str, Any], vocab_size: int) -> list[TokenizerIssue]:
    """Non-special added tokens that are ordinary words (letters, digits, ``'``/``-``) with ids past
    the model's vocabulary: every occurrence of the word then encodes to a new id the model was
    not trained on, instead of the vocabulary's own ids."""
    out = []
    raw = tok.get("added_tokens")
    entries: list[Any] = raw if isinstance(raw, list) else []
    if len(entries) > MAX_ADDED:
        out.append(TokenizerIssue("unavailable", f"{len(entries)} added tokens: past {MAX_ADDED} not judged as words"))
    for entry in entries[:MAX_ADDED]:
        if not isinstance(entry, dict) or entry.get("special") or not isinstance(entry.get("content"), str):
            continue
        content, ident = entry["content"], entry.get("id")
        if WORDLIKE_RE.match(content.strip()) and type(ident) is int and ident >= vocab_size:
            out.append(TokenizerIssue("ordinary", f"added token {content!r} (id {ident}, past the vocabulary) takes "
                                                  "an ordinary word from the vocabulary's own ids"))  # fmt: skip
    return out[:8]


# tokenizers of distinct content load in parallel on a machine with cores to spare (each
# worker under the behaviour policy's memory cap and timeout)
_WORKERS = ct._WorkerPool(ct.pool_size(), CHILD, CHILD_ENV, ("tokenizers", "sentencepiece"))
atexit.register(_WORKERS.stop)


def prestart_worker(memory: int) -> None:
    """Starts a tokenizer worker in the background (no wait; see ``_Worker.prestart``)."""
    _WORKERS.prestart(memory)


def stop_worker() -> None:
    """Stops every tokenizer worker (the next request starts a fresh one)."""
    _WORKERS.stop()


def run(req: dict[str, Any], memory: int, timeout: float, on_sent: Callable[[], None] | None = None) -> dict[str, Any]:
    """The child's answer to ``req`` (``{"status": "timeout" | "crashed"}`` when it gave none);
    ``on_sent`` as in ``_Worker.call``."""
    req = {**req, "timeout": timeout}
    return _WORKERS.call(req, memory, timeout, on_sent)
