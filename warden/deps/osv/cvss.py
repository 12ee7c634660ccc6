"""CVSS base scores computed from vectors (pure), and the severity buckets they fall in.

v3.0 and v3.1 follow the FIRST specification's base equations (v3.1's Roundup avoids
floating-point surprises; v3.0 rounds up to one decimal). v2 vectors are scored with the
v2 base equation. A vector we cannot parse raises ValueError; callers bucket it ``unknown``.
"""

from __future__ import annotations

import math

_V3 = {
    "AV": {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2},
    "AC": {"L": 0.77, "H": 0.44},
    "UI": {"N": 0.85, "R": 0.62},
    "C": {"H": 0.56, "L": 0.22, "N": 0.0},
    "I": {"H": 0.56, "L": 0.22, "N": 0.0},
    "A": {"H": 0.56, "L": 0.22, "N": 0.0},
}
_PR = {"U": {"N": 0.85, "L": 0.62, "H": 0.27}, "C": {"N": 0.85, "L": 0.68, "H": 0.5}}
_V2 = {
    "AV": {"L": 0.395, "A": 0.646, "N": 1.0},
    "AC": {"H": 0.35, "M": 0.61, "L": 0.71},
    "Au": {"M": 0.45, "S": 0.56, "N": 0.704},
    "C": {"N": 0.0, "P": 0.275, "C": 0.660},
    "I": {"N": 0.0, "P": 0.275, "C": 0.660},
    "A": {"N": 0.0, "P": 0.275, "C": 0.660},
}


def _metrics(parts: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition(":")
        if not sep or not value or key in out:
            raise ValueError(f"bad CVSS metric {part!r}")
        out[key] = value
    return out


def roundup_31(value: float) -> float:
    """CVSS v3.1 Roundup: the smallest number with one decimal that is >= value."""
    as_int = round(value * 100000)
    if as_int % 10000 == 0:
        return as_int / 100000.0
    return (math.floor(as_int / 10000) + 1) / 10.0


def cvss3_base_score(vector: str) -> float:
    """Base score of a ``CVSS:3.x/AV:../..`` vector. Raises ValueError."""
    head, _, rest = vector.strip().partition("/")
    if head not in ("CVSS:3.0", "CVSS:3.1"):
        raise ValueError(f"not a CVSS v3 vector: {vector!r}")
    m = _metrics(rest.split("/"))
    try:
        scope = m["S"]
        weights = {k: table[m[k]] for k, table in _V3.items()}
        pr = _PR[scope][m["PR"]]
    except KeyError as exc:
        raise ValueError(f"CVSS v3 vector {vector!r} lacks or misstates base metric {exc}") from None
    iss = 1 - (1 - weights["C"]) * (1 - weights["I"]) * (1 - weights["A"])
    impact = 6.42 * iss if scope == "U" else 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15
    exploitability = 8.22 * weights["AV"] * weights["AC"] * pr * weights["UI"]
    if impact <= 0:
        return 0.0
    raw = impact + exploitability if scope == "U" else 1.08 * (impact + exploitability)
    if head == "CVSS:3.1":
        return roundup_31(min(raw, 10.0))
    return math.ceil(min(raw, 10.0) * 10) / 10.0


def cvss2_base_score(vector: str) -> float:
    """Base score of a v2 vector ``AV:N/AC:L/Au:N/C:P/I:P/A:P``. Raises ValueError."""
    m = _metrics(vector.strip().removeprefix("(").removesuffix(")").split("/"))
    try:
        w = {k: table[m[k]] for k, table in _V2.items()}
    except KeyError as exc:
        raise ValueError(f"CVSS v2 vector {vector!r} lacks or misstates base metric {exc}") from None
    impact = 10.41 * (1 - (1 - w["C"]) * (1 - w["I"]) * (1 - w["A"]))
    exploitability = 20 * w["AV"] * w["AC"] * w["Au"]
    f_impact = 0.0 if impact == 0 else 1.176
    return round(((0.6 * impact) + (0.4 * exploitability) - 1.5) * f_impact + 1e-9, 1)


def cvss4_base_score(vector: str) -> float:
    """Base score of a ``CVSS:4.0/...`` vector, computed by the maintained ``cvss`` package
    (v4 scores come from FIRST's lookup tables, not a formula worth re-implementing). Raises ValueError."""
    try:
        from cvss import CVSS4, CVSSError
    except ImportError:  # pragma: no cover - the package is a runtime dependency
        raise ValueError("CVSS v4 needs the `cvss` package") from None
    if not vector.strip().startswith("CVSS:4.0/"):
        raise ValueError(f"not a CVSS v4 vector: {vector!r}")
    try:
        return float(CVSS4(vector.strip()).base_score)
    except CVSSError as exc:
        raise ValueError(f"CVSS v4 vector {vector!r}: {exc}") from None


def bucket(score: float | None) -> str:
    """critical (>= 9), high (>= 7), medium (>= 4), low (> 0); ``unknown`` for None or 0."""
    if score is None or score <= 0:
        return "unknown"
    if score >= 9.0:
        return "critical"
    if score >= 7.0:
        return "high"
    if score >= 4.0:
        return "medium"
    return "low"
