# ruff: noqa: E501 - vendor chat templates and fixture tables are kept verbatim, one line each
"""Benign tokenizer directories shaped like the major families, built offline here.

Each builder trains a small tokenizer with ``tokenizers`` (and ``sentencepiece`` where the
family ships a ``.model``), with the family's pre-tokenizer, normalizer, decoder and
post-processor shape, its special tokens, its ``tokenizer_config.json`` keys (Qwen has no
bos token, Llama 3.1 no pad token, BERT no eos) and its vendor chat template (default system
prompt, date header, tool instructions, error strings). They must all scan clean with the
default policy. :func:`build_family` is the one entry point; :data:`FAMILIES` names them.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warden.tokenscan.tokenizer_behaviour import CORPUS

TRAIN_TEXT = [*CORPUS, "hello world the quick brown fox jumps over the lazy dog _ __init__ snake_case 0123456789"] * 40

LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# a minimal ChatML template reading string content or a list of text parts (the generated-input tests' base)
CHATML_PARTS_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

MISTRAL_TEMPLATE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def _byte_level(split: str, specials: list[str], normalizer: Any = None) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    return tok


def _spm_bpe(specials: list[str], unk: str) -> Any:
    """A Llama-2/Gemma/Mistral-style tokenizer.json: byte-fallback BPE on '▁'-joined text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials + bytes_, show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    return tok


def _spm_model(out: Path, model_type: str, name: str) -> None:
    """A genuine sentencepiece ``.model`` trained here (what Gemma, Mistral and T5 ship)."""
    import sentencepiece as spm

    text = out / "_train.txt"
    text.write_text("\n".join(TRAIN_TEXT), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "_spm"), vocab_size=1000 if model_type == "bpe" else 300, model_type=model_type,
        byte_fallback=model_type == "bpe", character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    (out / "_spm.model").rename(out / name)
    for extra in ("_spm.vocab", "_train.txt"):
        (out / extra).unlink()


def _template_processing(tok: Any, single: str, pair: str, tokens: list[str]) -> None:
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in tokens]
    )


def _save(tok: Any, out: Path, config: dict[str, Any], template: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    if template is not None:
        config = {**config, "chat_template": template}
    _write_json(
        out / "tokenizer_config.json", {"model_max_length": 131072, "clean_up_tokenization_spaces": False, **config}
    )
    smap = {k: v for k, v in config.items() if k.endswith("_token") and v}
    _write_json(out / "special_tokens_map.json", smap)


def llama31(out: Path) -> None:
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ]
    tok = _byte_level(LLAMA3_SPLIT, specials)
    _template_processing(
        tok, "<|begin_of_text|> $A", "<|begin_of_text|> $A <|begin_of_text|> $B", ["<|begin_of_text|>"]
    )
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tokenizer_class": "PreTrainedTokenizerFast"}
    _save(tok, out, config, LLAMA31_TEMPLATE)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": 0, "eos_token_id": [1, 4], "do_sample": True, "temperature": 0.6},
    )
    _write_json(out / "config.json", {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 900,
                                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})  # fmt: skip


LLAMA32_TEMPLATE = LLAMA31_TEMPLATE.replace(
    """{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}""",
    """{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}""",
)


def llama32(out: Path) -> None:
    """Llama 3.2: the Llama 3.1 shape whose date line comes from ``strftime_now``."""
    llama31(out)
    _set_template(out, LLAMA32_TEMPLATE)


def _set_template(out: Path, template: str) -> None:
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    _write_json(out / "tokenizer_config.json", {**config, "chat_template": template})


def qwen25(out: Path) -> None:
    from tokenizers import normalizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _byte_level(QWEN_SPLIT, specials, normalizers.NFC())
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer",
              "errors": "replace", "split_special_tokens": False, "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}  # fmt: skip
    _save(tok, out, config, QWEN25_TEMPLATE)
    model = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    _write_json(out / "vocab.json", model["vocab"])
    merges = ["#version: 0.2", *(" ".join(m) if isinstance(m, list) else m for m in model["merges"])]
    (out / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")


def gemma(out: Path) -> None:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = _spm_bpe(specials, "<unk>")
    _template_processing(tok, "<bos> $A", "<bos> $A <bos> $B", ["<bos>"])
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
              "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]}  # fmt: skip
    _save(tok, out, config, GEMMA_TEMPLATE)
    _spm_model(out, "bpe", "tokenizer.model")


def mistral(out: Path) -> None:
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
    tok = _spm_bpe(specials, "<unk>")
    _template_processing(tok, "<s> $A", "<s> $A <s> $B", ["<s>"])
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer",
              "add_bos_token": True, "legacy": False}  # fmt: skip
    _save(tok, out, config, MISTRAL_TEMPLATE)
    _spm_model(out, "bpe", "tokenizer.model")


def phi3(out: Path) -> None:
    specials = ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
    tok = _spm_bpe(specials, "<unk>")
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>",
              "tokenizer_class": "LlamaTokenizer", "add_bos_token": False}  # fmt: skip
    _save(tok, out, config, PHI3_TEMPLATE)


def bert(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        TRAIN_TEXT, trainers.WordPieceTrainer(vocab_size=800, special_tokens=specials, show_progress=False)
    )
    _template_processing(tok, "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", ["[CLS]", "[SEP]"])
    config = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
              "do_lower_case": True, "tokenizer_class": "BertTokenizer"}  # fmt: skip
    _save(tok, out, config)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (out / "vocab.txt").write_text("\n".join(k for k, _ in vocab) + "\n", encoding="utf-8")


def t5(out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    _template_processing(tok, "$A </s>", "$A </s> $B </s>", ["</s>"])
    config = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "tokenizer_class": "T5Tokenizer",
              "extra_ids": 0}  # fmt: skip
    _save(tok, out, config)
    _spm_model(out, "unigram", "spiece.model")


def gpt2(out: Path) -> None:
    """GPT-2: byte-level BPE, one token for bos/eos/unk, vocab.json + merges.txt, no template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)  # fmt: skip
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": False}  # fmt: skip
    _save(tok, out, config)
    model = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    _write_json(out / "vocab.json", model["vocab"])
    merges = ["#version: 0.2", *(" ".join(m) if isinstance(m, list) else m for m in model["merges"])]
    (out / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    _write_json(out / "config.json", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64,
                                       "_attn_implementation_autoset": True})  # fmt: skip


def bert_bare(out: Path) -> None:
    """bert-base-uncased as published: a config with no special tokens declared at all."""
    bert(out)
    _write_json(out / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": 512})
    (out / "special_tokens_map.json").unlink()
    _write_json(out / "config.json", {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 800})


# -- current families (issue 33) ------------------------------------------------------------------
# Chat templates written here to each family's public structure (role markup, where the system
# prompt goes, how reasoning, tool calls and tool results are laid out, which keyword arguments
# they read), not copied from any project: Qwen3 (thinking switch, reasoning split off assistant
# turns), DeepSeek-R1/V3 (fullwidth markers, system prompts gathered before the turns), Llama 4
# (header markers, list-of-parts content), Gemma 3 (system folded into the first user turn),
# gpt-oss (harmony: a fixed system block, developer instructions, channels, a refusal of channel
# markup inside content), Phi-4 (<|im_sep|>), a Mistral tekken layout (tekken.json beside
# tokenizer.json, a default system prompt) and a directory as transformers 5 saves it
# (chat_template.jinja, no special_tokens_map.json).

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nThe functions below may be called to help with the request.\\n\\nTheir signatures are listed inside <tools></tools> tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" + (tool | tojson) }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nTo call one, answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{\\"name\\": <name>, \\"arguments\\": <arguments>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

DEEPSEEK_TEMPLATE = """{%- if not add_generation_prompt is defined %}{%- set add_generation_prompt = false %}{%- endif %}
{%- set ns = namespace(system_prompt='', is_tool=false, is_first=true) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.system_prompt %}{%- set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- else %}{%- set ns.system_prompt = message['content'] %}{%- endif %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}{{- ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {%- set ns.is_tool = false %}
        {{- '<｜Assistant｜>' }}
        {%- if message['content'] %}{{- message['content'] }}{%- endif %}
        {{- '<｜tool▁calls▁begin｜>' }}
        {%- for tool in message['tool_calls'] %}
            {{- '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + (tool['function']['arguments'] | tojson) + '\\n```<｜tool▁call▁end｜>' }}
            {%- if not loop.last %}{{- '\\n' }}{%- endif %}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
    {%- elif message['role'] == 'assistant' %}
        {%- set content = message['content'] %}
        {%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}
        {%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
        {%- set ns.is_tool = false %}
        {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
    {%- elif message['role'] == 'tool' %}
        {%- if not ns.is_tool %}{{- '<｜tool▁outputs▁begin｜>' }}{%- else %}{{- '\\n' }}{%- endif %}
        {%- set ns.is_tool = true %}
        {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
    {%- endif %}
{%- endfor %}
{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}
"""

LLAMA4_TEMPLATE = """{{- bos_token }}
{%- macro text_of(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for part in content %}
            {%- if part['type'] == 'image' %}{{- '<|image|>' }}{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|header_start|>system<|header_end|>\\n\\n' }}{{- text_of(messages[0]['content']) | trim }}{{- '<|eot|>' }}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools %}
    {{- '<|header_start|>system<|header_end|>\\n\\nFunctions you may call, as JSON, one per line:\\n\\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}
    {{- '<|eot|>' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'tool' or message['role'] == 'ipython' %}
        {{- '<|header_start|>ipython<|header_end|>\\n\\n' }}
        {%- if message['content'] is string %}{{- message['content'] }}{%- else %}{{- message['content'] | tojson }}{%- endif %}
        {{- '<|eot|>' }}
    {%- elif 'tool_calls' in message and message['tool_calls'] %}
        {{- '<|header_start|>assistant<|header_end|>\\n\\n' }}
        {%- for call in message['tool_calls'] %}
            {%- set f = call['function'] %}
            {{- '{"name": "' + f['name'] + '", "parameters": ' + (f['arguments'] | tojson) + '}' }}
        {%- endfor %}
        {{- '<|eot|>' }}
    {%- else %}
        {{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}{{- text_of(message['content']) | trim }}{{- '<|eot|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}
"""

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Turns must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if message['role'] == 'assistant' -%}{%- set role = "model" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""

HARMONY_TEMPLATE = """{#- A harmony-style layout: a fixed system block, developer instructions, channels. -#}
{%- macro tool_namespace(name, tools) -%}
    {{- "## " + name + "\\n\\nnamespace " + name + " {\\n\\n" }}
    {%- for tool in tools %}
        {%- set tool = tool.function if tool.function is defined else tool %}
        {{- "// " + tool.description + "\\n" }}
        {{- "type " + tool.name + " = (_: {\\n" }}
        {%- for key, spec in tool.parameters.properties | dictsort %}
            {{- key + ("?" if key not in tool.parameters.required else "") + ": " + spec.type + ",\\n" }}
        {%- endfor %}
        {{- "}) => any;\\n\\n" }}
    {%- endfor %}
    {{- "} // namespace " + name }}
{%- endmacro -%}
{%- macro system_block() -%}
    {%- if model_identity is not defined %}{%- set model_identity = "You are a large language model served through the harmony format." %}{%- endif %}
    {{- model_identity + "\\n" }}
    {{- "Knowledge cutoff: 2024-06\\n" }}
    {%- if strftime_now is defined %}{{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}{%- endif %}
    {%- if reasoning_effort is not defined %}{%- set reasoning_effort = "medium" %}{%- endif %}
    {{- "Reasoning: " + reasoning_effort + "\\n\\n" }}
    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
    {%- if tools %}{{- "\\nCalls to these tools must go to the commentary channel: 'functions'." }}{%- endif %}
{%- endmacro -%}
{{- "<|start|>system<|message|>" + system_block() + "<|end|>" }}
{%- if messages[0].role == "developer" or messages[0].role == "system" %}
    {%- set instructions = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set instructions = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if instructions or tools %}
    {{- "<|start|>developer<|message|>" }}
    {%- if instructions %}{{- "# Instructions\\n\\n" + instructions + "\\n\\n" }}{%- endif %}
    {%- if tools %}{{- "# Tools\\n\\n" + tool_namespace("functions", tools) }}{%- endif %}
    {{- "<|end|>" }}
{%- endif %}
{%- set last = namespace(name="") %}
{%- for message in loop_messages %}
    {%- if message.role == "assistant" %}
        {%- if message.content is string and ("<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content) %}
            {{- raise_exception("Put reasoning in the 'thinking' field and the answer in 'content', without channel markup.") }}
        {%- endif %}
        {%- if message.thinking is defined and message.thinking %}
            {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- set call = message.tool_calls[0].function if message.tool_calls[0].function is defined else message.tool_calls[0] %}
            {%- set last.name = call.name %}
            {{- "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" + (call.arguments | tojson) + "<|call|>" }}
        {%- elif loop.last and not add_generation_prompt %}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|return|>" }}
        {%- else %}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
        {%- endif %}
    {%- elif message.role == "tool" %}
        {{- "<|start|>functions." + last.name + " to=assistant<|channel|>commentary<|message|>" + message.content + "<|end|>" }}
    {%- elif message.role == "user" %}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|start|>assistant" }}{%- endif %}
"""

PHI4_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% elif message['role'] == 'user' %}{{ '<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)

TEKKEN_TEMPLATE = """{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are a helpful assistant built on a Mistral model. Today is " + today + ".\\nWhen a question is unclear, ask for what is missing before answering." %}
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content'] %}{%- else %}{%- set system_message = messages[0]['content'][0]['text'] %}{%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}
{%- if tools %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{{- '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'system' %}
        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['tool_calls'] %}
            {{- '[TOOL_CALLS]' }}{%- for call in message['tool_calls'] %}{{- call['function']['name'] + '[ARGS]' + (call['function']['arguments'] | tojson) }}{%- endfor %}{{- eos_token }}
        {%- elif message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{{- eos_token }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]' + message['content'] + '[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Only system, user, assistant and tool roles are supported.') }}
    {%- endif %}
{%- endfor %}
"""


def qwen3(out: Path) -> None:
    from tokenizers import AddedToken, normalizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _byte_level(QWEN_SPLIT, specials, normalizers.NFC())
    tok.add_tokens(
        [
            AddedToken(t, special=False)
            for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
        ]
    )
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer",
              "errors": "replace", "split_special_tokens": False, "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}  # fmt: skip
    _save(tok, out, config, QWEN3_TEMPLATE)


def deepseek(out: Path) -> None:
    from tokenizers import AddedToken

    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    tok = _byte_level(LLAMA3_SPLIT, specials)
    markers = ["<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
               "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
               "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<think>", "</think>"]  # fmt: skip
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markers])
    config = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "pad_token": "<｜end▁of▁sentence｜>",
              "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "legacy": True}  # fmt: skip
    _save(tok, out, config, DEEPSEEK_TEMPLATE)


def llama4(out: Path) -> None:
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|header_start|>",
        "<|header_end|>",
        "<|eot|>",
        "<|eom|>",
        "<|image|>",
        "<|finetune_right_pad|>",
    ]
    tok = _byte_level(LLAMA3_SPLIT, specials)
    _template_processing(
        tok, "<|begin_of_text|> $A", "<|begin_of_text|> $A <|begin_of_text|> $B", ["<|begin_of_text|>"]
    )
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>", "pad_token": "<|finetune_right_pad|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    _save(tok, out, config, LLAMA4_TEMPLATE)


def gemma3(out: Path) -> None:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]
    tok = _spm_bpe(specials, "<unk>")
    _template_processing(tok, "<bos> $A", "<bos> $A <bos> $B", ["<bos>"])
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
              "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>", "<start_of_image>"]}  # fmt: skip
    _save(tok, out, config, GEMMA3_TEMPLATE)


def gpt_oss(out: Path) -> None:
    specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                "<|message|>", "<|call|>"]  # fmt: skip
    tok = _byte_level(LLAMA3_SPLIT, specials)
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    _save(tok, out, config)
    (out / "chat_template.jinja").write_text(HARMONY_TEMPLATE, encoding="utf-8")


def phi4(out: Path) -> None:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|dummy_85|>"]
    tok = _byte_level(LLAMA3_SPLIT, specials)
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|dummy_85|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    _save(tok, out, config, PHI4_TEMPLATE)


def mistral_tekken(out: Path) -> None:
    """Mistral's tekken layout: ``tekken.json`` (mistral-common's own file) beside the
    ``tokenizer.json`` transformers loads, control tokens in square brackets."""
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[ARGS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]  # fmt: skip
    tok = _byte_level(LLAMA3_SPLIT, specials)
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizerFast",
              "add_bos_token": True, "legacy": False}  # fmt: skip
    _save(tok, out, config, TEKKEN_TEMPLATE)
    vocab = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    _write_json(out / "tekken.json", {
        "config": {"pattern": LLAMA3_SPLIT, "num_vocab_tokens": len(vocab), "default_vocab_size": len(vocab),
                   "default_num_special_tokens": len(specials), "version": "v7"},
        "special_tokens": [{"rank": i, "token_str": t, "is_control": True} for i, t in enumerate(specials)],
        "vocab": [{"rank": i, "token_bytes": base64.b64encode(t.encode()).decode(), "token_str": t}
                  for i, t in enumerate(t for t, _id in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials)],
    })  # fmt: skip


def transformers5(out: Path) -> None:
    """A directory as transformers 5 saves it: ``chat_template.jinja`` beside the config, the
    special tokens in ``tokenizer_config.json`` only, the ``TokenizersBackend`` class."""
    qwen3(out)
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = config.pop("chat_template")
    config["tokenizer_class"] = "TokenizersBackend"
    _write_json(out / "tokenizer_config.json", config)
    (out / "special_tokens_map.json").unlink()
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")


CURRENT_FAMILIES: dict[str, Callable[[Path], None]] = {
    "qwen3": qwen3,
    "deepseek-r1": deepseek,
    "llama4": llama4,
    "gemma3": gemma3,
    "gpt-oss": gpt_oss,
    "phi4": phi4,
    "mistral-tekken": mistral_tekken,
    "transformers5": transformers5,
}

CURRENT_TEMPLATES: dict[str, str] = {
    "qwen3": QWEN3_TEMPLATE,
    "deepseek-r1": DEEPSEEK_TEMPLATE,
    "llama4": LLAMA4_TEMPLATE,
    "gemma3": GEMMA3_TEMPLATE,
    "gpt-oss": HARMONY_TEMPLATE,
    "phi4": PHI4_TEMPLATE,
    "mistral-tekken": TEKKEN_TEMPLATE,
}


FAMILIES: dict[str, Callable[[Path], None]] = {
    "llama3.1": llama31,
    "llama3.2": llama32,
    "qwen2.5": qwen25,
    "gemma": gemma,
    "mistral": mistral,
    "phi3": phi3,
    "bert": bert,
    "bert-bare": bert_bare,
    "gpt2": gpt2,
    "t5": t5,
}
FAMILIES.update(CURRENT_FAMILIES)


def build_family(name: str, out: Path) -> Path:
    """Builds family ``name`` into ``out`` (created); returns ``out``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    FAMILIES[name](out)
    return out
