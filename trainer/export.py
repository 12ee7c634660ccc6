"""``warden export``: a LoRA checkpoint's actor adapter merged into its base, written as a model
directory (safetensors + JSON) and signed like a checkpoint.

1. The checkpoint is verified before any of it is used (:mod:`trainer.verified_load`: its signature
   under ``--trust``, else its manifest, integrity only) and must be a LoRA checkpoint.
2. The base (``--base``) is loaded in the run's ``model.dtype`` and digested as the trainer does
   (:func:`trainer.lora.base_digest`); a base other than the one recorded in ``trainer_state.json``
   is refused (exit 1) naming both digests.
3. The adapter is copied into a peft model on that base and merged (``merge_and_unload``); the
   merged model's ``config.json``, ``generation_config.json`` and ``model.safetensors`` are
   serialised in memory, hashed as written into a private temporary directory beside ``--out``,
   with a ``manifest.sha256.json``, fsynced and renamed into place (an existing ``--out`` is refused).
4. The directory is signed with the signer policy's key (:func:`warden.signing.dsse.sign_checkpoint`,
   ``<out>.sig``); the provenance carries the run id and step of the checkpoint and, as parent,
   the checkpoint's signed root digest when it was verified by signature.

The tokenizer is not copied: it is the base's.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import click
import torch

from trainer import checkpoint as ckpt
from trainer import lora
from trainer.config import LoraConfig
from trainer.models import load_causal_lm, save_pretrained_files
from trainer.verified_load import CheckpointRejected, integrity_anchor, read_verified, signed_anchor
from warden import safeio
from warden.cliutil import echo, option, policy_options
from warden.errors import ConfigError, ViolationError, quote_untrusted

BUDGET_TIMES_BASE = 8
"""The most a checkpoint may read, in multiples of the base directory's bytes (a separate float32 critic
and its two moments are the largest a LoRA checkpoint holds)."""
BUDGET_SLACK_BYTES = 64 << 20


class ExportRefused(ViolationError):
    """The checkpoint is not a LoRA checkpoint of this base (exit 1)."""


@dataclass(frozen=True)
class ExportResult:
    out: str
    signature: str
    root_digest: str
    base_digest: str
    step: int
    files: int


class _Flat:
    """A sink that writes ``model/<name>`` as ``<name>``: the model's files at the directory's top."""

    def __init__(self, writer: ckpt.CheckpointWriter) -> None:
        self.writer = writer

    @staticmethod
    def _name(relative: str) -> str:
        return relative.split("/", 1)[1]

    def bytes(self, relative: str, payload: bytes) -> None:
        self.writer.bytes(self._name(relative), payload)

    def json(self, relative: str, obj: Any) -> None:
        self.writer.json(self._name(relative), obj)

    def tensors(self, relative: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        self.writer.tensors(self._name(relative), tensors, metadata)


def _lora_settings(state: dict[str, Any]) -> tuple[LoraConfig, str]:
    """The checkpoint's ``model.lora`` and ``model.dtype``; ExportRefused when it has none."""
    model = (state.get("config") or {}).get("model") if isinstance(state.get("config"), dict) else None
    raw = model.get("lora") if isinstance(model, dict) else None
    if not isinstance(raw, dict):
        raise ExportRefused("not a LoRA checkpoint: its config has no model.lora (export merges adapters)")
    names = {f.name for f in dataclasses.fields(LoraConfig)}
    try:
        settings = LoraConfig(**{k: v for k, v in raw.items() if k in names})
        settings = dataclasses.replace(settings, target_modules=tuple(str(m) for m in settings.target_modules))
    except TypeError as exc:
        raise CheckpointRejected(f"{ckpt.STATE}: model.lora unreadable ({quote_untrusted(exc)})") from None
    dtype = model.get("dtype", "float32") if isinstance(model, dict) else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise CheckpointRejected(f"{ckpt.STATE}: model.dtype {quote_untrusted(dtype)}")
    return settings, str(dtype)


def _write_model_dir(out: str, model: Any) -> tuple[dict[str, str], int]:
    """The merged model's files into ``out`` (which must not exist), atomically; (digests, file count)."""
    parent, name = os.path.split(os.path.abspath(out))
    if not name:
        raise ConfigError(f"--out {quote_untrusted(out)}: name a directory to create")
    root_fd = safeio.open_root(parent)
    try:
        try:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            raise ConfigError(f"--out {quote_untrusted(out)}: exists; export writes a new directory")
        except FileNotFoundError:
            pass
        tmp, tmp_fd = safeio.make_private_dir_at(root_fd, ".tmp-" + name)
        try:
            created = safeio.identity(os.fstat(tmp_fd))
            writer = ckpt.CheckpointWriter(tmp_fd)
            try:
                save_pretrained_files(_Flat(writer), "model", model)
            finally:
                digests = writer.finish()
            safeio.write_new_at(tmp_fd, ckpt.MANIFEST, ckpt.manifest_bytes(digests))
            os.fsync(tmp_fd)
            os.fchmod(tmp_fd, 0o755)
        except BaseException:
            os.close(tmp_fd)
            safeio.remove_tree_at(root_fd, tmp)
            raise
        os.close(tmp_fd)
        safeio.rename_checked(root_fd, tmp, name, created)
        os.fsync(root_fd)
    finally:
        os.close(root_fd)
    return digests, len(digests) + 1


def merge_checkpoint(checkpoint_dir: str, base_dir: str, trusted: Any = None) -> tuple[Any, dict[str, Any], Any]:
    """(the merged model, the checkpoint's trainer state, its anchor): steps 1 to 3 of the module doc."""
    from peft import get_peft_model

    path = os.path.abspath(checkpoint_dir)
    step = ckpt.step_of_name(os.path.basename(path))
    if step is None or not os.path.isdir(path):
        raise ConfigError(f"--checkpoint {quote_untrusted(checkpoint_dir)}: not a checkpoint directory step-NNNNNNNNN")
    anchor = signed_anchor(path, trusted) if trusted is not None else integrity_anchor(path)
    base_bytes = sum(os.path.getsize(os.path.join(top, f)) for top, _dirs, names in os.walk(base_dir) for f in names)
    verified = read_verified(path, step, anchor, BUDGET_TIMES_BASE * base_bytes + BUDGET_SLACK_BYTES)
    state = verified.json(ckpt.STATE)
    if not isinstance(state, dict):
        raise CheckpointRejected(f"{ckpt.STATE}: not a JSON object")
    settings, dtype = _lora_settings(state)
    base = load_causal_lm(base_dir, dtype, torch.device("cpu")).requires_grad_(False)
    digest = lora.base_digest(base)
    recorded = state.get(lora.BASE_DIGEST_KEY)
    if recorded != digest:
        raise ExportRefused(
            f"the checkpoint's adapters were trained on the base model {quote_untrusted(recorded, 80)}, "
            f"but {base_dir} is {digest}: export onto the checkpoint's own base"
        )
    peft_model = get_peft_model(base, lora.peft_config(settings), adapter_name=lora.ACTOR_ADAPTER)
    models = lora.LoraModels(peft_model, digest, (lora.ACTOR_ADAPTER,))
    lora.copy_pairs(lora.read_actor(verified, models))
    return peft_model.merge_and_unload(), state, anchor


def export_merged(checkpoint_dir: str, base_dir: str, out: str, private_key: Any, trusted: Any = None) -> ExportResult:
    """Merges, writes and signs (the module doc's four steps)."""
    from warden import __version__
    from warden.signing.dsse import sign_checkpoint
    from warden.signing.manifest import Provenance

    merged, state, anchor = merge_checkpoint(checkpoint_dir, base_dir, trusted)
    _digests, files = _write_model_dir(out, merged)
    run_id = state.get("run_id") if isinstance(state.get("run_id"), str) else None
    step = ckpt.step_of_name(os.path.basename(os.path.abspath(checkpoint_dir)))
    provenance = Provenance(
        run_id=run_id, step=step, trainer_version=__version__, parent_root_digest=anchor.root_digest
    )
    signed = sign_checkpoint(out, private_key, provenance)
    return ExportResult(
        os.path.abspath(out),
        signed.signature_path,
        signed.root_digest,
        str(state[lora.BASE_DIGEST_KEY]),
        step or 0,
        files,
    )


@click.command("export")
@option(
    "--checkpoint",
    "checkpoint_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="A LoRA checkpoint directory (step-NNNNNNNNN) of `warden train`.",
)
@option("--base", "base_dir", required=True, type=click.Path(file_okay=False), help="The base model directory.")
@option("--out", required=True, type=click.Path(), help="The merged model directory to create (must not exist).")
@option(
    "--trust",
    type=click.Path(),
    metavar="FILE_OR_DIR",
    help="Verify the checkpoint's signature under these public keys; without, its manifest (integrity only).",
)
@policy_options("signer")
def export(checkpoint_dir: str, base_dir: str, out: str, trust: str | None, policy: str | None) -> None:
    """Merge a LoRA checkpoint's adapters into their base and write a signed model directory."""
    from trainer.models import quiet_transformers
    from warden.policy import load_policy
    from warden.signer.policy import SignerPolicy
    from warden.signer.state import signing_key
    from warden.signing.keys import load_trusted_keys

    quiet_transformers()
    signer = load_policy(policy, SignerPolicy) if policy else SignerPolicy()
    key = signing_key(signer, policy)
    trusted = load_trusted_keys(trust) if trust else None
    result = export_merged(checkpoint_dir, base_dir, out, key, trusted)
    echo(
        f"exported {result.out}: {result.files} files, step {result.step}, root sha256:{result.root_digest}\n"
        f"  base {result.base_digest}, signature {result.signature}"
    )
