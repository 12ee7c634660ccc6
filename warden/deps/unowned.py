"""Files nothing vouches for: entries of the environment no RECORD row owns (``unowned``), special
files (never opened) and symbolic links whose target leaves the environment."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

from warden.deps.integrity_common import glob_matcher, relative, special_finding
from warden.deps.model import Finding
from warden.deps.walk import kind_of, link_escapes
from warden.errors import quote_untrusted


def unowned_findings(
    root: str,
    walked: dict[str, os.stat_result],
    owned: set[str],
    derived: dict[str, str],
    allow: Sequence[str],
    exempt: Callable[[str], bool],
) -> list[Finding]:
    """Files and links under ``root`` neither ``owned`` nor a pyc ``derived`` from a walked source,
    nor ``exempt`` (made by venv) nor on ``allow`` (globs relative to ``root``)."""
    out = []
    for path in sorted(p for p in walked if p not in owned and p not in derived):
        if exempt(path) or kind_of(walked[path].st_mode) not in ("file", "symlink"):
            continue  # special files are reported as such, never as unowned
        rel = relative(path, root)
        if glob_matcher(tuple(allow))(rel) is not None:
            continue
        if os.path.basename(os.path.dirname(path)) == "__pycache__" and path.endswith(".pyc"):
            message = f"{path}: bytecode without a source file, owned by no distribution (never imported)"
            out.append(Finding("integrity", "unowned", path, message, False))
            continue
        what = "symbolic link" if stat.S_ISLNK(walked[path].st_mode) else "file"
        message = f"{path}: no installed distribution's RECORD lists this {what}"
        out.append(Finding("integrity", "unowned", path, message))
    return out


def link_and_special_findings(
    walked: dict[str, os.stat_result], roots: Sequence[str], exempt: Callable[[str], bool]
) -> list[Finding]:
    """Special files (never opened) and symbolic links whose target leaves the environment
    (except venv's own ``bin/python*`` links, which interpreter.py checks against the base)."""
    out = []
    for path, st in sorted((p, st) for p, st in walked.items() if not stat.S_ISREG(st.st_mode)):
        kind = kind_of(st.st_mode)
        if kind == "symlink":
            if exempt(path):
                continue
            escaped = link_escapes(path, roots)
            if escaped is not None:
                message = f"{path}: symbolic link to {quote_untrusted(escaped)}, outside the audited environment"
                out.append(Finding("integrity", "link_outside", path, message, True, {"target": escaped}))
        elif kind != "file":
            out.append(special_finding(path, kind))
    return out
