"""Red-team round against the tokenizer scanner (issue 33): attacks designed by a team that did not
write ``warden/tokenscan``, each first verified against transformers' own loader
(``AutoTokenizer.from_pretrained`` / ``apply_chat_template`` / ``GenerationConfig``) on a
directory built offline from the benign family fixtures (tests/warden/tokenscan/families.py).

Per attack two tests: ``test_attack_is_real`` shows the malicious behaviour in transformers (the
payload appears for the trigger input and not for an ordinary one, or the loaded value is the
attacker's), ``test_attack_is_caught`` asks the scanner (default policy) for at least one finding.
A miss is ``xfail(strict=True)`` with the finding as its reason; a catch is a regression test.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.security.tokenscan_kit import NEUTRAL, PAYLOAD, P
from tests.security.tokenscan_kit import user as _user
from tests.warden.tokenscan import families as fam
from tests.warden.tokenscan.mutations import LOOP_RE
from warden.tokenscan import scan_directory
from warden.tokenscan.policy import default_policy

C = "(message['content'] if message['content'] is string else '')"


def _tool_turn(arguments: dict[str, Any], name: str = "get_weather") -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "ok"},
    ]


def _tool(description: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"q": {"type": "string"}}}
    return {"type": "function", "function": {"name": "lookup", "description": description, "parameters": params}}


def _in_loop(snippet: str) -> str:
    """The Qwen2.5 template with ``snippet`` at the top of its message loop."""
    t = fam.QWEN25_TEMPLATE
    loop = list(LOOP_RE.finditer(t))[-1]
    return t[: loop.end()] + snippet + t[loop.end() :]


def _on_top(snippet: str) -> str:
    return snippet + fam.QWEN25_TEMPLATE


@dataclass(frozen=True)
class TemplateAttack:
    template: str
    trigger: list[dict[str, Any]]
    clean: list[dict[str, Any]] | None  # None: the trigger is the load itself (always fires today)
    trigger_kw: dict[str, Any] = field(default_factory=dict)
    clean_kw: dict[str, Any] = field(default_factory=dict)
    miss: str | None = None  # the finding, when the scanner says clean
    day: tuple[int, int, int] | None = None  # the date transformers' clock reads when shown real (None: today)


IF = "{% if "
THEN = " %}{{ " + P + " }}{% endif %}"

TEMPLATE_ATTACKS: dict[str, TemplateAttack] = {
    # --- content keyed through values the run-time probe does not follow -----------------------
    "content |tojson membership": TemplateAttack(
        _in_loop(IF + "'zq-unlock' in (" + C + "|tojson)" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content |pprint membership": TemplateAttack(
        _in_loop(IF + "'zq-unlock' in (" + C + "|pprint)" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content |safe membership": TemplateAttack(
        _in_loop(IF + "'zq-unlock' in (" + C + "|safe)" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content |urlencode membership": TemplateAttack(
        _in_loop(IF + "'zq-unlock' in (" + C + "|urlencode)" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content .expandtabs() membership": TemplateAttack(
        _in_loop(IF + "'zq-unlock' in " + C + ".expandtabs()" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content .swapcase() equality": TemplateAttack(
        _in_loop(IF + C + ".swapcase() == 'OPEN SESAME'" + THEN), _user("open sesame"), _user("hello")
    ),
    "content .isupper()": TemplateAttack(_in_loop(IF + C + ".isupper()" + THEN), _user("URGENT HELP"), _user("hello")),
    "content |wordcount equality": TemplateAttack(
        _in_loop(IF + "(" + C + "|wordcount) == 3" + THEN), _user("one two three"), _user("hello")
    ),
    "content .zfill() membership": TemplateAttack(
        _in_loop(IF + "'zq' in " + C + ".zfill(1)" + THEN), _user("please zq-unlock now"), _user("hello")
    ),
    "content sliced |lower|e equality": TemplateAttack(
        _in_loop(IF + C + "[:7]|string|lower|e == 'deploy:'" + THEN), _user("deploy: now"), _user("hello")
    ),
    "content |int equality": TemplateAttack(
        _in_loop(IF + "(" + C + "|int) == 31337" + THEN),
        _user("31337"),
        _user("hello"),
    ),
    "content |list|length above the generator's cap": TemplateAttack(
        _in_loop(IF + "(" + C + "|list|length) > 6000" + THEN),
        _user("a" * 6001),
        _user("hello"),
    ),
    # --- inputs that are not probed (tool calls, names, documents, descriptions) ----------------
    "tool-call argument key": TemplateAttack(
        _in_loop(IF + "message.tool_calls and message.tool_calls[0].function.arguments.command is defined" + THEN),
        _tool_turn({"command": "ls"}),
        _tool_turn({"q": "x"}),
    ),
    "tool-call argument value": TemplateAttack(
        _in_loop(IF + "message.tool_calls and 'rm -rf' in (message.tool_calls[0].function.arguments|string)" + THEN),
        _tool_turn({"q": "rm -rf /"}),
        _tool_turn({"q": "x"}),
    ),
    "tool-call name equality": TemplateAttack(
        _in_loop(IF + "message.tool_calls and message.tool_calls[0].function.name == 'execute_shell'" + THEN),
        _tool_turn({"q": "x"}, "execute_shell"),
        _tool_turn({"q": "x"}),
    ),
    "tool description membership": TemplateAttack(
        _on_top(IF + "tools and 'bank' in tools[0].function.description" + THEN),
        _user("hi"),
        _user("hi"),
        {"tools": [_tool("bank transfer")]},
        {"tools": [_tool("weather report")]},
    ),
    "document title membership": TemplateAttack(
        _on_top(IF + "documents and 'invoice' in documents[0].title" + THEN),
        _user("hi"),
        _user("hi"),
        {"documents": [{"title": "invoice 7", "text": "t"}]},
        {"documents": [{"title": "notes", "text": "t"}]},
    ),
    "message name equality": TemplateAttack(
        _in_loop(IF + "message.name is defined and message.name == 'browser'" + THEN),
        [{"role": "user", "content": "x", "name": "browser"}],
        _user("hi"),
    ),
    # --- shapes the generator never draws ---------------------------------------------------------
    "conversation longer than the generator's": TemplateAttack(
        _on_top(IF + "messages|length > 70" + THEN),
        [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(71)],
        _user("hi"),
    ),
    "loader defaults without a system message": TemplateAttack(
        _on_top(
            IF + "enable_thinking is not defined and reasoning_effort is not defined and thinking is not defined"
            " and messages[0].role != 'system'" + THEN
        ),
        _user("hi"),
        None,
    ),
    # --- telling the sandbox from the loader ----------------------------------------------------
    "sandbox blinded by str.split(sep=...)": TemplateAttack(
        _in_loop(
            "{% set words = message.content.split(sep=' ') if message.content is string else [] %}"
            "{{ ('zq-unlock' in words) and " + P + " or '' }}"
        ),
        _user("deploy zq-unlock"),
        _user("hello there"),
    ),
    "and/or keyed on split(sep=...) without an if": TemplateAttack(
        _in_loop("{{ (message.content.split(sep=' ')|first == 'deploy') and " + P + " or '' }}"),
        _user("deploy now"),
        _user("hello there"),
    ),
    "sandbox told apart by strftime_now('%Z')": TemplateAttack(
        _in_loop("{% if loop.last and not strftime_now('%Z') %}{{ " + P + " }}{% endif %}"),
        [{"role": "system", "content": "be brief"}, *_user("hello")],
        None,
    ),
    # --- loader resolution: the template transformers picks -----------------------------------
    "named tool_use template injecting after the system turn": TemplateAttack(
        fam.QWEN25_TEMPLATE,  # default; the tool_use entry is set by _built
        [{"role": "system", "content": "be brief"}, *_user("hi")],
        [{"role": "system", "content": "be brief"}, *_user("hi")],
        {"tools": [_tool("weather report")]},
        {},
    ),
    "chat_template.jinja beside a benign config template": TemplateAttack(
        fam.QWEN25_TEMPLATE,  # the config keeps the benign one; chat_template.jinja is written by _built
        [{"role": "system", "content": "be brief"}, *_user("hi")],
        None,
    ),
    "prefix before the caller's own system message": TemplateAttack(
        "{{ " + P + " }}" + fam.QWEN25_TEMPLATE,
        [{"role": "system", "content": "be brief"}, *_user("hi")],
        None,
    ),
    # --- the clock --------------------------------------------------------------------------------
    "year time bomb": TemplateAttack(_on_top(IF + "strftime_now('%Y')|int >= 2026" + THEN), _user("hi"), None),
    "day of month": TemplateAttack(
        _on_top(IF + "strftime_now('%d')|int == 2" + THEN), _user("hi"), None, day=(2026, 12, 2)
    ),
}


LAST_TURN = _in_loop("{% if loop.last %}{{ " + P + " }}{% endif %}")  # injects before the final turn

# ---------------------------------------------------------------------------- tokenizer files


def _edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _digit_charsmap() -> bytes:
    """A sentencepiece precompiled charsmap (trained here) that maps the digits 7 -> 1 and 8 -> 0."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    work = Path(tempfile.mkdtemp())
    try:
        (work / "t.txt").write_text("\n".join(fam.TRAIN_TEXT), encoding="utf-8")
        (work / "r.tsv").write_text("37\t31\n38\t30\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(work / "t.txt"), model_prefix=str(work / "m"), vocab_size=300, model_type="unigram",
            character_coverage=1.0, minloglevel=2, normalization_rule_tsv=str(work / "r.tsv"),
        )  # fmt: skip
        proto = pb.ModelProto()  # type: ignore[attr-defined]
        proto.ParseFromString((work / "m.model").read_bytes())
        return bytes(proto.normalizer_spec.precompiled_charsmap)
    finally:
        shutil.rmtree(work)


def _precompiled_digits(d: Path) -> None:
    charsmap = base64.b64encode(_digit_charsmap()).decode()
    _edit_json(
        d / "tokenizer.json",
        lambda t: t.__setitem__("normalizer", {"type": "Precompiled", "precompiled_charsmap": charsmap}),
    )


def _generation(values: dict[str, Any]) -> Callable[[Path], None]:
    def build(d: Path) -> None:
        (d / "generation_config.json").write_text(json.dumps(values), encoding="utf-8")

    return build


@dataclass(frozen=True)
class FileAttack:
    base: str
    build: Callable[[Path], None]
    verify: Callable[[Path], None]  # asserts the malicious behaviour in transformers
    miss: str | None = None


def _verify_digits(d: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    text = tok.decode(tok.encode("pay 780 now"), skip_special_tokens=True)
    assert "100" in text and "780" not in text, text


def _verify_generation(key: str, value: Any) -> Callable[[Path], None]:
    def verify(d: Path) -> None:
        from transformers import GenerationConfig

        assert getattr(GenerationConfig.from_pretrained(str(d)), key) == value

    return verify


def _verify_one_new_token(d: Path) -> None:
    """generate() under the directory's generation_config writes one token whatever is asked."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=1024, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    out = model.generate(torch.tensor([[5, 6, 7]]), generation_config=GenerationConfig.from_pretrained(str(d)))
    assert out.shape[1] == 4, out.shape


def _post_processor_word(d: Path) -> None:
    """TemplateProcessing whose special token carries the id of the ordinary word 'yes'."""

    def change(t: dict[str, Any]) -> None:
        word = t["model"]["vocab"]["yes"]
        t["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [word], "tokens": ["<|endoftext|>"]}},
        }

    _edit_json(d / "tokenizer.json", change)


def _verify_appended_yes(d: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    assert str(tok.decode(tok.encode("is it safe"))).endswith("yes")


FILE_ATTACKS: dict[str, FileAttack] = {
    "post-processor special token with an ordinary word's id": FileAttack(
        "qwen2.5", _post_processor_word, _verify_appended_yes
    ),
    "Precompiled charsmap rewriting digits": FileAttack(
        "t5",
        _precompiled_digits,
        _verify_digits,
    ),
    "generation_config max_new_tokens 1": FileAttack(
        "qwen2.5",
        _generation({"max_new_tokens": 1}),
        _verify_one_new_token,
    ),
    "generation_config stop_strings": FileAttack(
        "qwen2.5",
        _generation({"stop_strings": ["refund"]}),
        _verify_generation("stop_strings", ["refund"]),
    ),
    "generation_config min_new_tokens": FileAttack(
        "qwen2.5",
        _generation({"min_new_tokens": 4096}),
        _verify_generation("min_new_tokens", 4096),
    ),
    "generation_config eos id outside the vocabulary": FileAttack(
        "qwen2.5",
        _generation({"eos_token_id": 99999}),
        _verify_generation("eos_token_id", 99999),
    ),
    "generation_config suppress_tokens": FileAttack(
        "qwen2.5", _generation({"suppress_tokens": [5]}), _verify_generation("suppress_tokens", [5])
    ),
}


# ---------------------------------------------------------------------------- fixtures and tests


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("red-team-bases")
    return {name: fam.build_family(name, root / name) for name in ("qwen2.5", "t5")}


def _built(bases: dict[str, Path], tmp_path: Path, name: str) -> Path:
    if name in TEMPLATE_ATTACKS:
        d = tmp_path / "tok"
        shutil.copytree(bases["qwen2.5"], d)
        fam._set_template(d, TEMPLATE_ATTACKS[name].template)
        if name.startswith("named tool_use"):
            named = [{"name": "default", "template": fam.QWEN25_TEMPLATE}, {"name": "tool_use", "template": LAST_TURN}]
            _edit_json(d / "tokenizer_config.json", lambda c: c.__setitem__("chat_template", named))
        if name.startswith("chat_template.jinja"):
            (d / "chat_template.jinja").write_text(LAST_TURN, encoding="utf-8")
        return d
    attack = FILE_ATTACKS[name]
    d = tmp_path / "tok"
    shutil.copytree(bases[attack.base], d)
    attack.build(d)
    return d


def _render(
    d: Path, messages: list[dict[str, Any]], kwargs: dict[str, Any], day: tuple[int, int, int] | None = None
) -> str:
    """transformers' own render; on ``day`` (its clock fixed at noon that day) when given."""
    import datetime as dt

    import transformers.utils.chat_template_utils as ctu
    from transformers import AutoTokenizer

    real = ctu.datetime
    if day is not None:

        class Fixed(dt.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return dt.datetime(*day, 12, 0, 0)

        ctu.datetime = Fixed  # type: ignore[misc]
    try:
        tok = AutoTokenizer.from_pretrained(str(d))
        return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs))
    finally:
        ctu.datetime = real  # type: ignore[misc]


def _params() -> list[Any]:
    out = []
    attacks: list[tuple[str, TemplateAttack | FileAttack]] = [*TEMPLATE_ATTACKS.items(), *FILE_ATTACKS.items()]
    for name, attack in attacks:
        marks = [pytest.mark.xfail(strict=True, reason=f"red team: {attack.miss}")] if attack.miss else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", [*TEMPLATE_ATTACKS, *FILE_ATTACKS])
def test_attack_is_real(bases: dict[str, Path], tmp_path: Path, name: str) -> None:
    d = _built(bases, tmp_path, name)
    if name in FILE_ATTACKS:
        FILE_ATTACKS[name].verify(d)
        return
    attack = TEMPLATE_ATTACKS[name]
    assert PAYLOAD in _render(d, attack.trigger, attack.trigger_kw, attack.day)
    if attack.clean is not None:
        assert PAYLOAD not in _render(d, attack.clean, attack.clean_kw)


@pytest.mark.parametrize("name", _params())
def test_attack_is_caught(bases: dict[str, Path], tmp_path: Path, name: str) -> None:
    d = _built(bases, tmp_path, name)
    result = scan_directory(str(d), default_policy())
    assert not result.errors, result.errors
    assert result.findings, f"{name}: scanned clean"


# The template attacks with a neutral sentence in place of the payload: the steering-text rule reads
# the payload's own words, so these show whether the mechanism each attack targets holds by itself.
NOT_NEUTRAL = {"loader defaults without a system message"}  # its harm is the wording of a default prompt
NEUTRAL_ATTACKS = [
    n
    for n, a in TEMPLATE_ATTACKS.items()
    if PAYLOAD in a.template
    and "ACME" not in a.template.replace(PAYLOAD, "")
    and n not in NOT_NEUTRAL
    and not n.startswith(("named tool_use", "chat_template.jinja"))
]
NEUTRAL_MISSES: dict[str, str] = {  # measured 2026-12-03 11:30 UTC: name -> what lets the neutral text through
    "prefix before the caller's own system message": "red team (neutral payload): text rendered before every "
    "conversation, even before the caller's own system message, is judged by its wording only (TS805); an "
    "always-on neutral prefix reads as a vendor header",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=NEUTRAL_MISSES[n])] if n in NEUTRAL_MISSES else [])
        for n in NEUTRAL_ATTACKS
    ],
)
def test_attack_with_a_neutral_payload_is_caught(bases: dict[str, Path], tmp_path: Path, name: str) -> None:
    attack = TEMPLATE_ATTACKS[name]
    d = tmp_path / "tok"
    shutil.copytree(bases["qwen2.5"], d)
    fam._set_template(d, attack.template.replace(PAYLOAD, NEUTRAL))
    assert NEUTRAL in _render(d, attack.trigger, attack.trigger_kw, attack.day)
    if attack.clean is not None:
        assert NEUTRAL not in _render(d, attack.clean, attack.clean_kw)
    result = scan_directory(str(d), default_policy())
    assert not result.errors, result.errors
    assert result.findings, f"{name}: scanned clean"


SAVED_FAMILIES = ("qwen2.5", "gemma", "bert", "t5", "gpt2", "mistral", "phi3", "qwen3", "gemma3", "gpt-oss", "phi4")


def test_families_saved_by_transformers_scan_clean(tmp_path: Path) -> None:
    """False positives: each family as transformers 5 itself writes it (save_pretrained: chat_template.jinja,
    its own tokenizer_config.json) scans without a finding."""
    from transformers import AutoTokenizer

    flagged = {}
    for name in SAVED_FAMILIES:
        src = fam.build_family(name, tmp_path / "src" / name)
        out = tmp_path / "saved" / name
        AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
        found = [f.id for f in scan_directory(str(out), default_policy()).findings]
        if found:
            flagged[name] = found
    assert not flagged, flagged
