"""The loader-read settings that change how text becomes ids, each with its value judgement (pure).

Invariant: every ``tokenizer_config.json`` key and ``tokenizer.json`` field that transformers 5
(``PreTrainedTokenizerBase.__init__``, ``TokenizersBackend.__init__``, the sentencepiece
backend) or ``tokenizers`` reads and that changes what an encoding returns is a row of
:data:`CONFIG_SETTINGS` or :data:`TOKENIZER_JSON_SETTINGS`; a value outside the row's safe values
is a problem naming the key, the value and what it does. Safe values are the loader's defaults
and the values real families ship (``padding_side`` left for batched generation, either
``clean_up_tokenization_spaces``, ``ignore``-free byte errors). Keys absent from a file are never
judged: the loader's default applies.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from warden.tokenscan.checks.common import short

# The shortest context of any tokenizer family a loader may meet: encoder and text-tower
# tokenizers truncate at 64 (SigLIP), 77 (CLIP), 512 (BERT, T5); every chat family's context is
# 2048 tokens or more. Below these, every longer prompt is cut (``truncation=True``).
MIN_MODEL_MAX_LENGTH = 64
MIN_CHAT_MODEL_MAX_LENGTH = 1024
REQUIRED_INPUT_NAMES = ("input_ids", "attention_mask")
MAX_PAD_MULTIPLE = 128  # pad_to_multiple_of of real configs: 8, 16, 64 (tensor-core alignment)


@dataclass(frozen=True)
class SettingContext:
    """What a judgement may need beside the value: ``chat`` (the tokenizer has a chat template),
    ``markup`` (added tokens that are markup and not special: ``chat_control_tokens`` must keep
    them), ``specials`` (special added token -> id of the tokenizer.json beside)."""

    chat: bool = False
    markup: frozenset[str] = frozenset()
    specials: Mapping[str, int] = field(default_factory=dict)


SettingJudge = Callable[[Any, SettingContext], str | None]  # why the value is unsafe, or None


def _is(value: Any, allowed: Any) -> bool:
    """Equality that keeps ``True`` apart from ``1`` (the loader reads them differently)."""
    return type(value) is type(allowed) and value == allowed


def one_of(*allowed: Any) -> SettingJudge:
    """Safe exactly when the value is one of ``allowed``."""

    def judge(value: Any, _ctx: SettingContext) -> str | None:
        return None if any(_is(value, a) for a in allowed) else f"not one of {', '.join(map(repr, allowed))}"

    return judge


BOOLEAN = one_of(True, False, None)


def _length(floor_of: Callable[[SettingContext], int]) -> SettingJudge:
    def judge(value: Any, ctx: SettingContext) -> str | None:
        floor = floor_of(ctx)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number of tokens"
        if value < floor:
            kind = "a chat tokenizer's" if ctx.chat else "any tokenizer's"
            return f"truncates prompts far below {kind} context (at least {floor})"
        return None

    return judge


MAX_LENGTH = _length(lambda ctx: MIN_CHAT_MODEL_MAX_LENGTH if ctx.chat else MIN_MODEL_MAX_LENGTH)


def _input_names(value: Any, _ctx: SettingContext) -> str | None:
    missing = [n for n in REQUIRED_INPUT_NAMES if not (isinstance(value, list) and n in value)]
    return f"lacks {', '.join(missing)}" if missing else None


def _control_tokens(value: Any, ctx: SettingContext) -> str | None:
    """``chat_control_tokens`` replaces the loader's own list of markup it escapes in user text
    (the special added tokens and the added tokens the template holds): a list must keep every
    markup added token, else user text holding it becomes that control token."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return "not a list of tokens"
    dropped = sorted(ctx.markup - set(value))
    return f"leaves out the markup token(s) {', '.join(map(repr, dropped[:4]))}" if dropped else None


def _sp_model_kwargs(value: Any, _ctx: SettingContext) -> str | None:
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        return "not a mapping"
    if value.get("enable_sampling"):
        return "enables sentencepiece sampling"
    unknown = sorted(str(k) for k in value if k not in ("enable_sampling", "nbest_size", "alpha"))
    return f"passes {', '.join(unknown[:4])} to sentencepiece" if unknown else None


@dataclass(frozen=True)
class Setting:
    """One loader-read setting: its ``judge`` and ``effect`` (what an unsafe value does)."""

    judge: SettingJudge
    effect: str


CONFIG_SETTINGS: dict[str, Setting] = {
    "model_max_length": Setting(MAX_LENGTH, "every longer prompt is truncated (truncation=True)"),
    "model_input_names": Setting(_input_names, "the tokenizer stops returning the mask: padding is attended to"),
    "truncation_side": Setting(one_of("right"), "truncation keeps the end of each prompt and drops its start "
                                                "(the system prompt)"),
    "padding_side": Setting(one_of("right", "left"), "the loader refuses it or pads where the model does not expect"),
    "split_special_tokens": Setting(one_of(False, None), "every special token in the text (chat markup) is encoded "
                                                         "as plain text"),
    "clean_up_tokenization_spaces": Setting(BOOLEAN, "decode rewrites spaces around punctuation unpredictably"),
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": Setting(
        one_of(False, None), "decode deletes spaces of BPE text (corrupts every decoded answer)"),
    "do_lower_case": Setting(BOOLEAN, "the loader's case folding is not a boolean"),
    "strip_accents": Setting(BOOLEAN, "the loader's accent stripping is not a boolean"),
    "tokenize_chinese_chars": Setting(BOOLEAN, "the loader's CJK splitting is not a boolean"),
    "add_prefix_space": Setting(BOOLEAN, "the loader's prefix space is not a boolean"),
    "trim_offsets": Setting(BOOLEAN, "the loader's offset trimming is not a boolean"),
    "add_bos_token": Setting(BOOLEAN, "the loader's bos switch is not a boolean"),
    "add_eos_token": Setting(one_of(False, None), "eos is appended to every encoding: every prompt reads as ended"),
    "legacy": Setting(BOOLEAN, "the loader's legacy switch is not a boolean"),
    "add_dummy_prefix": Setting(BOOLEAN, "the loader's dummy prefix is not a boolean"),
    "spaces_between_special_tokens": Setting(BOOLEAN, "the decoder's spacing switch is not a boolean"),
    "errors": Setting(one_of("replace", "strict"), "decode drops or rewrites bytes that are not UTF-8"),
    "sp_model_kwargs": Setting(_sp_model_kwargs, "the same text encodes differently each time (subword sampling)"),
    "chat_control_tokens": Setting(_control_tokens, "user text holding that markup becomes a control token "
                                                    "(apply_chat_template escapes only the tokens listed)"),
}  # fmt: skip
"""tokenizer_config.json key -> its judgement (read by ``PreTrainedTokenizerBase.__init__`` and the
backends). ``*_token`` keys and ``extra_special_tokens`` are special tokens
(:func:`..declared.loader_special_tokens`), judged by the special-token checks."""

TRUNCATION_STRATEGIES = ("LongestFirst", "OnlyFirst", "OnlySecond")


def _truncation(value: Any, ctx: SettingContext) -> str | None:
    """``tokenizer.json`` ``truncation``: ``TokenizersBackend`` enables it on the backend and takes
    ``truncation_side`` and ``max_length`` from it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "not a truncation object"
    if value.get("direction", "Right") != "Right":
        return f"direction {short(value.get('direction'), 20)!r} keeps the end of each prompt (truncation_side left)"
    if value.get("strategy", "LongestFirst") not in TRUNCATION_STRATEGIES:
        return f"strategy {short(value.get('strategy'), 20)!r} is not one of {', '.join(TRUNCATION_STRATEGIES)}"
    stride = value.get("stride", 0)
    if type(stride) is not int or stride < 0:
        return f"stride {short(stride, 20)!r} is not a token count"
    why = MAX_LENGTH(value.get("max_length"), ctx)
    return f"max_length {short(value.get('max_length'), 20)!r} {why}" if why else None


def _padding(value: Any, ctx: SettingContext) -> str | None:
    """``tokenizer.json`` ``padding``: ``TokenizersBackend`` takes ``padding_side``, ``pad_token``,
    ``pad_token_type_id`` and a fixed length from it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "not a padding object"
    if value.get("direction", "Right") not in ("Right", "Left"):
        return f"direction {short(value.get('direction'), 20)!r} is neither Right nor Left"
    strategy = value.get("strategy", "BatchLongest")
    fixed = strategy.get("Fixed") if isinstance(strategy, dict) and len(strategy) == 1 else None
    if strategy != "BatchLongest" and not (type(fixed) is int and not MAX_LENGTH(fixed, ctx)):
        return f"strategy {short(strategy, 30)!r} pads or cuts every encoding to a fixed length"
    if not _is(value.get("pad_type_id", 0), 0):
        return f"pad_type_id {short(value.get('pad_type_id'), 20)!r} is not 0"
    multiple = value.get("pad_to_multiple_of")
    if multiple is not None and not (type(multiple) is int and 1 <= multiple <= MAX_PAD_MULTIPLE):
        return f"pad_to_multiple_of {short(multiple, 20)!r} is not a small alignment"
    pad, ident = value.get("pad_token", "[PAD]"), value.get("pad_id", 0)
    if ctx.specials.get(pad) != ident or type(ident) is not int:
        return f"pad_token {short(pad, 30)!r} (id {short(ident, 12)}) is not a special added token of that id"
    return None


TOKENIZER_JSON_SETTINGS: dict[str, Setting] = {
    "truncation": Setting(_truncation, "every encoding is truncated the way it says"),
    "padding": Setting(_padding, "the loader pads with it (pad token, side, length)"),
}
"""tokenizer.json field -> its judgement (the fields outside the pipeline that the loader reads)."""


def setting_problems(
    table: Mapping[str, Setting], doc: Mapping[str, Any], ctx: SettingContext, only: Collection[str] | None = None
) -> list[tuple[str, str]]:
    """(key, why) for each key of ``doc`` in ``table`` whose value its judge refuses: the key, the
    value and what it does. ``only``: judge just these keys."""
    out = []
    for key, setting in table.items():
        if key not in doc or (only is not None and key not in only):
            continue
        why = setting.judge(doc[key], ctx)
        if why:
            out.append((key, f"{key} {short(doc[key], 60)!r}: {why}; {setting.effect}"))
    return out
