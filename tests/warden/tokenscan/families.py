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


def build_family(name: str, out: Path) -> Path:
    """Builds family ``name`` into ``out`` (created); returns ``out``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    FAMILIES[name](out)
    return out
