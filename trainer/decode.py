"""Warden's own decode loop for the HF rollout engine: a static KV cache, explicit masks and
positions, and on CUDA the one-token step replayed from a captured CUDA graph.

``model.generate`` spends most of a small model's decode step on the host (logits-processor
and stopping-criteria calls, mask building, a device sync per token to ask whether every row
has finished), so the GPU waits on Python. Here the step is the model's forward alone, over
buffers whose addresses never change: the 4-D attention mask is computed on the device from a
position counter that the step itself advances, so a graph of it can be replayed ``T`` times.
Sampling stays outside the graph and is :class:`~trainer.rollout.SeededSampling` on the same
float32 logits, so a row's sample is the one ``generate`` would draw from those logits; the
host asks whether every row has stopped only every ``CHECK_EVERY`` tokens.

Contract of :meth:`StaticDecoder.generate`: ``prompt_ids`` ``(B, P)`` left-padded with its
``prompt_mask``; returns ``(B, T)`` tokens (``T = max_new_tokens``), each row ``pad_id`` after
its first stop token, as ``generate`` pads finished rows.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

CHECK_EVERY = 16
"""Tokens between two host checks of whether every row has stopped (each check is a device sync)."""


class UnsupportedModel(Exception):
    """The model cannot be decoded here (its attention takes no explicit 4-D mask); generate() can."""


class StaticDecoder:
    """Seeded sampling from ``model`` over a static KV cache; ``graphs`` replays each token step
    from a CUDA graph captured once per batch shape (weights must be updated in place)."""

    def __init__(
        self,
        model: Any,
        max_new_tokens: int,
        stop_ids: Sequence[int],
        pad_id: int,
        graphs: bool,
        compiled: bool = False,
    ) -> None:
        self.model, self.max_new, self.pad_id, self.graphs = model, max_new_tokens, pad_id, graphs
        # compiled: the one-token forward through torch.compile (fused kernels) before it is captured;
        # a small model's graph replay is bound by its kernel count, not by the host
        self._forward = torch.compile(self._forward_eager, dynamic=False) if compiled else self._forward_eager
        self.stop_ids = tuple(stop_ids)
        attention = getattr(model.config, "_attn_implementation", None) or "eager"
        if attention not in ("sdpa", "eager"):
            raise UnsupportedModel(f"attention implementation {attention!r} takes no 4-D mask; use model.generate")
        self._additive = attention == "eager"
        # transformers 5.x renames the argument (past_key_values -> cache, the old name deprecated)
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._shape: tuple[int, int] | None = None
        self._graph: Any = None
        self._cache: Any = None

    # -- buffers, one set per (batch, prompt length) -----------------------------------------
    def _allocate(self, rows: int, prompt: int, device: torch.device) -> None:
        from transformers import StaticCache

        length = prompt + self.max_new
        self._cache = StaticCache(config=self.model.config, max_cache_len=length)
        self._keep = torch.zeros((rows, length), dtype=torch.bool, device=device)  # kv slots a row may attend
        self._slots = torch.arange(length, device=device)
        self._at = torch.zeros((), dtype=torch.long, device=device)  # the slot the next token is written to
        self._token = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self._position = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self._logits = torch.zeros((rows, self.model.config.vocab_size), dtype=torch.float32, device=device)
        self._graph, self._shape = None, (rows, prompt)

    def _as_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean 4-D mask as the model's attention takes it: SDPA as is, eager as an additive bias."""
        if not self._additive:
            return allowed
        dtype = self.model.dtype
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return bias.masked_fill_(~allowed, torch.finfo(dtype).min)

    def _forward_eager(self, token: torch.Tensor, allowed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The model's float32 logits ``(B, V)`` at the last of ``token``'s positions (writes their keys and
        values); ``allowed``: the boolean 4-D mask of the kv slots each query may attend."""
        out = self.model(
            input_ids=token,
            attention_mask=self._as_mask(allowed),
            position_ids=position,
            **{self._cache_kw: self._cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _step(self) -> None:
        """One token for every row: reads ``_token``/``_position``/``_at``, writes ``_logits``, advances."""
        allowed = (self._keep & (self._slots <= self._at))[:, None, None, :]
        self._logits.copy_(self._forward(self._token, allowed, self._position))
        self._at.add_(1)
        self._position.add_(1)

    def _capture(self) -> None:
        """Records :meth:`_step` into a CUDA graph; the warm-up runs' effects are undone by the caller."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # compiled, kernels chosen and workspaces allocated before capture
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        self._graph = graph

    # -- one call --------------------------------------------------------------------------
    def _prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Runs the prompts through the model into a reset cache; returns the last position's logits."""
        rows, prompt = prompt_ids.shape
        self._cache.reset()
        self._fill_to(0)
        valid = prompt_mask.bool()
        self._keep[:, :prompt] = valid
        self._keep[:, prompt:] = True
        causal = torch.ones((prompt, prompt), dtype=torch.bool, device=prompt_ids.device).tril()
        own = torch.eye(prompt, dtype=torch.bool, device=prompt_ids.device)  # a pad row attends itself: no NaN
        full = torch.zeros((rows, 1, prompt, self._keep.shape[1]), dtype=torch.bool, device=prompt_ids.device)
        full[:, 0, :, :prompt] = (causal[None] & valid[:, None, :]) | own[None]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        logits = self._forward_eager(prompt_ids, full, positions)
        self._position.copy_(valid.long().sum(-1, keepdim=True))
        self._at.fill_(prompt)
        return logits

    def _fill_to(self, slots: int) -> None:
        """Sets every static cache layer's count of written slots (the slot its next update writes)."""
        for layer in getattr(self._cache, "layers", ()):
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(slots)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sample: Any) -> torch.Tensor:
        """``sample(logits (B, V) float32) -> (B, V)`` scores whose argmax is the token (SeededSampling)."""
        rows, prompt = prompt_ids.shape
        if self._shape != (rows, prompt):
            self._allocate(rows, prompt, prompt_ids.device)
        logits = self._prefill(prompt_ids, prompt_mask)
        if self.graphs and self._graph is None:
            start = self._position.clone()
            self._capture()
            # the warm-up's writes are undone by the counters: slots past the prompt stay masked until rewritten
            self._fill_to(prompt)
            self._at.fill_(prompt)
            self._position.copy_(start)
        stops = torch.tensor(self.stop_ids, dtype=torch.long, device=prompt_ids.device)
        out = torch.full((rows, self.max_new), self.pad_id, dtype=torch.long, device=prompt_ids.device)
        running = torch.ones(rows, dtype=torch.bool, device=prompt_ids.device)
        for t in range(self.max_new):
            token = sample(logits).argmax(-1)
            token = torch.where(running, token, torch.full_like(token, self.pad_id))
            out[:, t] = token
            running &= ~torch.isin(token, stops)
            if t + 1 == self.max_new or ((t + 1) % CHECK_EVERY == 0 and not bool(running.any())):
                break
            self._token.copy_(token[:, None])
            if self._graph is not None:
                self._graph.replay()
            else:
                self._step()
            logits = self._logits
        return out
