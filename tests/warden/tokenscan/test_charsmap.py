"""Sentencepiece precompiled charsmaps are decoded and every mapping judged (issue 33): the
trainer's own nmt_nfkc and nfkc_cf maps are clean, a seeded sample of rules rewriting a letter,
a digit or a word is a finding each, and a malformed blob is never clean."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest

from tests.warden.tokenscan import families as fam
from warden.tokenscan import charsmap as cm

spm = pytest.importorskip("sentencepiece")


def _charsmap(tmp: Path, rule_name: str | None = None, rules: str | None = None) -> bytes:
    from sentencepiece import sentencepiece_model_pb2 as pb

    (tmp / "t.txt").write_text("\n".join(fam.TRAIN_TEXT), encoding="utf-8")
    extra = {"normalization_rule_name": rule_name} if rule_name else {}
    if rules is not None:
        (tmp / "r.tsv").write_text(rules, encoding="utf-8")
        extra = {"normalization_rule_tsv": str(tmp / "r.tsv")}
    spm.SentencePieceTrainer.train(
        input=str(tmp / "t.txt"), model_prefix=str(tmp / "m"), vocab_size=300, model_type="unigram",
        character_coverage=1.0, minloglevel=2, **extra,
    )  # fmt: skip
    proto = pb.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString((tmp / "m.model").read_bytes())
    return bytes(proto.normalizer_spec.precompiled_charsmap)


def _hex(text: str) -> str:
    return " ".join(f"{ord(ch):X}" for ch in text)


@pytest.mark.parametrize("rule_name", ["nmt_nfkc", "nfkc_cf"])
def test_trainer_charsmaps_are_clean(tmp_path: Path, rule_name: str) -> None:
    blob = _charsmap(tmp_path, rule_name)
    assert sum(1 for _ in cm.mappings(blob)) > 1000
    assert cm.charsmap_problem(blob) is None


def test_compatibility_rules_are_clean(tmp_path: Path) -> None:
    rules = f"{_hex('Ａ')}\t41\n{_hex('ﬁ')}\t{_hex('fi')}\n{_hex(chr(0x200B))}\t\n"
    assert cm.charsmap_problem(_charsmap(tmp_path, rules=rules)) is None


def _rewrites(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(4):
        a, b = rng.sample(string.ascii_lowercase + string.digits, 2)
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 5)))
        out += [(a, b), (word, ""), (word, word[::-1] + "x")]
    return rng.sample(out, 4)


@pytest.mark.parametrize("source,target", _rewrites(33))
def test_rewriting_rules_are_found(tmp_path: Path, source: str, target: str) -> None:
    rules = f"{_hex(source)}\t{_hex(target)}\n"
    problem = cm.charsmap_problem(_charsmap(tmp_path, rules=rules))
    assert problem is not None and repr(source) in problem, problem


def test_malformed_blob_is_not_clean() -> None:
    assert cm.charsmap_problem(b"\xff\xff\x00\x00abc") is not None
    assert cm.charsmap_problem(b"\x01") is not None


def test_a_sentencepiece_model_carries_its_charsmap_to_the_judge(tmp_path: Path) -> None:
    from warden.tokenscan.spm import parse_sentencepiece

    _charsmap(tmp_path, rules=f"{_hex('7')}\t{_hex('1')}\n")
    model = parse_sentencepiece((tmp_path / "m.model").read_bytes())
    assert model.charsmaps and cm.charsmap_problem(model.charsmaps[0]) is not None
    _charsmap(tmp_path, "nmt_nfkc")
    model = parse_sentencepiece((tmp_path / "m.model").read_bytes())
    assert model.charsmaps and all(cm.charsmap_problem(b) is None for b in model.charsmaps)
