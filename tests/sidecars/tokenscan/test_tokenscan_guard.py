"""The trainer's tokenizer guard (trainer/tokenizer.py) runs the full scan, fail closed."""

from __future__ import annotations

import json

import pytest

from trainer.config import ModelConfig
from trainer.tokenizer import UnsafeTokenizer, guard_policy, load_tokenizer

ALLOWED = ModelConfig().allowed_tokenizer_classes


@pytest.fixture
def no_transformers_load(monkeypatch):
    """Fails the test if the guard lets transformers open the directory."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the guard let transformers load a directory it should have refused")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def test_benign_tokenizer_and_model_dir_load(tokenscan_corpus):
    tok = load_tokenizer(str(tokenscan_corpus.benign), ALLOWED)
    assert type(tok).__name__ in ALLOWED and tok.pad_token == "<|pad|>"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>user")
    model = load_tokenizer(str(tokenscan_corpus.model), ALLOWED, policy=str(tokenscan_corpus.policy_file))
    assert type(model).__name__ in ALLOWED


@pytest.mark.parametrize(
    ("case", "rule"),
    [
        ("auto_map_with_py", "TS101"),
        ("pickle_os_system", "TS901"),
        ("torch_zip_as_tokenizer_model", "TS901"),
        ("ssti_template", "TS802"),
        ("symlinked_directory", "TS601"),
        ("fast_tokenizer_files_traversal", "TS501"),
        ("attn_implementation_internal", "TS702"),
        ("tokenizer_class_model", "TS301"),
    ],
)
def test_malicious_directories_are_refused_before_loading(tokenscan_corpus, no_transformers_load, case, rule):
    with pytest.raises(UnsafeTokenizer, match=rule) as err:
        load_tokenizer(str(tokenscan_corpus.case(case)), ALLOWED)
    assert err.value.exit_code == 1 and "warden scan tokenizer" in str(err.value)


def test_environment_and_path_preconditions(tokenscan_corpus, no_transformers_load, monkeypatch, tmp_path):
    monkeypatch.setenv("TRUST_REMOTE_CODE", "")
    with pytest.raises(UnsafeTokenizer, match="TRUST_REMOTE_CODE"):
        load_tokenizer(str(tokenscan_corpus.benign), ALLOWED)
    monkeypatch.delenv("TRUST_REMOTE_CODE")
    with pytest.raises(UnsafeTokenizer, match="must be absolute"):
        load_tokenizer("relative/tok", ALLOWED)
    with pytest.raises(UnsafeTokenizer, match="no such directory"):
        load_tokenizer(str(tmp_path / "missing"), ALLOWED)


def test_whitelist_is_the_intersection_of_argument_and_policy(tokenscan_corpus, no_transformers_load):
    with pytest.raises(UnsafeTokenizer, match="TS301"):
        load_tokenizer(str(tokenscan_corpus.benign), ("LlamaTokenizerFast",))
    narrowed = guard_policy(("TokenizersBackend", "Other"), str(tokenscan_corpus.policy_file))
    assert narrowed.allowed_tokenizer_classes == ("TokenizersBackend",)
    assert guard_policy(("X",)).allowed_tokenizer_classes == ("X",)


def test_a_file_changed_while_loading_is_refused(fresh_benign, monkeypatch):
    import transformers

    original = transformers.AutoTokenizer.from_pretrained

    def load_then_tamper(path, **kwargs):
        assert kwargs == {"trust_remote_code": False, "local_files_only": True}
        tok = original(path, **kwargs)
        config = fresh_benign / "tokenizer_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "auto_map": {"AutoTokenizer": "x.Y"}}))
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load_then_tamper)
    with pytest.raises(UnsafeTokenizer, match=r"changed while .*\(changed: tokenizer_config.json\)"):
        load_tokenizer(str(fresh_benign), ALLOWED)


def test_a_loaded_class_off_the_whitelist_is_refused(fresh_benign, monkeypatch):
    import transformers

    class Sneaky:
        pad_token_id = 0

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Sneaky())
    with pytest.raises(UnsafeTokenizer, match=r"loaded class .*Sneaky"):
        load_tokenizer(str(fresh_benign), ALLOWED)
