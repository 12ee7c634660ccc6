"""Reading a checkpoint directory back by path, for tests (and an attacker's rewrite of its manifest).

The trainer itself never re-reads what it wrote (trainer/checkpoint.py hashes in memory); these are
the inspections tests make of the result.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from trainer.checkpoint import MANIFEST


def write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)


def file_sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def tree_files(directory: str) -> list[str]:
    out = []
    for base, _dirs, files in os.walk(directory):
        for name in files:
            out.append(os.path.relpath(os.path.join(base, name), directory))
    return sorted(out)


def write_manifest(directory: str) -> dict[str, str]:
    """Rewrites ``directory``'s manifest from its files as they are now (re-read; for tests and repairs)."""
    digests = {rel: file_sha256(os.path.join(directory, rel)) for rel in tree_files(directory) if rel != MANIFEST}
    write_json(os.path.join(directory, MANIFEST), {"algorithm": "sha256", "files": digests})
    return digests


def verify_manifest(directory: str) -> list[str]:
    """Problems found comparing ``directory`` with its manifest; empty when intact."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as fh:
            expected = json.load(fh)["files"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    actual = [rel for rel in tree_files(directory) if rel != MANIFEST]
    problems = [f"{rel}: missing" for rel in sorted(set(expected) - set(actual))]
    problems += [f"{rel}: not in the manifest" for rel in sorted(set(actual) - set(expected))]
    for rel in sorted(set(expected) & set(actual)):
        digest = file_sha256(os.path.join(directory, rel))
        if digest != expected[rel]:
            problems.append(f"{rel}: sha256 {digest} != manifest {expected[rel]}")
    return problems


def contains_pickle(path: str) -> bool:
    """True if the file starts like a pickle (protocol 2+) or a zip (torch.save)."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    return (len(head) >= 2 and head[0] == 0x80 and head[1] <= 5) or head.startswith(b"PK\x03\x04")


def read_tree(directory: str) -> dict[str, bytes]:
    """``{relative name: bytes}`` of every file below ``directory`` (to compare two checkpoints)."""
    out = {}
    for rel in tree_files(directory):
        with open(os.path.join(directory, rel), "rb") as fh:
            out[rel] = fh.read()
    return out
