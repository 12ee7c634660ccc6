"""One fold of look-alike characters for the scanner (pure): what a character *looks like*.

NFKC already folds fullwidth forms, mathematical alphanumerics, ligatures and most compatibility
letters (``ｉ``, ``𝐢``, ``ℓ``). It keeps letters of other scripts that are drawn like Latin ones
(Cyrillic ``о``, Greek ``ο``, Armenian ``օ``, Cherokee ``Ꭺ``), the Latin small capitals (``ɪ``,
``ᴍ``) and the punctuation that passes for markup (``׀`` for ``|``, ``‹`` for ``<``). :data:`TABLE`
maps those to the ASCII character they pass for, case kept; the small capitals are derived from
the Unicode names (every ``LATIN LETTER SMALL CAPITAL X`` is ``x``), so none is left out.

Two views, one table: :func:`fold_char` is one character out for one in (positions in a skeleton
are positions in the text: the look-alike markup check of :mod:`.template_battery`);
:func:`fold` is the whole-text skeleton (NFKC, the table, case folded) that text rules and
token comparisons run on. Neither removes invisible characters: callers decide what those mean.
"""

from __future__ import annotations

import functools
import unicodedata

_MARKUP = {
    "|": "｜∣│┃ǀ￨❘ⵏ⏐︱︳।׀",  # U+05C0 Hebrew paseq
    "<": "＜‹〈⟨˂ᐸ❮﹤〈",
    ">": "＞›〉⟩˃ᐳ❯﹥〉",
    "[": "［⟦〚",
    "]": "］⟧〛",
    "_": "＿‗﹍﹎﹏▁",
    "-": "‐‑‒–—―−﹣－",
    "/": "⁄∕⧸／",
}
_LETTERS = {  # letter -> look-alikes of other scripts (case as drawn)
    "a": "аɑα", "b": "Ьвʙ", "c": "сϲᴄ", "d": "ԁ", "e": "еєε", "g": "ɡց", "h": "һհн", "i": "іıɩɪι",
    "j": "јȷϳ", "k": "кκᴋ", "l": "ӏӀℓ", "m": "м", "n": "ոп", "o": "оοօσ", "p": "рρ", "q": "ԛզ", "r": "г",
    "s": "ѕꜱ", "t": "тτ", "u": "υսʋ", "v": "νѵ", "w": "ԝѡ", "x": "хχ", "y": "уүγ",
    "A": "АΑᎪ", "B": "ВΒᏴ", "C": "СϹᏟ", "E": "ЕΕᎬ", "H": "НΗᎻ", "I": "ІΙ", "J": "ЈᎫ", "K": "КΚᏦ",
    "M": "МΜᎷ", "N": "Ν", "O": "ОΟՕ", "P": "РΡᏢ", "S": "ЅᏚ", "T": "ТΤᎢ", "W": "ԜᏔ", "X": "ХΧ",
    "Y": "ҮΥ", "Z": "ΖᏃ",
}  # fmt: skip


def _small_capitals() -> dict[str, str]:
    """Every ``LATIN LETTER SMALL CAPITAL X`` (U+026A ``ɪ``, U+1D0D ``ᴍ``, ...) -> ``x``."""
    out = {}
    blocks = (range(0x0250, 0x02B0), range(0x1D00, 0x1D80), range(0xA720, 0xA800), range(0xAB30, 0xAB70))
    for code in (c for block in blocks for c in block):
        name = unicodedata.name(chr(code), "")
        if name.startswith("LATIN LETTER SMALL CAPITAL ") and len(name) == len("LATIN LETTER SMALL CAPITAL X"):
            out[chr(code)] = name[-1].lower()
    return out


def _table() -> dict[int, str]:
    pairs = {ch: ascii_ for ascii_, alikes in _MARKUP.items() for ch in alikes}
    pairs |= _small_capitals()
    pairs |= {ch: ascii_ for ascii_, alikes in _LETTERS.items() for ch in alikes}
    return {ord(ch): ascii_ for ch, ascii_ in pairs.items() if ch != ascii_}


TABLE: dict[int, str] = _table()
"""Look-alike code point -> the one ASCII character it passes for (a ``str.translate`` table)."""


@functools.lru_cache(maxsize=4096)
def fold_char(ch: str) -> str:
    """``ch`` as it looks, lower case: :data:`TABLE`, else NFKC then the table. Always one character (an NFKC
    expansion such as ``㎡`` is kept as the character itself, through the table)."""
    folded = ch.translate(TABLE)  # first: NFKC moves some look-alikes away (U+03F9 lunate sigma to U+03A3)
    if folded == ch:
        nfkc = unicodedata.normalize("NFKC", ch)
        folded = nfkc.translate(TABLE) if len(nfkc) == 1 else ch
    low = folded.lower()
    return low if len(low) == 1 else folded


def fold(text: str) -> str:
    """``text`` as it looks, case folded: :func:`fold_keep_case`, then ``casefold`` (lengths may change)."""
    return fold_keep_case(text).casefold()


def fold_keep_case(text: str) -> str:
    """``text`` as it looks with its case kept: :data:`TABLE`, NFKC, the table again (for rules that read
    capitals, such as a product name inside an instruction)."""
    return unicodedata.normalize("NFKC", text.translate(TABLE)).translate(TABLE)
