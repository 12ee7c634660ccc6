"""Checkpoints without pickle, written atomically (docs/design.md section 3).

``<root>/.tmp-step-000000050/`` is written and fsynced, then renamed to
``step-000000050/``: a name without ``.tmp-`` is always complete. Tensors go to
safetensors, everything else to JSON. ``manifest.sha256.json`` (written last, before the
rename) lists the SHA-256 of every other file, so a resume can check the checkpoint's
integrity even where no trusted keys are configured (against accidents only: whoever
can write a file can rewrite the manifest). Reading a checkpoint back is
:mod:`trainer.verified_load`'s job: it verifies and deserializes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import save_file

from warden.errors import IncompleteError
from warden.safeio import fsync_dir

STEP_DIR = re.compile(r"^step-(\d{9,})$")
MANIFEST = "manifest.sha256.json"
STATE = "trainer_state.json"


class CheckpointError(IncompleteError):
    """A checkpoint could not be written or read; the message names the path."""


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    path: str


def list_complete(root: str) -> list[CheckpointRef]:
    """Complete checkpoints under ``root``, newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    refs = []
    for name in names:
        match = STEP_DIR.match(name)
        if match and os.path.isdir(os.path.join(root, name)):
            refs.append(CheckpointRef(int(match.group(1)), os.path.join(root, name)))
    return sorted(refs, key=lambda r: r.step, reverse=True)


def remove_stale_temporaries(root: str) -> list[str]:
    """Deletes ``.tmp-step-*`` and ``.del-step-*`` directories left by a crash; returns their names."""
    removed = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith((".tmp-step-", ".del-step-")):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


# -- nested state <-> (JSON, tensors) --------------------------------------------------
def flatten_state(obj: Any, tensors: dict[str, torch.Tensor], path: str = "t") -> Any:
    """Replaces every tensor by ``{"__tensor__": key}`` and collects it in ``tensors``.

    Dict keys keep their type (optimizer state is keyed by int) via ``__items__``.
    """
    if isinstance(obj, torch.Tensor):
        key = f"{path}"
        tensors[key] = obj.detach().contiguous().cpu().clone()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__items__": [[k, flatten_state(v, tensors, f"{path}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(f"cannot store a {type(obj).__name__} at {path} without pickle")


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        return {k: unflatten_state(v, tensors) for k, v in obj["__items__"]}
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


def write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)


def save_state(directory: str, name: str, state: Any) -> None:
    """``name.json`` + ``name.safetensors`` (the latter only when there are tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten_state(state, tensors)
    write_json(os.path.join(directory, f"{name}.json"), skeleton)
    if tensors:
        save_file(tensors, os.path.join(directory, f"{name}.safetensors"))


# -- manifest ----------------------------------------------------------------------------
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


def _fsync_tree(directory: str) -> None:
    for base, _dirs, files in os.walk(directory, topdown=False):
        for name in files:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(base)


def write_checkpoint(root: str, step: int, fill: Callable[[str], None]) -> str:
    """Calls ``fill(tmp_dir)``, writes the manifest, fsyncs and renames; returns the final path.

    Raises CheckpointError when the directory cannot be written; the temporary directory
    is removed then, so a failed write never looks complete.
    """
    final = os.path.join(root, step_dir_name(step))
    tmp = os.path.join(root, ".tmp-" + step_dir_name(step))
    try:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        fill(tmp)
        write_manifest(tmp)
        _fsync_tree(tmp)
        doomed = _retire(final) if os.path.exists(final) else None  # same step saved again
        os.rename(tmp, final)
        fsync_dir(root)
        if doomed:
            shutil.rmtree(doomed, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{tmp}: checkpoint write failed: {exc.strerror or exc}") from exc
    return final


def prune(root: str, keep_last: int) -> list[str]:
    """Deletes all but the newest ``keep_last`` complete checkpoints (and their .sig files)."""
    removed = []
    for ref in list_complete(root)[keep_last:]:
        doomed = _retire(ref.path)
        sig = ref.path + ".sig"
        if os.path.exists(sig):
            os.unlink(sig)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(ref.path)
    return removed


def _retire(path: str) -> str:
    """Renames a complete checkpoint out of sight first, so a crash mid-delete never
    leaves a half-deleted ``step-N`` that looks complete."""
    doomed = os.path.join(os.path.dirname(path), ".del-" + os.path.basename(path))
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    fsync_dir(os.path.dirname(path))
    return doomed


def contains_pickle(path: str) -> bool:
    """True if the file starts like a pickle (protocol 2+) or a zip (torch.save)."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    return (len(head) >= 2 and head[0] == 0x80 and head[1] <= 5) or head.startswith(b"PK\x03\x04")
