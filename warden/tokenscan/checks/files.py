"""Check 2 (code and requirements files anywhere) and the file-name whitelist."""

from __future__ import annotations

import os
import re

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot
from warden.tokenscan.tree import Entry

CODE_EXTENSIONS = frozenset(
    {".py", ".pyc", ".pyo", ".pyd", ".pyw", ".pyx", ".pxd", ".so", ".dylib", ".dll", ".sh", ".bash", ".ipynb"}
)
REQUIREMENTS_RE = re.compile(
    r"^(?:.*requirements.*\.(?:txt|in)|constraints\.txt|pyproject\.toml|setup\.cfg|Pipfile(?:\.lock)?|"
    r"environment\.ya?ml|conda\.ya?ml|poetry\.lock|uv\.lock|pdm\.lock)$",
    re.IGNORECASE,
)
CODE_CONTENT = {"elf": "an ELF executable or shared object", "macho": "a Mach-O binary", "pe": "a Windows PE binary"}


def _file_like(e: Entry) -> bool:
    return e.kind == "file" or (e.kind == "symlink" and e.target_kind != "dir")


def classify_name(name: str, policy: TokenscanPolicy) -> str | None:
    """``code``, ``requirements``, ``unexpected`` or None (allowed) for a file name."""
    ext = os.path.splitext(name)[1].lower()
    if ext in CODE_EXTENSIONS:
        return "code"
    if REQUIREMENTS_RE.match(name):
        return "requirements"
    if name in policy.allowed_file_names or (ext and ext in policy.allowed_extensions):
        return None
    return "unexpected"


def check_files(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for e in snap.entries:
        name = os.path.basename(e.rel)
        if e.kind == "dir" and name == "__pycache__":
            out.append(finding("TS201", e.rel, "a __pycache__ directory (compiled Python)"))
        if not _file_like(e):
            continue
        verdict = classify_name(name, policy)
        if verdict == "code":
            out.append(finding("TS201", e.rel, f"code file {name!r}"))
        elif verdict == "requirements":
            out.append(finding("TS202", e.rel, f"{name!r} asks for packages to be installed"))
        elif verdict == "unexpected":
            out.append(finding("TS203", e.rel, f"{name!r}: extension/name not in the policy's allowed lists"))
        facts = snap.facts.get(e.rel)
        kind = facts.sniff.kind if facts and facts.sniff else None
        if kind in CODE_CONTENT and verdict != "code":
            out.append(finding("TS201", e.rel, f"content is {CODE_CONTENT[kind]}, whatever its name"))
    return out
