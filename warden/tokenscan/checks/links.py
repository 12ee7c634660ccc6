"""Check 6: symlinks and hard links leaving the directory, dangling links, special files."""

from __future__ import annotations

from warden.tokenscan.findings import Finding, finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot
from warden.tokenscan.tree import outside_hard_links


def check_links(snap: Snapshot, policy: TokenscanPolicy) -> list[Finding]:
    out = []
    for e in snap.entries:
        if e.kind == "special":
            out.append(finding("TS605", e.rel, "a FIFO, socket or device node; never opened"))
        if e.kind != "symlink":
            continue
        what = "symlinked directory" if e.target_kind == "dir" else "symlink"
        if not e.inside and not (e.hf_blob and policy.allow_hf_cache_blobs and e.target_kind == "file"):
            blob = " (an HF-cache blob, but allow_hf_cache_blobs is off)" if e.hf_blob else ""
            out.append(
                finding("TS601", e.rel, f"{what} -> {e.target!r} resolves to {e.real}, outside {snap.root_real}{blob}")
            )
        elif e.target_kind == "missing":
            out.append(finding("TS604", e.rel, f"symlink -> {e.target!r} points at nothing"))
        elif e.target_kind == "dir":
            out.append(finding("TS603", e.rel, f"symlinked directory -> {e.target!r} (not followed)"))
        elif e.target_kind == "special":
            out.append(finding("TS605", e.rel, f"symlink -> {e.target!r} leads to a FIFO, socket or device"))
    for e in outside_hard_links(snap.entries):
        out.append(finding("TS602", e.rel, f"{e.nlink} hard links, fewer names inside the directory"))
    return out
