"""Shared helpers for the warden.signing tests (and the signer sidecar's, which import them
through ``tests.sidecars.signer.signer_helpers``): checkpoint builders, keys, model_signing.

Imported as ``tests.warden.signing.signing_helpers`` (the tests tree has no __init__ files).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from warden.signing.keys import TrustedKeys, generate_keypair, load_private_key, load_trusted_keys

# A checkpoint shaped like the trainer's: nested dirs, a multi-chunk tensor file, an empty file.
CHECKPOINT_FILES: dict[str, bytes] = {
    "actor/model.safetensors": random.Random(1).randbytes(3 * 1024 * 1024 + 17),
    "actor/config.json": b'{"hidden_size": 64}\n',
    "actor/empty": b"",
    "critic/model.safetensors": random.Random(2).randbytes(70_000),
    "trainer_state.json": b'{"step": 50, "rng": "json-not-pickle"}\n',
    "a/b/c/deep.bin": b"deep",
    "a.b": b"sorts after a/ by path components",
}


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Creates ``root`` with ``files`` (relative POSIX names -> content); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def random_tree(rng: random.Random) -> dict[str, bytes]:
    """A small random checkpoint: 1..6 files, names with dots and dashes, up to 3 levels deep."""
    parts = ["actor", "critic", "a", "a.b", "x-y", "0", "ü"]
    files: dict[str, bytes] = {}
    for _ in range(rng.randint(1, 6)):
        depth = rng.randint(0, 2)
        dirs = [rng.choice(parts) + "_d" for _ in range(depth)]
        name = "/".join([*dirs, f"{rng.choice(parts)}.{rng.randint(0, 99)}"])
        files[name] = rng.randbytes(rng.choice([0, 1, 100, 4096]))
    return files


@dataclass(frozen=True)
class Keys:
    """A generated key pair on disk and loaded."""

    directory: Path
    private_path: Path
    public_path: Path
    private: ec.EllipticCurvePrivateKey
    key_id: str

    def trusted(self) -> TrustedKeys:
        return load_trusted_keys(self.public_path)


def make_keys(directory: Path) -> Keys:
    """Generates a pair with :func:`generate_keypair` and loads it."""
    files = generate_keypair(directory)
    return Keys(
        directory, Path(files.private_key), Path(files.public_key), load_private_key(files.private_key), files.key_id
    )


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """Copies a checkpoint directory and its ``.sig`` beside it."""
    shutil.copytree(src, dst)
    sig = Path(str(src) + ".sig")
    if sig.exists():
        shutil.copyfile(sig, str(dst) + ".sig")
    return dst


def model_signing_cli() -> str:
    """Path of the ``model_signing`` CLI; skips (fails when CI=true) if it is not installed."""
    candidates = [os.path.join(os.path.dirname(sys.executable), "model_signing"), shutil.which("model_signing")]
    found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None:
        message = "model_signing CLI not installed: pip install model-signing pyOpenSSL (the test extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; required when CI=true")
        pytest.skip(message)
    return found


def run_model_signing(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the model_signing CLI and captures its output."""
    return subprocess.run(
        [model_signing_cli(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
