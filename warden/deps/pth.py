"""``.pth`` files at a site-packages root: site.py runs every ``import`` line of each at start-up,
so each must be allowed by the sha256 of its content (a name says nothing about what it runs)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from warden.deps.model import Finding
from warden.deps.walk import kind_of, read_small, sha256_hex


@dataclass(frozen=True)
class PthRule:
    """A ``.pth`` file allowed at start-up, by the sha256 of its content (``name`` documents it;
    a rule without ``sha256`` allows nothing: a name says nothing about what the file runs)."""

    name: str = ""
    sha256: str | None = None


# distutils-precedence.pth as setuptools ships it (65.5.0, ensurepip's bundle, and later).
SETUPTOOLS_PTH = (
    PthRule("distutils-precedence.pth", "2638ce9e2500e572a5e0de7faed6661eb569d1b696fcba07b0dd223da5f5d224"),
)


def pth_findings(root: str, walked: dict[str, os.stat_result], rules: Sequence[PthRule]) -> list[Finding]:
    """Every ``.pth`` at ``root`` (site.py runs them all) must be allowed by its content digest."""
    out = []
    allowed = {r.sha256 for r in rules if r.sha256}
    for path in sorted(p for p in walked if p.endswith(".pth") and os.path.dirname(p) == root):
        kind = kind_of(walked[path].st_mode)
        if kind not in ("file", "symlink"):
            continue  # reported as special_file; never opened
        try:
            content = read_small(path, 1024 * 1024) if kind == "file" else b""
        except OSError:
            content = b""
        digest = hashlib.sha256(content).hexdigest() if kind == "file" else sha256_hex(path)
        if digest in allowed:
            continue
        executes = any(line.startswith((b"import ", b"import\t")) for line in content.splitlines())
        why = "runs code at every interpreter start-up" if executes else "adds paths at start-up"
        if kind == "symlink":
            why = "a symbolic link site.py would follow"
        message = f"{path}: .pth file whose content is not on integrity.pth_allow ({why}); sha256 {digest}"
        out.append(Finding("integrity", "pth_not_allowed", path, message, True, {"sha256": digest}))
    return out
