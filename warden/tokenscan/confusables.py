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
import re
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
_MARKUP_SCRIPTS = {  # markup punctuation drawn by letters of other scripts (no name says so)
    "<": "ᚲ",  # U+16B2 RUNIC LETTER KAUNA
    "|": "ᛁ丨",  # U+16C1 RUNIC LETTER ISAZ; U+4E28, the ideograph KANGXI RADICAL LINE (U+2F01) is under NFKC
}
_SCRIPT_LETTERS = {  # letters of scripts drawn like Latin ones, by script (Unicode's confusables data, as facts)
    "Cherokee": {"D": "Ꭰ", "R": "ᎡᏒ", "T": "Ꭲ", "i": "Ꭵ", "Y": "Ꭹ", "W": "ᎳᏔ", "M": "Ꮇ", "H": "Ꮋ", "G": "Ꮐ",
                 "Z": "Ꮓ", "b": "Ꮟ", "V": "Ꮩ", "S": "Ꮪ", "L": "Ꮮ", "C": "Ꮯ", "P": "Ꮲ", "K": "Ꮶ", "B": "Ᏼ"},
    "Canadian syllabics": {"P": "ᑭ", "d": "ᑯ", "b": "ᑲ", "V": "ᐯ", "L": "ᒪ", "R": "ᖇ", "B": "ᗷ", "W": "ᗯ",
                           "S": "ᔕ", "H": "ᕼ", "A": "ᗅ", "D": "ᗞᗪ"},
    "Lisu": {"B": "ꓐ", "P": "ꓑ", "D": "ꓓ", "T": "ꓔ", "G": "ꓖ", "K": "ꓗ", "J": "ꓙ", "C": "ꓚ", "Z": "ꓜ", "F": "ꓝ",
             "M": "ꓟ", "N": "ꓠ", "L": "ꓡ", "S": "ꓢ", "R": "ꓣ", "V": "ꓦ", "H": "ꓧ", "W": "ꓪ", "X": "ꓫ", "Y": "ꓬ",
             "A": "ꓮ", "E": "ꓰ", "I": "ꓲ", "O": "ꓳ", "U": "ꓴ"},
}  # fmt: skip
_NAMED = (  # (pattern over Unicode names, the ASCII character every match is drawn as)
    (
        re.compile(
            r"(?:LIGHT |MEDIUM |HEAVY )?VERTICAL (?:BAR|LINE(?: EXTENSION)?)|BOX DRAWINGS (?:LIGHT|HEAVY) VERTICAL"
            r"|DIVIDES|LATIN LETTER DENTAL CLICK|(?!.*(?:DOUBLE|TRIPLE))(?:[A-Z]+ )+DANDA"
        ),
        "|",
    ),
    (re.compile(r"(?:MODIFIER LETTER |(?:[A-Z]+ )*AFFIX )?LOW (?:LINE|MACRON)"), "_"),
)
"""Whole names (fullmatch), so ``DOUBLE VERTICAL LINE`` or ``VERTICAL LINE WITH ...`` are none."""
SEQUENCES = {"rn": "m", "vv": "w", "cl": "d"}
"""Two letters drawn as one (in a folded, lower-case skeleton): for comparisons with markup only,
never for text rules (``modern`` and ``return`` are words)."""
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


def _named() -> dict[str, str]:
    """Characters without a decomposition whose Unicode name says what they are drawn as: a
    vertical bar or line, a danda (``|``), a low line or macron (``_``), and every ``LATIN SMALL
    LETTER X WITH ...`` / ``LATIN CAPITAL LETTER X WITH ...`` (a stroke, hook or bar on ``x``;
    the ones with a decomposition NFKC and the mark removal of text rules handle already)."""
    out = {}
    for code in range(0x80, 0x20000):  # above: ideographs only
        ch = chr(code)
        name = unicodedata.name(ch, "")
        if not name or unicodedata.decomposition(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        if m := _LETTER_WITH_RE.fullmatch(name):
            out[ch] = m.group(2) if m.group(1) == "CAPITAL" else m.group(2).lower()
        for pattern, ascii_ in _NAMED:
            if pattern.fullmatch(name):
                out[ch] = ascii_
    return out


_LETTER_WITH_RE = re.compile(r"LATIN (SMALL|CAPITAL) LETTER ([A-Z]) WITH [A-Z ]+")


def _table() -> dict[int, str]:
    pairs = _named()
    pairs |= {ch: ascii_ for ascii_, alikes in _MARKUP.items() for ch in alikes}
    pairs |= {ch: ascii_ for ascii_, alikes in _MARKUP_SCRIPTS.items() for ch in alikes}
    pairs |= {ch: ascii_ for letters in _SCRIPT_LETTERS.values() for ascii_, alikes in letters.items() for ch in alikes}
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


def fold_markup(text: str) -> tuple[str, list[int]]:
    """``text`` folded for a comparison with markup: :func:`fold_char` per character, and a letter
    that two letters can draw (:data:`SEQUENCES`: ``m``) written as those two (``rn``), so ``rn``
    and ``m`` fold alike wherever they stand (per character: no pairing to get wrong, ``vvv`` and
    ``vw`` are one skeleton). Also, per skeleton character, the index of the text character it
    comes from (then ``len(text)``): a match in the skeleton maps back to a slice of the text."""
    out: list[str] = []
    sources: list[int] = []
    for i, c in enumerate(text):
        folded = fold_char(c)
        drawn = _EXPANDED.get(folded, folded)
        out.append(drawn)
        sources += [i] * len(drawn)
    sources.append(len(text))
    return "".join(out), sources


_EXPANDED = {one: two for two, one in SEQUENCES.items()}
STROKES = str.maketrans("l1", "||")
"""Folded characters drawn as one vertical stroke: each passes for ``|`` in markup (``<ӏim_endӏ>``
reads as ``<|im_end|>`` though the Cyrillic palochka folds to ``l``); a skeleton translated by it
compares markup with the strokes as one character (positions unchanged)."""
