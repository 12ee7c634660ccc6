"""LoRA fine-tuning (``model.lora``) with peft: adapters on one frozen base, nothing copied.

- The actor is the base wrapped by peft (``get_peft_model``) with the adapter ``default``;
  only adapter weights require gradients and only they are optimised (in float32: peft casts
  the adapters of a low-precision base up; the base stays in ``model.dtype``).
- The reference policy is the same module inside peft's ``disable_adapter()``
  (:class:`ReferencePolicy`): no second copy of the weights is ever built.
- ``model.lora.critic: shared``: a value head on the same base with its own adapter ``critic``
  (:class:`SharedCritic`; peft's multi-adapter model, the active adapter set per forward and
  ``default`` again after it). ``separate``: the critic of a full fine-tuning run. GRPO has none.
- A checkpoint holds the adapters (``actor/adapter_model.safetensors`` with peft's
  ``adapter_config.json``, so the directory loads with ``PeftModel.from_pretrained``), the
  critic's adapter and value head, the optimizer state of the trained parameters and the
  rest of the run's state; never the base. ``trainer_state.json`` records the base's digest
  (:func:`base_digest`, over the weights as loaded) and a resume onto another base is refused.

peft's ``set_adapter`` and ``disable_adapter`` switch ``requires_grad`` off on the adapters not
active; every switch here ends by setting the trained set back (:meth:`LoraModels.restore_trainable`),
so the optimizers, gradient clipping and DDP always see the same trainable parameters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.checkpoint import CheckpointSink
from trainer.config import LoraConfig, TrainerConfig
from trainer.models import load_causal_lm
from trainer.verified_load import CheckpointRejected, VerifiedCheckpoint
from warden.errors import ConfigError, quote_untrusted

ACTOR_ADAPTER = "default"
CRITIC_ADAPTER = "critic"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
VALUE_HEAD = "value_head.safetensors"
BASE_DIGEST_KEY = "base_model_digest"
DIGEST_PREFIX = "sha256:"


# -- the base's identity ------------------------------------------------------------------------
def _tensor_digest(tensor: torch.Tensor) -> bytes:
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.data).digest()


def base_digest(model: nn.Module, workers: int = 4) -> str:
    """``sha256:<hex>`` over the base's weights as loaded: for each state entry in name order, its
    name, dtype, shape and the SHA-256 of its bytes (hashed in parallel; hashlib drops the GIL).

    Tied weights appear under each name, as in ``state_dict``. The digest follows the bytes the
    trainer computes with, so a base re-saved in another layout digests the same, and a base
    loaded in another ``model.dtype`` differs (the config guard names that change first).
    """
    state = model.state_dict()
    names = sorted(state)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        digests = list(pool.map(lambda n: _tensor_digest(state[n]), names))
    outer = hashlib.sha256()
    for name, digest in zip(names, digests, strict=True):
        tensor = state[name]
        outer.update(f"{name}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode())
        outer.update(digest)
    return DIGEST_PREFIX + outer.hexdigest()


# -- building -----------------------------------------------------------------------------------
def peft_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        init_lora_weights=True,  # B = 0: the adapted model starts equal to the base
    )


@dataclass
class LoraModels:
    """The peft model, its base's digest and the adapters it trains (``default``, and ``critic``
    for a shared critic)."""

    peft: Any
    base_digest: str
    adapters: tuple[str, ...]

    def adapter_params(self, name: str) -> list[nn.Parameter]:
        """``name``'s parameters in module order (what its optimizer holds)."""
        marker = f".{name}."
        return [p for n, p in self.peft.named_parameters() if "lora_" in n and marker in n]

    def trainable(self) -> list[nn.Parameter]:
        return [p for name in self.adapters for p in self.adapter_params(name)]

    def restore_trainable(self) -> None:
        """Every adapter this run trains requires gradients again (peft's switches turn some off)."""
        for param in self.trainable():
            param.requires_grad_(True)

    @contextmanager
    def active(self, name: str) -> Iterator[None]:
        """``name`` active for the forward passes inside; ``default`` (the actor) after."""
        self.peft.set_adapter(name)
        try:
            yield
        finally:
            self.peft.set_adapter(ACTOR_ADAPTER)
            self.restore_trainable()

    @contextmanager
    def dropout_active(self) -> Iterator[None]:
        """The adapters' dropout on (the update's forwards); off again after, as for the rest of
        the run (rollout, log-probs, values), where the models stay in eval mode."""
        drops = [m for n, m in self.peft.named_modules() if n.rsplit(".", 1)[-1] == "lora_dropout"]
        for module in drops:
            module.train()
        try:
            yield
        finally:
            for module in drops:
                module.eval()


def build(path: str, cfg: TrainerConfig, device: torch.device, shared_critic: bool) -> LoraModels:
    """The base from ``path`` in ``model.dtype`` (frozen, digested as loaded) wrapped with the actor's
    adapter, and the critic's when ``shared_critic``; on ``device``, in eval mode."""
    from peft import get_peft_model

    lora = cfg.model.lora
    assert lora is not None
    base = load_causal_lm(path, cfg.model.dtype, torch.device("cpu"))
    base.requires_grad_(False)
    digest = base_digest(base)
    config = peft_config(lora)
    try:
        model = get_peft_model(base, config, adapter_name=ACTOR_ADAPTER)
        if shared_critic:
            model.add_adapter(CRITIC_ADAPTER, peft_config(lora))
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ConfigError(
            f"model.lora.target_modules: {list(lora.target_modules)} do not fit the base at {path}: "
            f"{quote_untrusted(str(exc), 300)}"
        ) from None
    model.set_adapter(ACTOR_ADAPTER)
    models = LoraModels(model.to(device).eval(), digest, (ACTOR_ADAPTER,) + ((CRITIC_ADAPTER,) * shared_critic))
    models.restore_trainable()
    return models


class ReferencePolicy:
    """The reference policy: the actor's module with every adapter disabled. Called like a causal LM
    (``input_ids``, ``attention_mask``, ``position_ids``); holds no weights of its own."""

    def __init__(self, models: LoraModels) -> None:
        self.models = models

    def __call__(self, **kwargs: Any) -> Any:
        try:
            with self.models.peft.disable_adapter():
                return self.models.peft(**kwargs)
        finally:
            self.models.restore_trainable()


class SharedCritic(nn.Module):
    """Value model on the actor's base with the ``critic`` adapter: ``forward(input_ids, attention_mask,
    position_ids) -> values (B, L)`` float32. Its only own parameters are the value head; the
    adapter's are in :meth:`trained_parameters` (the peft model is not a submodule, so
    ``parameters()`` never reaches the actor's weights)."""

    models: LoraModels

    def __init__(self, models: LoraModels, hidden_size: int, device: torch.device) -> None:
        super().__init__()
        object.__setattr__(self, "models", models)  # not registered: shared, not owned
        self.value_head = nn.Linear(hidden_size, 1, device=device)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def trained_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters()) + self.models.adapter_params(CRITIC_ADAPTER)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        lm = self.models.peft.get_base_model()
        backbone = getattr(lm, lm.base_model_prefix)  # the decoder stack, without the LM head
        with self.models.active(CRITIC_ADAPTER):
            hidden = backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
            ).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()


def hidden_size(models: LoraModels) -> int:
    return int(models.peft.get_base_model().config.hidden_size)


# -- saving -------------------------------------------------------------------------------------
def adapter_tensors(models: LoraModels, name: str) -> dict[str, torch.Tensor]:
    """``name``'s weights under peft's file names (views of the parameters: a restore copies into them)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(models.peft, adapter_name=name, save_embedding_layers=False)
    return {k: v.detach() for k, v in state.items()}


def adapter_config_bytes(models: LoraModels, name: str) -> bytes:
    """peft's ``adapter_config.json`` for ``name``, deterministic (sets sorted) and without the base's
    local path (the base is named by its digest in ``trainer_state.json``)."""
    config = models.peft.peft_config[name].to_dict()
    config["base_model_name_or_path"] = None
    plain = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return json.dumps(plain, indent=2, sort_keys=True, default=str).encode("utf-8")


def save_adapter(writer: CheckpointSink, out_dir: str, models: LoraModels, name: str) -> None:
    writer.bytes(f"{out_dir}/{ADAPTER_CONFIG}", adapter_config_bytes(models, name))
    writer.tensors(f"{out_dir}/{ADAPTER_WEIGHTS}", adapter_tensors(models, name), metadata={"format": "pt"})


def head_tensors(critic: SharedCritic) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in critic.value_head.state_dict().items()}


def save_shared_critic(writer: CheckpointSink, critic: SharedCritic) -> None:
    save_adapter(writer, "critic", critic.models, CRITIC_ADAPTER)
    writer.tensors(f"critic/{VALUE_HEAD}", head_tensors(critic))


def saved_weights(models: LoraModels, critic: Any) -> list[torch.Tensor]:
    """The weight tensors a LoRA checkpoint holds (the actor's adapter, a shared critic's adapter and
    head, or a separate critic's whole state): what the staging arena is sized for."""
    tensors = list(adapter_tensors(models, ACTOR_ADAPTER).values())
    if isinstance(critic, SharedCritic):
        tensors += list(adapter_tensors(models, CRITIC_ADAPTER).values()) + list(head_tensors(critic).values())
    elif critic is not None:
        tensors += list(critic.state_dict().values())
    return tensors


# -- resuming -----------------------------------------------------------------------------------
def check_base(models: LoraModels, state: dict[str, Any], path: str) -> None:
    """The checkpoint's adapters were trained on this run's base; ConfigError (exit 2) naming both
    digests when not, CheckpointRejected when the checkpoint records none."""
    saved = state.get(BASE_DIGEST_KEY)
    if not isinstance(saved, str) or not saved.startswith(DIGEST_PREFIX):
        raise CheckpointRejected(f"trainer_state.json: no {BASE_DIGEST_KEY} for the LoRA adapters it holds")
    if saved != models.base_digest:
        raise ConfigError(
            f"resume: the checkpoint's adapters were trained on the base model {quote_untrusted(saved, 80)}, "
            f"but the base loaded from {path} is {models.base_digest}; point model.actor_path at the "
            "checkpoint's base, or start over with --resume never"
        )


def _checked_pairs(
    where: str, own: dict[str, torch.Tensor], saved: dict[str, Any]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter view, saved tensor) for every name; CheckpointRejected unless names, shapes and
    dtypes are exactly the model's."""
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    wrong = sorted(
        k
        for k in set(own) & set(saved)
        if not isinstance(saved[k], torch.Tensor)
        or tuple(saved[k].shape) != tuple(own[k].shape)
        or saved[k].dtype != own[k].dtype
    )
    if missing or unexpected or wrong:
        raise CheckpointRejected(
            f"{where}: the adapter weights do not match this run's adapters (missing {missing[:3]}, "
            f"unexpected {quote_untrusted(unexpected[:3])}, wrong shape or dtype {wrong[:3]})"
        )
    return [(own[k], saved[k]) for k in sorted(own)]


def read_actor(checkpoint: VerifiedCheckpoint, models: LoraModels) -> list[tuple[torch.Tensor, torch.Tensor]]:
    name = f"actor/{ADAPTER_WEIGHTS}"
    if name not in checkpoint.files:
        raise CheckpointRejected(f"{name}: missing among the signed files of a LoRA checkpoint")
    return _checked_pairs(name, adapter_tensors(models, ACTOR_ADAPTER), checkpoint.tensors(name))


def read_shared_critic(checkpoint: VerifiedCheckpoint, critic: SharedCritic) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for name, own in (
        (f"critic/{ADAPTER_WEIGHTS}", adapter_tensors(critic.models, CRITIC_ADAPTER)),
        (f"critic/{VALUE_HEAD}", head_tensors(critic)),
    ):
        if name not in checkpoint.files:
            raise CheckpointRejected(f"{name}: missing, but this run's critic is shared (model.lora.critic)")
        pairs += _checked_pairs(name, own, checkpoint.tensors(name))
    return pairs


@torch.no_grad()
def copy_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for own, saved in pairs:
        own.copy_(saved)
