"""Check 9: what files contain, whatever their names: pickles (analysed, never loaded),
archives, NPY object arrays, sentencepiece validity, JSON validity and size caps."""

from __future__ import annotations

import os

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.pickle_scan import classify
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import FileFacts, Snapshot
from warden.tokenscan.sniff import PickleHit

TEXT_EXTENSIONS = frozenset({".json", ".txt", ".jinja", ".md", ".vocab", ".tiktoken", ".model"})
FOREIGN_KINDS = frozenset({"pickle", "zip", "npy", "elf", "macho", "pe", "gguf"})


def _in(hit: PickleHit) -> str:
    return f" (in {hit.where})" if hit.where else ""


def pickle_findings(rel: str, hits: tuple[PickleHit, ...], safe: tuple[str, ...]) -> list[Finding]:
    """TS901 for dangerous or hidden imports, TS902 for imports outside the safe list, else TS903."""
    dangerous, unknown, hidden = [], [], []
    for hit in hits:
        verdicts = [(name, classify(name, safe)) for name in hit.report.imports]
        dangerous += [n + _in(hit) for n, v in verdicts if v == "dangerous"]
        unknown += [n + _in(hit) for n, v in verdicts if v == "unknown"]
        if hit.report.unresolved or hit.report.extensions:
            hidden.append(f"{hit.report.unresolved + hit.report.extensions} untraceable import(s){_in(hit)}")
    out = []
    if dangerous or hidden:
        out.append(finding("TS901", rel, "pickle imports " + ", ".join(sorted(set(dangerous)) + hidden)))
    if unknown:
        out.append(finding("TS902", rel, "pickle imports outside the safe list: " + ", ".join(sorted(set(unknown)))))
    incomplete = sorted({f"{h.report.incomplete}{_in(h)}" for h in hits if h.report.incomplete})
    if incomplete:
        out.append(finding("TS910", rel, "pickle analysis incomplete: " + "; ".join(incomplete)))
    if not out:
        where = ", ".join(sorted({h.where for h in hits if h.where})) or "the file"
        out.append(finding("TS903", rel, f"pickle data in {where} (only safe-listed imports)"))
    return out


def _facts_findings(f: FileFacts, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    ext = os.path.splitext(f.rel)[1].lower()
    if f.over_cap is not None:
        out.append(finding("TS908", f.rel, f"{f.size} bytes, over the {ext or 'file'} cap of {f.over_cap} bytes"))
    if f.spm_error:
        out.append(finding("TS906", f.rel, f"not a sentencepiece model: {f.spm_error}"))
    s = f.sniff
    problems = f.problems + (s.problems if s else ())
    if problems:
        out.append(finding("TS910", f.rel, "; ".join(problems)))
    if s is None:
        return out
    if s.pickles:
        out += pickle_findings(f.rel, s.pickles, policy.safe_pickle_globals)
    if s.kind == "npy" and s.error:
        out.append(finding("TS910", f.rel, s.error))
    if s.kind == "zip":
        torch = any(h.where.endswith("data.pkl") for h in s.pickles)
        detail = s.error or s.detail
        out.append(finding("TS904", f.rel, f"zip archive{' in torch.save format' if torch else ''} ({detail})"))
    if s.npy_object:
        names = ", ".join(n or "the file" for n in s.npy_object)
        out.append(finding("TS905", f.rel, f"NumPy object array in {names}"))
    textual = ext in TEXT_EXTENSIONS or (not ext and s.kind in FOREIGN_KINDS)
    if (s.kind in FOREIGN_KINDS and textual) or (ext == ".safetensors" and s.kind != "safetensors"):
        out.append(finding("TS909", f.rel, f"named {ext or 'without an extension'} but the content is {s.kind}"))
    if s.also and s.kind not in s.also:
        out.append(finding("TS909", f.rel, f"the content is {s.kind} and also {', '.join(s.also)} (a polyglot)"))
    return out


def check_content(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for rel in sorted(snap.facts):
        out += _facts_findings(snap.facts[rel], policy)
    for rel in sorted(snap.json):
        doc = snap.json[rel]
        if doc.error:
            out.append(finding("TS907", rel, f"not valid JSON: {doc.error}"))
    out += [finding("TS910", rel, why) for rel, why in snap.unanalysed]
    return out
