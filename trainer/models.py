"""Actor, frozen reference and critic (causal-LM backbone + value head), loaded locally.

Every ``from_pretrained`` passes ``trust_remote_code=False`` and ``local_files_only=True``.
Weights are saved with safetensors only.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from trainer.checkpoint import CheckpointSink

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CRITIC_WEIGHTS = "critic.safetensors"


def quiet_transformers() -> None:
    """No per-file progress bars from transformers in the trainer's console or logs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_causal_lm(path: str, dtype: str, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model: Any = AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=False, local_files_only=True, dtype=DTYPES[dtype]
    )
    return model.to(device)


class Critic(nn.Module):
    """Value model: ``forward(input_ids (B, L), attention_mask (B, L)) -> values (B, L)`` float32."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        hidden = out.last_hidden_state
        values = self.value_head(hidden.to(self.value_head.weight.dtype))
        # A fresh tensor, never a view of the head's output: FSDP2 hooks the module's output for backward
        return values.squeeze(-1).to(torch.float32, copy=True)


def _backbone_from_config(path: str, dtype: str) -> tuple[nn.Module, int]:
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return AutoModel.from_config(config, dtype=DTYPES[dtype]), int(config.hidden_size)


def load_critic(path: str, dtype: str, device: torch.device) -> Critic:
    """A critic from a saved critic directory, or a fresh value head on a causal-LM's backbone."""
    weights = os.path.join(path, CRITIC_WEIGHTS)
    if os.path.exists(weights):
        backbone, hidden = _backbone_from_config(path, dtype)
        critic = Critic(backbone, hidden)
        critic.load_state_dict(load_file(weights))
        return critic.to(device)
    lm = load_causal_lm(path, dtype, torch.device("cpu"))
    critic = Critic(lm.model, int(lm.config.hidden_size))
    return critic.to(device)


def save_critic(critic: Critic, writer: CheckpointSink, out_dir: str, source_config_dir: str) -> None:
    """Serialises ``critic.safetensors`` and the backbone's ``config.json`` into ``out_dir`` of the checkpoint."""
    state = {k: v.detach() for k, v in critic.state_dict().items()}  # the sink copies to the host
    writer.tensors(f"{out_dir}/{CRITIC_WEIGHTS}", state)
    write_critic_config(writer, out_dir, source_config_dir)


def write_critic_config(writer: CheckpointSink, out_dir: str, source_config_dir: str) -> None:
    """The critic backbone's ``config.json`` into ``out_dir`` of the checkpoint."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source_config_dir, local_files_only=True)
    writer.bytes(f"{out_dir}/config.json", config.to_json_string(use_diff=True).encode("utf-8"))


def save_pretrained_files(writer: CheckpointSink, out_dir: str, model: Any) -> None:
    """What ``save_pretrained(out_dir, safe_serialization=True)`` writes (``config.json``,
    ``generation_config.json`` when the model has one, ``model.safetensors`` without the tied
    duplicates), serialised in memory so each byte is hashed as it is written.

    A tensor sharing storage with one already kept (tied embeddings) is left out, as
    ``save_pretrained`` does; loading ties it again.
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    for name, tensor in model.state_dict().items():
        key = (
            tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size(),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach()  # the sink copies it to the host (the writer, or the staging arena)
    writer.bytes(f"{out_dir}/config.json", model.config.to_json_string(use_diff=True).encode("utf-8"))
    generation = getattr(model, "generation_config", None)
    if generation is not None and model.can_generate():
        writer.bytes(f"{out_dir}/generation_config.json", generation.to_json_string(use_diff=True).encode("utf-8"))
    writer.tensors(f"{out_dir}/model.safetensors", tensors, metadata={"format": "pt"})


def unwrap(model: nn.Module) -> Any:
    """The module inside a DistributedDataParallel wrapper, or the model itself."""
    return getattr(model, "module", model)
