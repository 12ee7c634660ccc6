"""Units of the scanner: pickle analysis, the protobuf walker, chat-template analysis and
sandbox, links, policies, manifests, and the pure checks on hand-built snapshots."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import shutil
import struct
import time
import zipfile

import pytest

from warden.policy import PolicyError, policy_from_mapping
from warden.tokenscan import chat_template as ct
from warden.tokenscan import scan_directory
from warden.tokenscan.checks import CHECKS
from warden.tokenscan.checks.automap import check_auto_map
from warden.tokenscan.checks.pathkeys import path_problem
from warden.tokenscan.findings import RULES, Severity, dedupe, finding
from warden.tokenscan.manifest import ApprovalStore, drift_finding
from warden.tokenscan.pickle_scan import classify, is_confirmed_pickle, scan_pickle_bytes
from warden.tokenscan.policy import BehaviourPolicy, TokenscanPolicy, default_policy, parse_size
from warden.tokenscan.scanner import directory_manifest, run_checks
from warden.tokenscan.snapshot import JsonDoc, Snapshot
from warden.tokenscan.sniff import descr_has_object, magic_kind, sniff_file
from warden.tokenscan.spm import LEN, VARINT, ProtobufError, encode_field, parse_sentencepiece


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def ids(result):
    return {f.id for f in result.findings}


# -- pickles ---------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", range(6))
def test_every_pickle_protocol_reveals_os_system(protocol):
    data = pickle.dumps([_Reduce(os.system, ("id",)), {"a": 1}], protocol=protocol)
    reports = scan_pickle_bytes(data)
    assert "posix.system" in reports[0].imports or "os.system" in reports[0].imports
    assert is_confirmed_pickle(reports[0], data[:4])
    assert classify("posix.system", ()) == "dangerous"


def test_stack_global_through_memo_and_hidden_operands():
    # SHORT_BINUNICODE module, MEMOIZE, SHORT_BINUNICODE name, MEMOIZE, BINGET 0, BINGET 1, STACK_GLOBAL
    traced = b"\x80\x04\x8c\x08builtins\x94\x8c\x04exec\x94h\x00h\x01\x93)R."
    assert scan_pickle_bytes(traced)[0].imports == ("builtins.exec",)
    hidden = b"\x80\x04K\x01K\x02\x93)R."  # operands are integers: not traceable
    assert scan_pickle_bytes(hidden)[0].unresolved == 1


def test_safe_pickles_are_only_a_medium_finding(tmp_path):
    pytest.importorskip("numpy")
    import numpy as np

    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "arr.pkl").write_bytes(pickle.dumps(np.arange(3), protocol=2))
    no_tokens = dataclasses.replace(default_policy().special_tokens, required=())
    result = scan_directory(
        str(tmp_path), default_policy(allowed_extensions=(".json", ".pkl"), special_tokens=no_tokens)
    )
    assert ids(result) == {"TS903"}
    assert result.outcome(Severity.HIGH) == 0 and result.outcome(Severity.MEDIUM) == 1


def test_text_that_starts_like_an_opcode_is_not_a_pickle(tmp_path):
    for i, text in enumerate((b"import os\nos.system('x')\n", b"cat\ndog\nfish\n", b"This is a README\n")):
        path = tmp_path / f"f{i}.txt"
        path.write_bytes(text)
        assert sniff_file(str(path), len(text), 1 << 20).kind == "text"


def test_magic_kinds_and_npy_descr():
    assert magic_kind(b"PK\x03\x04rest") == "zip"
    assert magic_kind(b"\x93NUMPY\x01\x00") == "npy"
    assert magic_kind(b"\x80\x05\x95") == "pickle"
    assert magic_kind(b"\x7fELF\x02") == "elf"
    assert magic_kind(b"GGUF\x03\x00") == "gguf"
    assert magic_kind(b"") == "empty"
    assert descr_has_object("|O") and descr_has_object([("a", "<f4"), ("b", "|O")]) and not descr_has_object("<f4")


def test_npz_with_object_member_is_flagged(tmp_path):
    np = pytest.importorskip("numpy")
    buf = io.BytesIO()
    np.save(buf, np.array([_Reduce(os.system, ("id",))], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as zf:
        zf.writestr("emb.npy", buf.getvalue())
    sniff = sniff_file(str(tmp_path / "x.npz"), os.path.getsize(tmp_path / "x.npz"), 1 << 20)
    assert sniff.kind == "zip" and sniff.npy_object == ("emb.npy",)
    assert any("posix.system" in h.report.imports for h in sniff.pickles)


# -- sentencepiece -----------------------------------------------------------------------
def _piece(text: str, score: float = 0.0, kind: int = 1) -> bytes:
    body = encode_field(1, LEN, text.encode()) + encode_field(2, 5, struct.pack("<f", score))
    return encode_field(1, LEN, body + encode_field(3, VARINT, kind))


def spm_model(pieces=("<unk>", "<s>", "</s>", "▁the")) -> bytes:
    trainer = encode_field(3, VARINT, 1)  # model_type UNIGRAM
    return b"".join(_piece(p) for p in pieces) + encode_field(2, LEN, trainer) + encode_field(3, LEN, b"")


def test_sentencepiece_walker_accepts_a_model_and_lists_pieces():
    assert parse_sentencepiece(spm_model()).pieces == ("<unk>", "<s>", "</s>", "▁the")


@pytest.mark.parametrize(
    "data",
    [b"", spm_model()[:-3] + b"\x0a\xff", b"\x80\x04\x95", b"PK\x03\x04", encode_field(7, LEN, b"x"), _piece("a")[:-1]],
)
def test_sentencepiece_walker_rejects_non_models(data):
    with pytest.raises(ProtobufError):
        parse_sentencepiece(data)


def test_sentencepiece_pieces_feed_the_special_token_check(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(spm_model())
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "tokenizer_class": "LlamaTokenizer"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    # behaviour off: this hand-built protobuf has no normalizer spec, so sentencepiece refuses it (TS1201)
    policy = default_policy(behaviour=BehaviourPolicy(enabled=False))
    result = scan_directory(str(tmp_path), policy)
    assert [(f.id, f.key) for f in result.findings] == [("TS1002", "pad_token")]


# -- chat templates ----------------------------------------------------------------------
LLAMA_LIKE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
    "{% if message.content is string %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{% generation %}{{ '<|start_header_id|>assistant<|end_header_id|>' }}"
    "{% endgeneration %}{% endif %}"
)


def test_benign_templates_have_no_static_issues():
    assert ct.analyze(LLAMA_LIKE) == []


def test_content_branch_is_found_through_an_alias():
    text = "{% for m in messages %}{% set c = m.content %}{% if c.startswith('xyzzy') %}!{% endif %}{% endfor %}"
    assert [i.kind for i in ct.analyze(text)] == ["content_branch"]


def test_sandbox_refusal_and_output_cap_are_findings():
    limits = ct.RenderLimits(2.0, 4096, 1 << 30)
    pop, big = ct.render_templates(["{{ messages.pop() }}", "{{ 'x' * 5000 }}"], {}, limits)
    assert pop.status == "security" and big.status == "too_large"


def test_render_results_are_cached_by_digest():
    limits = ct.RenderLimits(2.0, 4096, 1 << 30)
    text = LLAMA_LIKE + f"{{# cache probe {time.time()} #}}"
    first = ct.render_templates([text], {"bos_token": "<s>"}, limits)[0]
    start = time.perf_counter()
    again = ct.render_templates([text], {"bos_token": "<s>"}, limits)[0]
    assert again == first and first.status == "ok" and time.perf_counter() - start < 0.01
    assert ct.residual_text(first.output, ["<s>"]) == ""


def test_pinned_template_passes(tokenscan_corpus, tokenscan_policy):
    path = tokenscan_corpus.case("ssti_template")
    digest = ct.template_digest((path / "chat_template.jinja").read_text())
    pinned = dataclasses.replace(
        tokenscan_policy, chat_template=dataclasses.replace(tokenscan_policy.chat_template, approved_sha256=(digest,))
    )
    assert "TS802" in ids(scan_directory(str(path), tokenscan_policy))
    assert scan_directory(str(path), pinned).findings == []


# -- links -------------------------------------------------------------------------------
def test_hf_cache_blob_links_follow_the_policy(tokenscan_corpus, tmp_path):
    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in os.listdir(tokenscan_corpus.benign):
        blob = repo / "blobs" / f"sha-{name}"
        shutil.copy(tokenscan_corpus.benign / name, blob)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    assert scan_directory(str(snap), default_policy()).findings == []
    strict = scan_directory(str(snap), default_policy(allow_hf_cache_blobs=False))
    assert ids(strict) == {"TS601"} and "allow_hf_cache_blobs is off" in strict.findings[0].message


def test_inner_links_are_fine_and_directory_links_are_low(fresh_benign):
    (fresh_benign / "alias.json").symlink_to("tokenizer_config.json")
    (fresh_benign / "sub").mkdir()
    (fresh_benign / "subdir-link").symlink_to("sub", target_is_directory=True)
    result = scan_directory(str(fresh_benign), default_policy())
    assert [(f.id, f.severity) for f in result.findings] == [("TS603", Severity.LOW)]
    assert result.outcome(Severity.MEDIUM) == 0


# -- policies ----------------------------------------------------------------------------
def test_policy_errors_name_the_key():
    with pytest.raises(PolicyError, match=r"max_bytes\.\.json: expected bytes"):
        policy_from_mapping({"version": 1, "max_bytes": {".json": "lots"}}, TokenscanPolicy)
    with pytest.raises(PolicyError, match="approved_sha256"):
        policy_from_mapping({"version": 1, "chat_template": {"approved_sha256": ["abc"]}}, TokenscanPolicy)
    with pytest.raises(PolicyError, match="unknown key"):
        policy_from_mapping({"version": 1, "allowed_classes": []}, TokenscanPolicy)
    assert parse_size("64MiB", "k") == 64 << 20 and parse_size(10, "k") == 10


def test_pad_distinct_from_eos_and_fail_on(fresh_benign):
    config = fresh_benign / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "pad_token": "<|eos|>"}))
    base = default_policy()
    strict = dataclasses.replace(
        base, special_tokens=dataclasses.replace(base.special_tokens, pad_distinct_from_eos=True)
    )
    assert scan_directory(str(fresh_benign), base).findings == []
    result = scan_directory(str(fresh_benign), strict)
    assert ids(result) == {"TS1003"} and result.outcome(Severity.HIGH) == 0


# -- manifests, pins, drift ----------------------------------------------------------------
def test_pinned_directory_digest(fresh_benign):
    digest = directory_manifest(str(fresh_benign), default_policy()).digest
    assert (
        scan_directory(str(fresh_benign), default_policy(pinned_directories={str(fresh_benign): digest})).findings == []
    )
    (fresh_benign / "tokenizer.json").write_text((fresh_benign / "tokenizer.json").read_text() + " ")
    result = scan_directory(str(fresh_benign), default_policy(pinned_directories={str(fresh_benign): digest}))
    assert ids(result) == {"TS1102"}


def test_approval_store_and_drift(fresh_benign, tmp_path):
    store = ApprovalStore(str(tmp_path / "state"))
    before = directory_manifest(str(fresh_benign), default_policy())
    store.save(str(fresh_benign), before, "2026-01-01T00:00:00Z")
    record = store.load(str(fresh_benign))
    assert record is not None and record.token_ids_digest is None  # approved without a digest
    approved, when = record.manifest, record.approved_at
    assert approved == before and store.approved() == [str(fresh_benign)]
    (fresh_benign / "chat_template.jinja").write_text("changed")
    (fresh_benign / "new.json").write_text("{}")
    drift = drift_finding(approved, directory_manifest(str(fresh_benign), default_policy()), when)
    assert drift is not None and drift.id == "TS1101"
    assert "changed: chat_template.jinja" in drift.message and "added: new.json" in drift.message


# -- checks are pure ---------------------------------------------------------------------
def test_checks_run_on_a_hand_built_snapshot_without_files():
    snap = Snapshot("/nowhere", "/nowhere", entries=[])
    snap.json["config.json"] = JsonDoc(
        "config.json", {"model_type": "llama", "text_config": {"auto_map": {"A": "m.C"}}}
    )
    found = check_auto_map(snap, default_policy())
    assert [(f.id, f.key) for f in found] == [("TS101", "text_config.auto_map")]
    assert {f.id for f in run_checks(snap, default_policy())} == {"TS101"}
    assert len(CHECKS) == len({name for name, _ in CHECKS}) >= 10


def test_rules_and_findings_helpers():
    assert all(r.fix and r.title for r in RULES.values())
    a = finding("TS805", "t.jinja", "x", severity=Severity.MEDIUM)
    b = finding("TS805", "t.jinja", "y")
    assert dedupe([a, b]) == [b]
    assert path_problem("tokenizer.json") is None and path_problem("a/../b") and path_problem("C:evil")


def test_sandbox_worker_is_another_process_and_recovers_from_a_hang():
    limits = ct.RenderLimits(0.5, 1 << 20, 1 << 30)
    hang = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}" + f"{time.time()}"
    ok = LLAMA_LIKE + f"{{# {time.time()} #}}"
    first = ct.render_templates([ok], {}, limits)[0]
    worker = ct._WORKER.proc
    assert first.status == "ok" and worker is not None and worker.pid != os.getpid()
    assert ct.render_templates([hang], {}, limits)[0].status == "timeout"
    assert ct._WORKER.proc is None  # stopped after the timeout; the next render starts a fresh one
    assert ct.render_templates([ok + " "], {}, limits)[0].status == "ok"
    blowup = ct.render_templates(["{{ 'x' * 4000000000 }}"], {}, ct.RenderLimits(2.0, 1 << 20, 512 << 20))[0]
    assert blowup.status in ("memory", "too_large")


def test_a_fifo_swapped_in_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(OSError, match="not a regular file"):
        sniff_file(str(fifo), 0, 1 << 20)
    assert time.perf_counter() - start < 1.0


def test_json_is_config_by_loader_name_then_by_content() -> None:
    """A tokenizers serialisation under another name (fast_tokenizer_files) is data, like tokenizer.json;
    a name the loader reads as configuration keeps its key checks whatever its content looks like."""
    from warden.tokenscan.snapshot import LOADER_CONFIG_NAMES, JsonDoc

    shaped = {"model": {"type": "BPE", "vocab": {"_private": 0}}, "added_tokens": [], "_hidden": 1}
    assert not JsonDoc("tokenizer.4.57.0.json", shaped).config
    assert not JsonDoc("tokenizer.json", shaped).config
    for name in sorted(LOADER_CONFIG_NAMES):
        assert JsonDoc(f"sub/{name}", shaped).config, name
    assert JsonDoc("extra.json", {"_hidden": 1}).config
    assert JsonDoc("broken.json", None, error="bad").config
