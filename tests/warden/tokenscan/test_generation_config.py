"""generation_config.json is judged by an allow-list (issue 33): the values real families ship
stay clean; a seeded sample of values outside it (a tiny length, stop strings, eos outside the
vocabulary, forcing keys, an unknown key) is a finding each."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.warden.tokenscan import families as fam
from warden.tokenscan import scan_directory
from warden.tokenscan.policy import default_policy

SANE = {"bos_token_id": 0, "eos_token_id": [1, 4], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
        "top_k": 20, "repetition_penalty": 1.05, "max_new_tokens": 4096, "max_length": 32768,
        "transformers_version": "4.51.0", "_from_model_config": False}  # fmt: skip
BAD: list[tuple[str, Any, str]] = [
    ("max_new_tokens", 1, "TS1301"), ("max_length", 8, "TS1301"), ("min_new_tokens", 4096, "TS1301"),
    ("min_length", 500, "TS1301"), ("stop_strings", ["refund"], "TS1301"), ("eos_token_id", 99999, "TS1301"),
    ("pad_token_id", 77, "TS1301"), ("sequence_bias", [[[5], 9.0]], "TS1301"), ("bad_words_ids", [[5]], "TS1301"),
    ("suppress_tokens", [5], "TS1301"), ("forced_eos_token_id", 1, "TS1301"), ("temperature", 50.0, "TS1301"),
    ("repetition_penalty", 9.0, "TS1301"), ("watermarking_config", {"greenlist_ratio": 0.5}, "TS1301"),
    ("logits_processor_zq", [1], "TS910"), ("do_sample", "yes", "TS1301"),
]  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fam.build_family("llama3.1", tmp_path_factory.mktemp("gen") / "llama3.1")


def _scan_with(base: Path, tmp: Path, values: dict[str, Any]) -> list[str]:
    d = tmp / "tok"
    shutil.copytree(base, d)
    (d / "generation_config.json").write_text(json.dumps(values), encoding="utf-8")
    return [f.id for f in scan_directory(str(d), default_policy()).findings]


def test_sane_generation_config_is_clean(llama: Path, tmp_path: Path) -> None:
    assert _scan_with(llama, tmp_path, SANE) == []


@pytest.mark.parametrize("key,value,rule", random.Random(33).sample(BAD, 6))
def test_generation_config_outside_the_allow_list_is_found(
    llama: Path, tmp_path: Path, key: str, value: Any, rule: str
) -> None:
    assert rule in _scan_with(llama, tmp_path, {**SANE, key: value})
