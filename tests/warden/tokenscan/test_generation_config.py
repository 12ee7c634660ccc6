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


@pytest.mark.parametrize("length", [*random.Random(34).sample(range(64, 1024), 3), 1024, 4096])
def test_max_length_leaves_room_past_a_chat_prompt(llama: Path, tmp_path: Path, length: int) -> None:
    """With a chat template, max_length (prompt and answer) below a chat model's context floor
    is a finding; from the floor on it is clean. Without a chat template only the allow-list
    floor (64) applies."""
    found = _scan_with(llama, tmp_path, {**SANE, "max_length": length})
    assert ("TS1301" in found) is (length < 1024), (length, found)


def test_max_length_without_a_chat_template_has_the_allow_list_floor_only(tmp_path: Path) -> None:
    gpt2 = fam.build_family("gpt2", tmp_path / "gpt2")
    found = _scan_with(gpt2, tmp_path, {"bos_token_id": 0, "eos_token_id": 0, "max_length": 100})
    assert "TS1301" not in found, found
