"""What the sandbox children say about a snapshot: chat templates rendered with the battery of
conversations, tokenizers loaded and run on the built-in corpus; and the judgements of both.

Answers and judgements are cached by content in :class:`~.resources.ScanResources` (a crashed
sandbox, or a file that changed under the child, is reported now and not remembered: the next
scan retries). Tokenizer requests are futures sent through the resources' pool, so the child
works while this process parses and renders (:func:`start_exercises`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from warden.tokenscan import chat_template as ct
from warden.tokenscan import conversations as conv
from warden.tokenscan import template_battery as tb
from warden.tokenscan import tokenizer_behaviour as tbe
from warden.tokenscan.declared import (
    SPECIAL_NAMES,
    as_dict,
    as_list,
    config_tokens,
    declared_tokens,
    loader_special_tokens,
    specials,
    token,
)
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.resources import ScanResources
from warden.tokenscan.snapshot import JsonDoc, Snapshot, TemplateSource

SEND_WAIT_SECONDS = 0.2  # bounded: a saturated pool only delays the overlap


# -- chat templates --------------------------------------------------------------------------
def _json_templates(doc: JsonDoc) -> list[tuple[str, str | None, Any]]:
    if not isinstance(doc.data, dict) or "chat_template" not in doc.data:
        return []
    value = doc.data["chat_template"]
    if isinstance(value, list):
        return [
            (doc.rel, f"chat_template[{_name(v, i)}]", v.get("template") if isinstance(v, dict) else v)
            for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        return [(doc.rel, f"chat_template[{k}]", v) for k, v in value.items()]
    return [(doc.rel, "chat_template", value)]


def _name(item: Any, index: int) -> str:
    return str(item.get("name", index)) if isinstance(item, dict) else str(index)


def collect_templates(snap: Snapshot, jinja: list[tuple[str, str | None, str]], policy: TokenscanPolicy) -> None:
    """Fills ``snap.templates``: the ``jinja`` texts the reader found and every config's
    ``chat_template``, each pinned, over its cap, or statically analysed."""
    cp = policy.chat_template
    cap = policy.cap_for("x.jinja")
    sources: list[tuple[str, str | None, Any]] = list(jinja)
    for doc in snap.configs():
        sources += _json_templates(doc)
    for rel, key, text in sources:
        if not isinstance(text, str):
            issue = ct.TemplateIssue("syntax", f"chat template is a {type(text).__name__}, not a string")
            snap.templates.append(TemplateSource(rel, key, "", "", issues=(issue,)))
            continue
        digest = ct.template_digest(text)
        if digest in cp.approved_sha256:
            snap.templates.append(TemplateSource(rel, key, text, digest, pinned=True))
        elif cap is not None and len(text.encode("utf-8", "replace")) > cap:
            issue = ct.TemplateIssue("size", f"{len(text)} characters, over the .jinja cap of {cap} bytes")
            snap.templates.append(TemplateSource(rel, key, "", digest, issues=(issue,)))
        else:
            issues = ct.analyze(text, cp.max_loop_depth, cp.max_range, cp.max_literal_chars)
            snap.templates.append(TemplateSource(rel, key, text, digest, issues=tuple(issues)))


def _not_crashed(answer: dict[str, Any]) -> bool:
    return answer.get("status") != "crashed"


def _lasting(answer: dict[str, Any]) -> bool:
    """Whether a tokenizer child's answer is about the content it was asked about, for good: not a
    crash, nor a file that was not the content of the digest any more when the child read it."""
    return answer.get("status") not in ("crashed", "changed")


def markup_tokens(snap: Snapshot) -> tuple[str, ...]:
    """The declared special tokens and every added token of ``tokenizer.json``: each is one id
    to the model (role markers such as DeepSeek's ``<｜User｜>``), never text a template adds."""
    added = [t for t in (token(a) for a in as_list((snap.top("tokenizer.json") or {}).get("added_tokens"))) if t]
    return tuple(dict.fromkeys((*specials(snap), *added)))


def loader_context(snap: Snapshot) -> dict[str, Any]:
    """The variables the loader renders a template with, as transformers 5 passes them (its
    ``special_tokens_map`` and ``apply_chat_template``'s own keywords), so a template cannot tell
    the scanner from the loader by what is defined: the named special tokens the configs set
    (``mask_token`` too, and each name ``extra_special_tokens`` gives as a mapping, such as
    ``image_token``; an unset one stays undefined, and the unnamed extra tokens are not passed;
    a default the tokenizer class itself sets, such as Qwen2's ``unk_token``, is not known here),
    ``add_generation_prompt`` (True: an inference render), ``continue_final_message`` and
    ``return_assistant_tokens_mask`` (False), ``tools`` and ``documents``."""
    config, smap = snap.top("tokenizer_config.json") or {}, snap.top("special_tokens_map.json") or {}
    resolved = loader_special_tokens(config, smap)  # the one resolution; only named tokens are passed
    named = {n: t for n, t in resolved.items() if "[" not in n and "(" not in n and n not in SPECIAL_NAMES}
    context: dict[str, Any] = {f"{n}_token": t for n, t in named.items()}
    context |= {f"{k}_token": v for k, v in snap.special_tokens.items() if v}
    return context | {"add_generation_prompt": True, "continue_final_message": False,
                      "return_assistant_tokens_mask": False, "tools": None, "documents": None}  # fmt: skip


def _generated(
    t: TemplateSource,
    snap: Snapshot,
    policy: TokenscanPolicy,
    limits: ct.RenderLimits,
    res: ScanResources,
    battery: dict[str, Any],
) -> tuple[dict[str, Any], tuple[tb.BehaviourIssue, ...]] | None:
    """The generated conversations (:mod:`.conversations`) rendered and judged, or None when the
    sandbox gave no complete answer in time (the template is then *unanalysed*, never clean)."""
    cp = policy.chat_template
    if cp.generated_conversations <= 0:
        return {"status": "ok", "renders": []}, ()
    context = loader_context(snap)
    renders = conv.generate(cp.conversation_seed, cp.generated_conversations, context, t.text)
    # the sandbox's wait is cut to what is left of the scan; a result under a cut limit has its own key,
    # so a timeout it caused is never reused by a scan with the whole limit
    limits = _within(limits, snap.deadline)
    what = ["generated", t.digest, cp.conversation_seed, cp.generated_conversations, context, limits.__dict__]
    rkey = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    answer = res.memo.get_or_make(
        ("render", rkey), lambda: ct.run_battery(t.text, renders, limits), keep=_not_crashed,
        nbytes=lambda a: len(json.dumps(a)),
    )  # fmt: skip
    if answer.get("status") in ("timeout", "crashed"):
        return None
    drawn: list[dict[str, Any]] = []  # the renders of the rounds before the last
    last, demands, left = renders, answer.get("demands"), 0
    for prefix in DEMAND_ROUNDS:  # the inputs the template was seen to test in the round before

        def drawn_next(d: Any = demands, la: list[Any] = last, dr: list[Any] = drawn, p: str = prefix) -> Any:
            return conv.demanded(cp.conversation_seed, cp.generated_conversations, context, d, la, dr, p)

        # the same rounds for every copy of the template (rkey names the renders and answers before)
        more, past = res.memo.get_or_make(
            ("demanded", rkey + prefix), drawn_next, nbytes=lambda m: len(json.dumps(m[0]))
        )
        left += past
        if not more or answer.get("status") != "ok":
            break
        if time.monotonic() > snap.deadline:
            return None
        limits = _within(limits, snap.deadline)
        round_key = hashlib.sha256(json.dumps(["demanded", rkey, more, limits.__dict__], sort_keys=True).encode())

        def rendered(m: list[dict[str, Any]] = more, lim: ct.RenderLimits = limits) -> dict[str, Any]:
            return ct.run_battery(t.text, m, lim)

        again = res.memo.get_or_make(
            ("render", round_key.hexdigest()), rendered, keep=_not_crashed, nbytes=lambda a: len(json.dumps(a))
        )
        if again.get("status") in ("timeout", "crashed"):
            return None
        drawn, last, demands = [*drawn, *last], more, again.get("demands")
        renders, answer = [*renders, *more], _merged(answer, again)
        rkey = hashlib.sha256((rkey + round_key.hexdigest()).encode()).hexdigest()
    if left:
        why = f"{left} input test(s) the template makes were past what the scan draws (not rendered)"
        snap.unanalysed.append((t.rel, f"{_where(t)}: {why}"))
    tokens = markup_tokens(snap)

    def judged() -> tuple[tb.BehaviourIssue, ...]:
        issues: list[tb.BehaviourIssue] = []
        guards = ct.guard_lines(t.text)
        issues += [tb.BehaviourIssue(i.kind, i.detail) for i in conv.judge(renders, answer)]
        issues += tb.taint_issues(list(answer.get("taint") or []), tokens, guards)
        issues += [tb.BehaviourIssue("private", f"the template looked up the private attribute {str(a)!r}")
                   for a in answer.get("private") or []]  # fmt: skip
        marks = (*tokens, *tb.template_markup(t.text))
        vocab = conv.vocabulary([str(r.get("output", "")) for r in battery.get("renders") or []])
        for request, result in zip(renders, answer.get("renders") or [], strict=False):
            if result.get("status") != "ok" or not request["name"].endswith("a"):
                continue
            added = conv.abstract(str(result.get("output", "")), request["texts"]).replace("\x00", " ")
            name = f"generated {request['name']}"
            issues += tb.text_issues(name, added, [], tokens)
            issues += tb.lookalike_issues(f"the {name!r} render", added, marks)
            novel = conv.novel_text(ct.residual_text(added, tokens), vocab, cp.max_literal_chars)
            if novel:
                detail = f"text appears only for the shape {request['shape']}: {novel!r}"
                issues.append(tb.BehaviourIssue("varies", detail))
        issues += tb.lookalike_issues("the template text", t.text, marks)
        seen: set[tb.BehaviourIssue] = set()
        return tuple(i for i in issues if not (i in seen or seen.add(i)))  # type: ignore[func-returns-value]

    key = t.digest + json.dumps(["generated", rkey, tokens], sort_keys=True)
    examples = conv.rendered_examples(renders, answer)
    return {**answer, "examples": examples}, res.judged.get_or_make(("generated", key), judged)


def _not_judged(t: TemplateSource, snap: Snapshot, exc: Exception) -> None:
    """A failure of the scanner's own draw or judge on what a template made it draw (a value of an
    unexpected kind): that template is not analysed (TS910), never a traceback and never clean."""
    why = f"the generated conversations could not be judged ({type(exc).__name__}: {str(exc)[:80]})"
    snap.unanalysed.append((t.rel, f"{_where(t)}: {why}"))
    snap.transient.append(f"{t.rel}: {why}")


DEMAND_ROUNDS = (
    "d",
    "e",
)  # rounds after the first (their render names' prefix): a field round two adds is tested in three


def _merged(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One battery answer for the renders of two (the second's status where it is worse than ok)."""
    status = second.get("status") if second.get("status") in ("security", "memory", "too_large") else first["status"]
    message = second.get("message", "") if status != first["status"] else first.get("message", "")
    known = first.get("taint") or []
    taint = [*known, *(r for r in second.get("taint") or [] if r not in known)]
    private = list(dict.fromkeys([*(first.get("private") or []), *(second.get("private") or [])]))
    reached = sorted({*(first.get("reached") or []), *(second.get("reached") or [])})
    return {**first, "status": status, "message": message, "taint": taint, "private": private, "reached": reached,
            "renders": [*(first.get("renders") or []), *(second.get("renders") or [])]}  # fmt: skip


def _within(limits: ct.RenderLimits, deadline: float) -> ct.RenderLimits:
    """``limits`` with the sandbox's wait (4 x the render timeout) cut to what is left of the scan."""
    left = max(0.05, (deadline - time.monotonic()) / 4)
    return replace(limits, timeout_seconds=min(limits.timeout_seconds, left))


def render(snap: Snapshot, policy: TokenscanPolicy, res: ScanResources) -> None:
    """Renders templates that parsed and show no introspection with the battery of
    conversations and the generated ones, in the sandbox child, and judges the renders."""
    cp = policy.chat_template
    limits = ct.RenderLimits(cp.render_timeout_seconds, cp.output_cap, cp.memory_cap)
    context = loader_context(snap)
    renders = tb.battery_renders(context)
    tokens = markup_tokens(snap)
    for i, t in enumerate(snap.templates):
        if t.text and time.monotonic() > snap.deadline:
            snap.unanalysed.append((t.rel, f"template {t.key or ''} not rendered: scan time budget spent".strip()))
            continue
        if not t.text or t.pinned or any(x.kind in ("syntax", "introspection", "complexity") for x in t.issues):
            continue
        try:
            rkey = hashlib.sha256(json.dumps([t.digest, context, limits.__dict__], sort_keys=True).encode()).hexdigest()
            battery = lambda text=t.text: ct.run_battery(text, renders, limits)  # noqa: E731
            answer = res.memo.get_or_make(
                ("render", rkey), battery, keep=_not_crashed, nbytes=lambda a: len(json.dumps(a))
            )
        except OSError as exc:
            snap.errors.append(f"chat template sandbox could not start: {exc.strerror or exc}")
            return
        if not _not_crashed(answer):
            snap.transient.append(f"{t.rel}: template sandbox crashed")
        result = ct.RenderResult(str(answer["status"]), "", str(answer.get("message", "")))
        key = t.digest + json.dumps([tokens, cp.max_literal_chars, context], sort_keys=True)
        guards = ct.guard_lines(t.text)
        judged = lambda a=answer, g=guards: tuple(tb.judge(renders, a, tokens, cp.max_literal_chars, g))  # noqa: E731
        issues = res.judged.get_or_make(("battery", key), judged) if answer["status"] == "ok" else ()
        review = tb.default_system_prompt(renders, answer, tokens) if answer["status"] == "ok" else ""
        shown_generated: list[tuple[str, str]] = []
        if answer["status"] == "ok" and time.monotonic() <= snap.deadline:
            try:
                generated, failed = _generated(t, snap, policy, limits, res, answer), False
            except OSError:
                raise
            except Exception as exc:  # any failure of the scanner's own here: not analysed, never a traceback
                generated, failed = None, True
                _not_judged(t, snap, exc)
            if generated is None and not failed:
                snap.unanalysed.append((t.rel, f"{_where(t)}: generated conversations not rendered in time"))
            elif generated is not None:
                g_answer, g_issues = generated
                g_issues = (*g_issues, *tb.unexercised_issues([answer, g_answer]))
                issues = (*issues, *(x for x in g_issues if x not in issues))
                shown_generated = [(e["shape"], e["render"]) for e in g_answer.get("examples") or []]
                if g_answer.get("status") not in ("ok", "error", "syntax"):
                    result = ct.RenderResult(str(g_answer["status"]), "", str(g_answer.get("message", "")))
        elif answer["status"] == "ok":
            why = "generated conversations not rendered: scan time budget spent"
            snap.unanalysed.append((t.rel, f"{_where(t)}: {why}"))
        shown = _review_renders(renders, answer) + tuple(shown_generated)
        snap.templates[i] = replace(t, render=result, behaviour=tuple(issues), default_system=review, renders=shown)


REVIEW_RENDERS = ("u", "suau", "toolconv", "docs")
REVIEW_CHARS = 4000


def _review_renders(renders: list[dict[str, Any]], answer: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A few battery renders for the review report (probe contents kept: they show where each
    message goes)."""
    out = []
    for request, result in zip(renders, answer.get("renders") or [], strict=False):
        if request["name"] in REVIEW_RENDERS and result.get("status") == "ok":
            out.append((f"battery {request['name']}", str(result.get("output", ""))[:REVIEW_CHARS]))
    return tuple(out)


def _where(t: TemplateSource) -> str:
    return f"template {t.key}" if t.key else "template"


# -- tokenizers ------------------------------------------------------------------------------
def _exercise_key(kind: str, digest: str, snap: Snapshot) -> str:
    """The behaviour cache's key of the child's answer: the content and what the child is told."""
    what = [kind, config_tokens(snap), _loader_added(snap, kind)]
    return hashlib.sha256((digest + json.dumps(what, sort_keys=True)).encode()).hexdigest()


def _loader_added(snap: Snapshot, kind: str) -> list[Any]:
    """The tokens the loader adds from the config to a tokenizer.json (none to a sentencepiece model)."""
    return tbe.loader_added_tokens(snap.top("tokenizer_config.json") or {}) if kind == "tokenizer" else []


def exercise(
    kind: str,
    path: str,
    digest: str,
    size: int,
    snap: Snapshot,
    policy: TokenscanPolicy,
    res: ScanResources,
) -> Future[dict[str, Any]]:
    """The tokenizer child's answer for the file at ``path``, as a future shared by every scan
    of the same content (``digest``), declared tokens and config-added tokens (:func:`_exercise_key`);
    the child re-checks the digest."""
    bp = policy.behaviour

    def send() -> Future[dict[str, Any]]:
        sent = threading.Event()
        req = tbe.request(kind, path, digest, size, config_tokens(snap), _loader_added(snap, kind))
        future = res.tokenizer_pool().submit(tbe.run, req, bp.memory_cap, bp.timeout_seconds, sent.set)
        # the caller goes on to json.loads, which holds the GIL for its whole parse: let the
        # pool thread write the request first, so the child loads while this process parses
        sent.wait(SEND_WAIT_SECONDS)
        return future

    return res.behaviour.get_or_make((kind, _exercise_key(kind, digest, snap)), send)  # type: ignore[no-any-return]


def start_exercises(snap: Snapshot, policy: TokenscanPolicy, res: ScanResources) -> dict[str, Future[dict[str, Any]]]:
    """Sends every tokenizer to its child now, so the child works while this process analyses
    and renders the templates; :func:`tokenizer_behaviour` collects the answers."""
    if not policy.behaviour.enabled or time.monotonic() > snap.deadline:
        return {}
    return {
        rel: exercise(kind, path, digest, size, snap, policy, res)
        for rel, (kind, path, digest, size) in sorted(snap.tokenizer_files.items())
    }


def tokenizer_behaviour(
    snap: Snapshot, policy: TokenscanPolicy, running: dict[str, Future[dict[str, Any]]], res: ScanResources
) -> None:
    """Static invariants of tokenizer.json and the behaviour of every tokenizer found
    (``running``: the child requests :func:`start_exercises` sent)."""
    tokens = declared_tokens(snap)
    declared = {k: v for k, v in tokens.items() if v}
    tok = snap.top("tokenizer.json")
    added = [t for t in (token(a) for a in as_list((tok or {}).get("added_tokens"))) if t]
    out = snap.tokenizer_issues
    if tok is not None:
        out += [("tokenizer.json", i) for i in tbe.special_token_problems(declared, added)]
        out += [("tokenizer.json", i) for i in tbe.ordinary_special_tokens(declared, added)]
        model = as_dict(tok.get("model"))
        vocab = model.get("vocab")
        size = len(vocab) if isinstance(vocab, (dict, list)) else 1 << 62  # no vocabulary to be past
        out += [("tokenizer.json", i) for i in tbe.added_words(tok, size)]
        extra = [
            {"content": c, "special": sp, "id": size}
            for c, sp, _f in _loader_added(snap, "tokenizer")
            if c not in added
        ]
        out += [
            ("tokenizer_config.json", i) for i in tbe.added_words({"added_tokens": extra}, size)
        ]  # the loader adds them
        digest = snap.digests.get("tokenizer.json", "")
        order = res.judged.get_or_make(
            ("order", digest), lambda: tbe.merge_order_problem(model) or tbe.score_order_problem(model)
        )
        out += [("tokenizer.json", i) for i in tbe.rewrite_rules(tok)]
        problem = order if policy.behaviour.bpe_ids_follow_merges else None
        if problem:
            out.append(("tokenizer.json", tbe.TokenizerIssue("order", problem)))
        out += [("tokenizer.json", tbe.TokenizerIssue("order", d)) for d in _vocab_disagreements(snap, model, res)]
    if not policy.behaviour.enabled:
        return
    for rel, (kind, _path, digest, _size) in sorted(snap.tokenizer_files.items()):
        if rel not in running:
            snap.unanalysed.append((rel, "tokenizer not exercised: scan time budget spent"))
            continue
        try:
            answer = running[rel].result()
        except OSError as exc:
            res.behaviour.pop((kind, _exercise_key(kind, digest, snap)))
            snap.errors.append(f"tokenizer sandbox could not start: {exc.strerror or exc}")
            return
        if not _lasting(answer):  # reported now, retried by the next scan
            res.behaviour.pop((kind, _exercise_key(kind, digest, snap)))
            snap.transient.append(f"{rel}: tokenizer sandbox {answer.get('status')}")
        if snap.token_ids_digest is None or rel == "tokenizer.json":
            snap.token_ids_digest = tbe.ids_digest(answer)
        key = digest + json.dumps([kind, rel, tokens], sort_keys=True)
        judged = lambda a=answer, r=rel: tuple(tbe.judge(a, tokens, r))  # noqa: E731
        lasting = lambda _v, a=answer: _lasting(a)  # noqa: E731
        out += [(rel, i) for i in res.judged.get_or_make(("judge", key), judged, keep=lasting)]


def _vocab_disagreements(snap: Snapshot, model: dict[str, Any], res: ScanResources) -> list[str]:
    """tokenizer.json's vocabulary against the slow tokenizer's vocab.json / vocab.txt beside it
    (cached by the digests of the two files)."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return []
    others: dict[str, Any] = {}
    if (doc := snap.top("vocab.json")) is not None:
        others["vocab.json"] = lambda d=doc: d
    if "vocab.txt" in snap.vocab_lines:
        others["vocab.txt"] = lambda lines=snap.vocab_lines["vocab.txt"]: tbe.vocab_txt_ids(lines)
    out = []
    for label, mapping in others.items():
        key = snap.digests.get("tokenizer.json", "") + label + snap.digests.get(label, "")
        compare = lambda m=mapping, n=label: tbe.vocab_disagreement(vocab, m(), n)  # noqa: E731
        found = res.judged.get_or_make(("vocabs", key), compare)
        if found:
            out.append(found)
    return out
