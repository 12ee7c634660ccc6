"""Scan exactly what the loader loads (``warden.tokenscan.loader_files``): the resolution, checked
against the transformers installed here; then whole scans of layouts the checks once skipped
(redirects, subfolders, vocab.json-only, generation_config.json, a truncated .model, a template
doing big-integer arithmetic) end in their findings, or in "analysis incomplete", never clean."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.warden.tokenscan.families import build_family
from warden.tokenscan import loader_files as lf
from warden.tokenscan import scan_directory
from warden.tokenscan.policy import default_policy

POLICY = default_policy()


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def ids(result) -> set[str]:
    return {f.id for f in result.findings}


def at(result, rule: str) -> set[str]:
    return {f.path for f in result.findings if f.id == rule}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family("gpt2", tmp_path_factory.mktemp("loader") / "gpt2")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family("gemma", tmp_path_factory.mktemp("loader") / "gemma")


@pytest.fixture
def copy_of(tmp_path: Path):
    def make(src: Path, name: str = "case") -> Path:
        return Path(shutil.copytree(src, tmp_path / name))

    return make


# -- the resolution (pure) --------------------------------------------------------------------
def _rels(files: list[lf.LoaderFile]) -> dict[str, tuple[str, ...]]:
    return {f.rel: f.loaders for f in files}


def test_fast_tokenizer_files_redirect_is_resolved_per_loader_version():
    names = [
        "tokenizer_config.json",
        "tokenizer.json",
        "tokenizer.4.0.json",
        "tokenizer.5.1.json",
        "tokenizer.99.0.json",
    ]
    config = {
        "tokenizer_config.json": {
            "fast_tokenizer_files": ["tokenizer.4.0.json", "tokenizer.5.1.json", "tokenizer.99.0.json"]
        }
    }
    got = _rels(lf.resolve(names, config))
    assert got["tokenizer.4.0.json"] == ("4.50", "4.57", "5.0")
    assert got["tokenizer.5.1.json"] == ("5.24",)
    assert "tokenizer.json" not in got and "tokenizer.99.0.json" not in got


def test_subfolders_templates_and_vocabularies_are_resolved():
    names = [
        "config.json", "generation_config.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
        "tokenizer_2/vocab.json", "tokenizer_2/merges.txt", "chat_template.jinja", "tokenizer_config.json",
        "additional_chat_templates/tool_use.jinja", "additional_chat_templates/old/x.jinja", "tokenizer.model",
        "tekken.json", "weights.safetensors",
    ]  # fmt: skip
    got = {f.rel: f.role for f in lf.resolve(names, {})}
    assert got == {
        "config.json": "config", "generation_config.json": "generation", "tokenizer/tokenizer.json": "tokenizer",
        "tokenizer/tokenizer_config.json": "config", "tokenizer_2/vocab.json": "vocab_json",
        "tokenizer_2/merges.txt": "merges", "chat_template.jinja": "template", "tokenizer_config.json": "config",
        "additional_chat_templates/tool_use.jinja": "template", "tokenizer.model": "model", "tekken.json": "tekken",
    }  # fmt: skip
    with_fast = {f.rel for f in lf.resolve([*names, "tokenizer.json"], {})}
    assert "tekken.json" not in with_fast  # converted only when there is no tokenizer.json


def test_config_file_paths_are_read_by_4x_only():
    names = ["tokenizer_config.json", "tokenizer.json", "other/v.json"]
    config = {"tokenizer_config.json": {"vocab_file": "other/v.json"}}
    got = lf.resolve(names, config)
    assert [(f.rel, f.role, f.loaders) for f in got if f.rel == "other/v.json"] == [
        ("other/v.json", "vocab_json", ("4.50", "4.57"))
    ]


def test_special_tokens_map_wins_without_added_tokens_decoder():
    smap = {"eos_token": "<b>"}
    assert lf.special_token_sources({"eos_token": "<a>"}, smap) == {"eos_token": "special_tokens_map.json"}
    with_decoder = {"eos_token": "<a>", "added_tokens_decoder": {}}
    assert lf.special_token_sources(with_decoder, smap) == {"eos_token": "tokenizer_config.json"}


# -- grounded in the transformers installed here ----------------------------------------------
def test_resolution_matches_what_transformers_loads(gpt2, copy_of):
    transformers = pytest.importorskip("transformers")
    d = copy_of(gpt2)
    tok = _read(d / "tokenizer.json")
    tok["added_tokens"].append({"id": 900, "content": "<|redirected|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})  # fmt: skip
    _write(d / "tokenizer.5.0.json", tok)
    config = _read(d / "tokenizer_config.json")
    config["fast_tokenizer_files"] = ["tokenizer.5.0.json"]
    config["eos_token"] = "<|endoftext|>"
    _write(d / "tokenizer_config.json", config)
    _write(d / "special_tokens_map.json", {"eos_token": "<|redirected|>", "bos_token": "<|endoftext|>"})
    loaded = transformers.AutoTokenizer.from_pretrained(str(d))
    major = int(transformers.__version__.split(".")[0])
    configs = {"tokenizer_config.json": config}
    resolved = _rels(lf.resolve([str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()], configs))
    reads_redirect = "<|redirected|>" in loaded.get_vocab()
    assert reads_redirect == (major >= 5)
    assert ("5.24" in resolved["tokenizer.5.0.json"]) and ("4.50" in resolved["tokenizer.json"])
    winner = lf.special_token_sources(config, _read(d / "special_tokens_map.json"))["eos_token"]
    assert winner == "special_tokens_map.json" and loaded.eos_token == "<|redirected|>"


# -- whole scans --------------------------------------------------------------------------------
def test_benign_layouts_scan_clean(gpt2, gemma, copy_of):
    d = copy_of(gpt2, "nested")
    shutil.copytree(gpt2, d / "tokenizer")
    _write(d / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [0], "max_new_tokens": 64})
    for path in (gpt2, gemma, d):
        result = scan_directory(str(path), POLICY)
        assert result.findings == [] and result.errors == [], [f.to_dict() for f in result.findings]


def test_redirected_tokenizer_file_is_judged(gpt2, copy_of):
    d = copy_of(gpt2)
    tok = _read(d / "tokenizer.json")
    tok["normalizer"] = {"type": "Replace", "pattern": {"String": "n"}, "content": ""}
    _write(d / "tokenizer.5.0.json", tok)
    config = _read(d / "tokenizer_config.json")
    _write(d / "tokenizer_config.json", {**config, "fast_tokenizer_files": ["tokenizer.5.0.json"]})
    assert "tokenizer.5.0.json" in at(scan_directory(str(d), POLICY), "TS1209")


def test_subfolder_tokenizer_is_judged(gpt2, copy_of):
    d = copy_of(gpt2)
    sub = Path(shutil.copytree(gpt2, d / "tokenizer"))
    tok = _read(sub / "tokenizer.json")
    tok["model"]["vocab"]["Ġthe"] = 0  # the special <|endoftext|>'s id
    _write(sub / "tokenizer.json", tok)
    assert "tokenizer/tokenizer.json" in at(scan_directory(str(d), POLICY), "TS1210")


def test_vocab_json_only_layout_is_judged(gpt2, copy_of):
    d = copy_of(gpt2)
    (d / "tokenizer.json").unlink()
    assert ids(scan_directory(str(d), POLICY)) == set()
    vocab = _read(d / "vocab.json")
    merges = [line for line in (d / "merges.txt").read_text(encoding="utf-8").splitlines()[1:] if line]
    a, b = ("".join(merges[3].split()), "".join(merges[40].split()))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    _write(d / "vocab.json", vocab)
    assert "merges.txt" in at(scan_directory(str(d), POLICY), "TS1205")


def test_merges_txt_that_disagrees_with_tokenizer_json_is_found(gpt2, copy_of):
    d = copy_of(gpt2)
    lines = (d / "merges.txt").read_text(encoding="utf-8").splitlines()
    lines[5], lines[6] = lines[6], lines[5]
    (d / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "merges.txt" in at(scan_directory(str(d), POLICY), "TS1205")


def test_generation_config_forcing_or_ordinary_eos_is_found(gpt2, copy_of):
    d = copy_of(gpt2)
    _write(d / "generation_config.json", {"suppress_tokens": [17, 42], "eos_token_id": 0})
    assert at(scan_directory(str(d), POLICY), "TS1301") == {"generation_config.json"}
    ordinary = _read(d / "vocab.json")["Ġthe"]
    _write(d / "generation_config.json", {"eos_token_id": [0, ordinary]})
    found = [f for f in scan_directory(str(d), POLICY).findings if f.id == "TS1301"]
    assert len(found) == 1 and "'Ġthe'" in found[0].message


def test_special_tokens_map_conflict_is_found(gpt2, copy_of):
    d = copy_of(gpt2)
    _write(d / "special_tokens_map.json", {**_read(d / "special_tokens_map.json"), "eos_token": "Ġthe"})
    result = scan_directory(str(d), POLICY)
    assert "TS1006" in ids(result) and "TS1005" in ids(result)  # the winner is an ordinary word, too


@pytest.mark.parametrize("how", ["text", "truncated"])
def test_truncated_or_text_sentencepiece_model_is_never_clean(gemma, copy_of, how):
    d = copy_of(gemma)
    data = (d / "tokenizer.model").read_bytes()
    text = "".join(f"\u2581piece{i}\t-{i}.5\n" for i in range(400)).encode()
    (d / "tokenizer.model").write_bytes(text if how == "text" else text[:200] + data[: len(data) // 3])
    assert "tokenizer.model" in at(scan_directory(str(d), POLICY), "TS906")


def test_sentencepiece_model_with_swapped_pieces_is_found(gemma, copy_of):
    from warden.tokenscan import spm

    d = copy_of(gemma)
    data = (d / "tokenizer.model").read_bytes()
    fields = list(spm.fields(data))
    pieces = [i for i, (n, _w, v) in enumerate(fields) if n == 1 and spm._piece(v)[2] == spm.NORMAL]  # type: ignore[arg-type]
    i, j = pieces[10], pieces[200]
    fields[i], fields[j] = fields[j], fields[i]
    out = b"".join(spm.encode_field(n, w, v) for n, w, v in fields)
    assert spm.parse_sentencepiece(out).pieces != spm.parse_sentencepiece(data).pieces
    (d / "tokenizer.model").write_bytes(out)
    assert "tokenizer.model" in at(scan_directory(str(d), POLICY), "TS1205")


def test_file_the_loader_reads_that_no_check_understands_is_incomplete(gpt2, copy_of):
    d = copy_of(gpt2)
    _write(d / "tokenizer.5.0.json", {"version": "1.0", "not": "a tokenizer"})
    config = _read(d / "tokenizer_config.json")
    _write(d / "tokenizer_config.json", {**config, "fast_tokenizer_files": ["tokenizer.5.0.json"]})
    assert "tokenizer.5.0.json" in at(scan_directory(str(d), POLICY), "TS910")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("expression", ["9 ** (9 ** (9 ** 9))", "(10 ** (10 ** 10)) * 7", "'x' * (10 ** 12)"])
def test_template_big_integer_arithmetic_ends_within_the_deadline(gpt2, copy_of, expression):
    """Jinja's ``**`` is left-associative: the parentheses make these astronomically large. The
    scanner folds none of it; the sandbox (whose compiler folds constants) is killed at its
    deadline or memory limit, which is a finding."""
    d = copy_of(gpt2)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ " + expression + " }}"
    config = _read(d / "tokenizer_config.json")
    _write(d / "tokenizer_config.json", {**config, "chat_template": template})
    start = time.monotonic()
    result = scan_directory(str(d), POLICY)
    assert time.monotonic() - start < POLICY.scan_budget_seconds + 30
    assert result.findings, "a template the sandbox could not finish must not scan clean"


def test_normalized_special_under_folding_is_found_in_either_file(gpt2, copy_of):
    d = copy_of(gpt2)
    tok = _read(d / "tokenizer.json")
    tok["normalizer"] = {"type": "NFKC"}
    _write(d / "tokenizer.json", tok)
    assert ids(scan_directory(str(d), POLICY)) == set()  # NFKC alone, specials not normalized: clean
    config = _read(d / "tokenizer_config.json")
    decoder = {"0": {"content": "<|endoftext|>", "special": True, "normalized": True}}
    _write(d / "tokenizer_config.json", {**config, "added_tokens_decoder": decoder})
    assert at(scan_directory(str(d), POLICY), "TS1211") == {"tokenizer_config.json"}
    tok["added_tokens"][0]["normalized"] = True
    _write(d / "tokenizer.json", tok)
    assert at(scan_directory(str(d), POLICY), "TS1211") == {"tokenizer_config.json", "tokenizer.json"}


def test_vocab_txt_only_layout_judges_its_special_tokens(tmp_path):
    d = build_family("bert", tmp_path / "bert")
    (d / "tokenizer.json").unlink()
    assert ids(scan_directory(str(d), POLICY)) == set()
    config = _read(d / "tokenizer_config.json")
    _write(d / "tokenizer_config.json", {**config, "pad_token": "[END]"})
    _write(d / "special_tokens_map.json", {**_read(d / "special_tokens_map.json"), "pad_token": "[END]"})
    assert "TS1002" in ids(scan_directory(str(d), POLICY))  # [END] is not a line of vocab.txt


def test_added_tokens_json_giving_a_word_id_to_a_token_is_found(gpt2, copy_of):
    d = copy_of(gpt2)
    word_id = _read(d / "vocab.json")["Ġthe"]
    _write(d / "added_tokens.json", {"<|endoftext|>": 0})
    assert ids(scan_directory(str(d), POLICY)) == set()
    _write(d / "added_tokens.json", {"<|endoftext|>": 0, "<|im_start|>": word_id})
    assert "tokenizer.json" in at(scan_directory(str(d), POLICY), "TS1210")
