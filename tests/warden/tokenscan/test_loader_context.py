"""The scanner renders templates with exactly the variables transformers 5 passes them
(exercise.loader_context, red-team round 3): the named special tokens of its
``special_tokens_map`` (``mask_token``, the names ``extra_special_tokens`` gives as a mapping,
such as ``image_token``) and ``apply_chat_template``'s own keywords, nothing else, so
``x is defined`` cannot tell the scanner from the loader. Checked on every family fixture and on
generated named extra tokens, against what the installed transformers hands its renderer. A token
the tokenizer class sets by itself where no config names it (Qwen2's unk_token) is not mirrored:
those are excluded from the comparison, never passed by the scanner."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.warden.tokenscan import families as fam
from warden.tokenscan.exercise import loader_context
from warden.tokenscan.policy import default_policy
from warden.tokenscan.scanner import build_snapshot

RENDER_ONLY = {"conversations", "chat_template", "add_generation_prompt"}  # passed per call, not context


def _transformers_kwargs(d: Path) -> dict[str, Any]:
    """The variables transformers' apply_chat_template hands render_jinja_template for ``d``."""
    import transformers.tokenization_utils_base as tub
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    seen: dict[str, Any] = {}
    real = tub.render_jinja_template

    def spy(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return real(**kwargs)

    tub.render_jinja_template = spy  # type: ignore[assignment]
    try:
        tok.apply_chat_template([{"role": "user", "content": "hi"}], chat_template="x", tokenize=False)
    finally:
        tub.render_jinja_template = real  # type: ignore[assignment]
    return {k: v for k, v in seen.items() if k not in RENDER_ONLY}


def _ours(d: Path) -> dict[str, Any]:
    return {k: v for k, v in loader_context(build_snapshot(str(d), default_policy())).items() if k not in RENDER_ONLY}


def _named_by_configs(d: Path) -> set[str]:
    """The keys the directory's configs set (a class's own defaults, such as Qwen2's unk_token, are not)."""
    names: set[str] = set()
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        if (d / f).exists():
            data = json.loads((d / f).read_text(encoding="utf-8"))
            names |= {k for k in data if k.endswith("_token")}
            names |= (
                set(data.get("extra_special_tokens") or {})
                if isinstance(data.get("extra_special_tokens"), dict)
                else set()
            )
    return names


def _assert_mirrors(d: Path) -> None:
    ours, theirs = _ours(d), _transformers_kwargs(d)
    assert {k: theirs.get(k, "<undefined>") for k in ours} == ours  # nothing defined that transformers leaves out
    named = {k for k in theirs if not k.endswith("_token") or k in _named_by_configs(d)}
    assert {k: ours.get(k, "<undefined>") for k in named} == {k: theirs[k] for k in named}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: fam.build_family(name, root / name) for name in ("qwen2.5", "gemma", "mistral", "deepseek-r1")}


NOT_LOADABLE = ("llama3.1", "llama3.2")  # transformers 5.24 refuses their config.json (rope_parameters)


@pytest.mark.parametrize("family", sorted(set(fam.FAMILIES) - set(NOT_LOADABLE)))
def test_the_context_of_each_family_is_what_transformers_passes(family: str, tmp_path: Path) -> None:
    _assert_mirrors(fam.build_family(family, tmp_path / family))


NAME = st.text(string.ascii_lowercase, min_size=3, max_size=10).map(lambda s: s + "_token")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.sampled_from(["qwen2.5", "gemma", "mistral", "deepseek-r1"]),
    named=st.dictionaries(NAME, st.sampled_from(["<tool_call>", "</tool_call>", "not", "<x>"]), max_size=3),
    mask=st.sampled_from([None, "<mask>", "not"]),
    as_object=st.booleans(),
)
def test_named_extra_tokens_and_the_mask_token_are_passed_as_transformers_does(
    bases: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, base: str, named: dict[str, str],
    mask: str | None, as_object: bool,
) -> None:  # fmt: skip
    d = tmp_path_factory.mktemp("named") / base
    shutil.copytree(bases[base], d)
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = {k: {"content": v, "__type": "AddedToken"} if as_object else v for k, v in named.items()}
    config["extra_special_tokens"] = values
    if mask is not None:
        config["mask_token"] = mask
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    _assert_mirrors(d)
    ours = _ours(d)
    assert all(ours[k] == v for k, v in named.items())
