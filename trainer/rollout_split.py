"""Rollout on its own devices (``rollout.devices``): the engine in a separate process, fed by the trainer.

Layout: the trainer ranks ``0 .. W-1`` (their own torchrun group, untouched) and one rollout process.
Trainer rank 0 and the rollout process share a private two-rank :class:`Link` (its own TCP store and a
gloo or NCCL process group object, never the default group), so the trainer's collectives (DDP, FSDP)
never include the rollout process and a torchrun world needs no change. With ``W > 1`` every rollout
is one request for the whole batch: the ranks' prompt rows are gathered to rank 0, which asks the
engine, and the answer is broadcast back over the trainer group (each rank keeps its rows).

Protocol (every control message is a typed payload, JSON bytes in a uint8 tensor, never a pickle):

- ``push``: trainer rank 0 sends a :class:`WeightPush` header (version, bucket size, the manifest of
  names, dtypes, shapes, bucket and offset of every tensor), then broadcasts the fixed-size flat
  buckets (:func:`pack_buckets`). The engine unpacks them into its model (:func:`unpack_into`) and
  records the version; a version not above the one it holds is refused.
- ``generate``: a :class:`GenerateRequest` (prompt token ids, sampling seed, row offset, total rows,
  temperature, and the weight version the trainer expects); the engine refuses
  (:class:`StaleWeights`) unless it holds exactly that version, so it never samples from stale
  weights. The answer is a :class:`GenerateResult` (token ids, mask, log-probs when the engine has them).
- ``stop``: the worker leaves the group and exits.

The worker entry point is ``python -m trainer.rollout_split --config FILE --store HOST:PORT
--trainer-world W``. The HF engine runs anywhere; ``rollout.engine: vllm`` builds ``vllm.LLM`` with
``tensor_parallel_size`` on the rollout devices (:class:`SplitVLLMEngine`; a ConfigError naming
``rollout.engine`` when vLLM is not installed; not yet run on a GPU node).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from warden.errors import IncompleteError

DEFAULT_BUCKET_BYTES = 32 << 20
MAX_MESSAGE_BYTES = 256 << 20
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64}


class SplitError(IncompleteError):
    """The split rollout could not complete a request (a malformed message, a protocol violation)."""


class StaleWeights(SplitError):
    """The engine was asked to generate with weights it does not hold (an older or newer version)."""


def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise SplitError(f"weight push: dtype {dtype} is not supported")


def _ints(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise SplitError(f"{name}: expected a list of integers")
    return value


def _int(data: Mapping[str, Any], name: str, minimum: int = 0) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SplitError(f"{name}: expected an integer >= {minimum}, got {str(value)[:40]}")
    return value


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the buckets: ``nbytes`` bytes at ``offset`` of bucket ``bucket``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightPush:
    """The header of one weight push: the version it installs and the layout of its buckets."""

    version: int
    bucket_bytes: tuple[int, ...]  # each bucket's length (all ``<= bucket size`` but an oversized tensor's)
    slots: tuple[TensorSlot, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "kind": "push",
            "version": self.version,
            "bucket_bytes": list(self.bucket_bytes),
            "slots": [[s.name, s.dtype, list(s.shape), s.bucket, s.offset, s.nbytes] for s in self.slots],
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> WeightPush:
        slots = []
        for raw in data.get("slots") or []:
            if not isinstance(raw, list) or len(raw) != 6 or not isinstance(raw[0], str) or raw[1] not in _DTYPES:
                raise SplitError(f"push.slots: malformed slot {str(raw)[:80]}")
            shape, (bucket, offset, nbytes) = _ints(raw[2], "push.slots.shape"), _ints(raw[3:], "push.slots")
            slots.append(TensorSlot(raw[0], raw[1], tuple(shape), bucket, offset, nbytes))
        sizes = _ints(data.get("bucket_bytes"), "push.bucket_bytes")
        for s in slots:
            if not 0 <= s.bucket < len(sizes) or s.offset < 0 or s.offset + s.nbytes > sizes[s.bucket]:
                raise SplitError(f"push.slots: {s.name} lies outside its bucket")
        return cls(_int(data, "version", 1), tuple(sizes), tuple(slots))


@dataclass(frozen=True)
class GenerateRequest:
    """One rollout: unpadded prompt token ids, the step's sampling seed and the weight version expected."""

    prompts: tuple[tuple[int, ...], ...]
    seed: int
    offset: int
    total: int
    temperature: float
    version: int

    def to_data(self) -> dict[str, Any]:
        return {"kind": "generate", **dataclasses.asdict(self), "prompts": [list(p) for p in self.prompts]}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> GenerateRequest:
        raw = data.get("prompts")
        if not isinstance(raw, list) or not raw:
            raise SplitError("generate.prompts: expected a non-empty list of token id lists")
        prompts = tuple(tuple(_ints(p, "generate.prompts[]")) for p in raw)
        temperature = data.get("temperature")
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
            raise SplitError("generate.temperature: expected a number >= 0")
        return cls(
            prompts,
            _int(data, "seed"),
            _int(data, "offset"),
            _int(data, "total"),
            float(temperature),
            _int(data, "version"),
        )


@dataclass(frozen=True)
class GenerateResult:
    """The engine's answer: ``(B, T)`` token ids and mask as lists, log-probs when the engine has them."""

    tokens: tuple[tuple[int, ...], ...]
    mask: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float, ...], ...] = ()
    version: int = 0
    error: str = ""  # set: the engine refused (StaleWeights) and the other fields are empty

    def to_data(self) -> dict[str, Any]:
        return {
            "kind": "result",
            "tokens": [list(t) for t in self.tokens],
            "mask": [list(m) for m in self.mask],
            "logprobs": [list(lp) for lp in self.logprobs],
            "version": self.version,
            "error": self.error,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> GenerateResult:
        tokens = tuple(tuple(_ints(t, "result.tokens[]")) for t in data.get("tokens") or [])
        mask = tuple(tuple(_ints(m, "result.mask[]")) for m in data.get("mask") or [])
        if [len(t) for t in tokens] != [len(m) for m in mask]:
            raise SplitError("result.mask: not the shape of result.tokens")
        logprobs = tuple(tuple(float(x) for x in lp) for lp in data.get("logprobs") or [])
        error = data.get("error") or ""
        if not isinstance(error, str):
            raise SplitError("result.error: expected a string")
        return cls(tokens, mask, logprobs, _int(data, "version"), error[:500])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.tokens, dtype=torch.long), torch.tensor(self.mask, dtype=torch.long)


# -- buckets (pure) ---------------------------------------------------------------------------


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, version: int) -> WeightPush:
    """Packs tensors in order into buckets of at most ``bucket_bytes`` (a larger tensor gets its own). Pure."""
    slots: list[TensorSlot] = []
    sizes: list[int] = []
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if not sizes or sizes[-1] + nbytes > bucket_bytes:
            sizes.append(0)
        slots.append(
            TensorSlot(name, _dtype_name(tensor.dtype), tuple(tensor.shape), len(sizes) - 1, sizes[-1], nbytes)
        )
        sizes[-1] += nbytes
    return WeightPush(version, tuple(sizes), tuple(slots))


def pack_buckets(named: Sequence[tuple[str, torch.Tensor]], plan: WeightPush) -> list[torch.Tensor]:
    """The flat uint8 buckets of ``plan`` filled with ``named``'s bytes (on the tensors' device)."""
    device = named[0][1].device if named else torch.device("cpu")
    buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.bucket_bytes]
    for (name, tensor), slot in zip(named, plan.slots, strict=True):
        assert name == slot.name
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buckets[slot.bucket][slot.offset : slot.offset + slot.nbytes].copy_(flat)
    return buckets


def unpack(buckets: Sequence[torch.Tensor], plan: WeightPush) -> dict[str, torch.Tensor]:
    """``name -> tensor`` views of the buckets (the inverse of :func:`pack_buckets`). Pure."""
    out = {}
    for slot in plan.slots:
        raw = buckets[slot.bucket][slot.offset : slot.offset + slot.nbytes]
        out[slot.name] = raw.view(_DTYPES[slot.dtype]).reshape(slot.shape)
    return out


@torch.no_grad()
def unpack_into(model: Any, buckets: Sequence[torch.Tensor], plan: WeightPush) -> None:
    """Copies the pushed tensors into ``model``'s parameters of the same names; every parameter must be pushed."""
    pushed = unpack(buckets, plan)
    params = dict(model.named_parameters())
    missing, unknown = sorted(set(params) - set(pushed)), sorted(set(pushed) - set(params))
    if missing or unknown:
        raise SplitError(f"weight push: names differ (missing {missing[:3]}, unknown {unknown[:3]})")
    for name, param in params.items():
        param.copy_(pushed[name].to(param.device, param.dtype))


# -- the engine's side (pure state) -----------------------------------------------------------


@dataclass
class EngineWeights:
    """The version of the weights the engine holds (0: the ones on disk, never sampled from)."""

    version: int = 0

    def accept(self, push: WeightPush) -> None:
        if push.version <= self.version:
            raise StaleWeights(f"weight push version {push.version} is not newer than the held {self.version}")

    def installed(self, push: WeightPush) -> None:
        self.version = push.version

    def check(self, request: GenerateRequest) -> None:
        if request.version != self.version:
            raise StaleWeights(
                f"generate asked for weights version {request.version}, the engine holds {self.version}; "
                "refusing to sample from other weights"
            )


# -- messages over a private two-rank link ------------------------------------------------------


class Link:
    """A two-rank process group of its own (trainer rank 0 is 0, the rollout process 1), built from a
    TCP store on ``host:port`` that rank 0 serves. Independent of ``torch.distributed``'s default group."""

    def __init__(self, address: str, rank: int, device: torch.device, timeout_s: float = 600.0) -> None:
        import datetime

        import torch.distributed as dist

        host, _, port = address.rpartition(":")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, int(port), 2, rank == 0, timeout=timeout)
        self.rank, self.peer, self.device = rank, 1 - rank, device
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            self.group: Any = dist.ProcessGroupNCCL(self.store, rank, 2, options)  # not run here: one GPU only
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, 2, timeout)

    def _on_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device) if self.device.type == "cuda" else tensor.cpu()

    def send(self, tensor: torch.Tensor) -> None:
        self.group.send([self._on_wire(tensor).contiguous()], self.peer, 0).wait()

    def recv(self, tensor: torch.Tensor) -> torch.Tensor:
        """Fills a buffer like ``tensor`` from the peer; returns it (on the link's device)."""
        buffer = self._on_wire(tensor)
        self.group.recv([buffer], self.peer, 0).wait()
        return buffer

    def broadcast_from_trainer(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        buffer = self._on_wire(tensor).contiguous()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([buffer], options).wait()
        return buffer


def send_message(payload: Mapping[str, Any], link: Link) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    link.send(torch.tensor([len(body)], dtype=torch.int64))
    link.send(torch.frombuffer(bytearray(body), dtype=torch.uint8))


def recv_message(link: Link) -> dict[str, Any]:
    n = int(link.recv(torch.zeros(1, dtype=torch.int64)).cpu())
    if not 0 < n <= MAX_MESSAGE_BYTES:
        raise SplitError(f"message of {n} bytes refused (at most {MAX_MESSAGE_BYTES})")
    body = link.recv(torch.empty(n, dtype=torch.uint8)).cpu()
    data = json.loads(bytes(body.numpy()).decode())
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise SplitError("message: expected an object with a kind")
    return data


class SplitClient:
    """Trainer rank 0's end of the :class:`Link`: pushes weights to the rollout process and asks it for rollouts."""

    def __init__(self, link: Link, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.link, self.bucket_bytes = link, bucket_bytes
        self.version = 0

    def push(self, model: Any) -> int:
        """Sends every parameter of ``model`` as the next version; returns it."""
        named = [(n, p.detach()) for n, p in model.named_parameters()]
        plan = plan_buckets(named, self.bucket_bytes, self.version + 1)
        send_message(plan.to_data(), self.link)
        for bucket in pack_buckets(named, plan):
            self.link.broadcast_from_trainer(bucket)
        self.version = plan.version
        return self.version

    def generate(self, request: GenerateRequest) -> GenerateResult:
        send_message(request.to_data(), self.link)
        result = GenerateResult.from_data(recv_message(self.link))
        if result.error:
            raise StaleWeights(f"rollout process: {result.error}")
        return result

    def stop(self) -> None:
        send_message({"kind": "stop"}, self.link)


class RolloutServer:
    """The rollout rank's end: holds the engine and answers :class:`SplitClient` until ``stop``."""

    def __init__(self, engine: Any, model: Any, pad_id: int, link: Link, device: torch.device) -> None:
        self.engine, self.model, self.pad_id, self.link, self.device = engine, model, pad_id, link, device
        self.weights = EngineWeights()

    def receive_push(self, push: WeightPush) -> None:
        self.weights.accept(push)
        buckets = [self.link.broadcast_from_trainer(torch.empty(n, dtype=torch.uint8)).cpu() for n in push.bucket_bytes]
        load = getattr(self.engine, "load_pushed", None)
        if load is not None:  # vLLM: the same tensors go to its workers' load_weights
            load(unpack(buckets, push))
        else:
            unpack_into(self.model, buckets, push)
        self.weights.installed(push)

    def answer(self, request: GenerateRequest) -> GenerateResult:
        from trainer.data import left_pad
        from trainer.rollout import SamplingPlan

        try:
            self.weights.check(request)
        except StaleWeights as exc:
            return GenerateResult((), (), (), self.weights.version, str(exc))
        ids, mask = left_pad([list(p) for p in request.prompts], self.pad_id, None)
        plan = SamplingPlan(request.seed, request.offset, request.total, request.temperature)
        responses, rmask = self.engine.generate(ids.to(self.device), mask.to(self.device), plan)
        lps = getattr(self.engine, "last_logprobs", None)
        logprobs = tuple(tuple(row) for row in lps.tolist()) if lps is not None else ()
        return GenerateResult(
            tuple(tuple(r) for r in responses.tolist()),
            tuple(tuple(r) for r in rmask.tolist()),
            logprobs,
            self.weights.version,
        )

    def serve(self) -> None:
        while True:
            data = recv_message(self.link)
            if data["kind"] == "stop":
                return
            if data["kind"] == "push":
                self.receive_push(WeightPush.from_data(data))
            elif data["kind"] == "generate":
                send_message(self.answer(GenerateRequest.from_data(data)).to_data(), self.link)
            else:
                raise SplitError(f"unknown message kind {data['kind'][:40]!r}")


def rollout_device(devices: Sequence[str]) -> torch.device:
    """The device the rollout process runs on: the CPU for ``["cpu"]``, else its first visible GPU
    (the launcher sets CUDA_VISIBLE_DEVICES to ``rollout.devices``: :func:`visible_devices`)."""
    return torch.device("cpu") if list(devices) == ["cpu"] else torch.device("cuda", 0)


def visible_devices(devices: Sequence[str]) -> str:
    """CUDA_VISIBLE_DEVICES for the rollout process ("" on CPU). Pure."""
    return "" if list(devices) == ["cpu"] else ",".join(str(d) for d in devices)


class SplitVLLMEngine:
    """vLLM in the rollout process: ``vllm.LLM`` with ``rollout.tensor_parallel_size`` on the visible
    (rollout) GPUs, weights from the pushed buckets into every worker's model (``reload_weights``
    through ``collective_rpc``, as :class:`trainer.rollout_vllm.VLLMRollout` syncs), the sampled tokens'
    log-probs kept in ``last_logprobs``. Written for a GPU node; not run here (vLLM is not installed)."""

    def __init__(self, cfg: Any, model_dir: str, stop_ids: Sequence[int], pad_id: int) -> None:
        from transformers import AutoConfig

        from trainer.rollout_vllm import engine_kwargs, import_vllm

        vllm = import_vllm()  # ConfigError naming rollout.engine when vLLM is absent
        if cfg.rollout.tensor_parallel_size > 1:  # TP workers are processes of their own
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
        kwargs = engine_kwargs(cfg, model_dir, model_config, on_cpu=False)
        kwargs["tensor_parallel_size"] = cfg.rollout.tensor_parallel_size
        self.llm, self.cfg, self.stop_ids, self.pad_id = vllm.LLM(**kwargs), cfg, list(stop_ids), pad_id
        self.sampling_params = vllm.SamplingParams
        self.last_logprobs: torch.Tensor | None = None

    def load_pushed(self, tensors: Mapping[str, torch.Tensor]) -> None:
        from trainer.rollout_vllm import WeightSyncError, _reload_from

        named = [(name, t.cuda()) for name, t in tensors.items()]
        missing = [m for result in self.llm.collective_rpc(_reload_from, args=(named,)) for m in result]
        if missing:
            raise WeightSyncError(f"rollout push: {len(missing)} engine parameters not loaded (first: {missing[:3]})")
        self.llm.reset_prefix_cache()  # its keys and values came from the old weights

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, plan: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from trainer.rollout_vllm import pack_outputs, prompt_rows, sampling_params

        roll = self.cfg.rollout
        rows = prompt_rows(prompt_ids, prompt_mask)
        gen = torch.Generator().manual_seed(plan.seed)  # one seed per request, from the step's seed
        seeds = torch.randint(0, 2**31 - 1, (plan.total or len(rows),), generator=gen)[plan.offset :].tolist()
        params = [
            sampling_params(self.sampling_params, roll, self.stop_ids, seed, plan.temperature)
            for seed in seeds[: len(rows)]
        ]
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [
            [step[tok].logprob for step, tok in zip(o.outputs[0].logprobs or [], o.outputs[0].token_ids, strict=True)]
            for o in outputs
        ]
        responses, mask, self.last_logprobs = pack_outputs(
            tokens, logprobs, roll.max_new_tokens, self.pad_id, self.stop_ids
        )
        return responses, mask


def build_engine(
    cfg: Any, model_dir: str, device: torch.device, stop_ids: Sequence[int], pad_id: int
) -> tuple[Any, Any]:
    """(engine, model) for the rollout process: the HF engine on its own copy of the actor, or vLLM
    with ``rollout.tensor_parallel_size`` (no module of ours: the pushes go to its workers)."""
    from trainer.models import load_causal_lm
    from trainer.rollout import HFRollout

    if cfg.rollout.engine == "vllm":
        return SplitVLLMEngine(cfg, model_dir, stop_ids, pad_id), None
    model = load_causal_lm(model_dir, cfg.model.dtype, device).eval().requires_grad_(False)
    return HFRollout(model, cfg.rollout, stop_ids, pad_id, None), model


def rollout_layout(cfg: Any, trainer_device: torch.device, world_size: int) -> Any:
    """Where the engine runs, for ``run.started`` and ``warden_trainer_rollout_layout_info``. Pure."""
    from warden.payloads import RolloutLayout

    if trainer_device.type == "cpu":
        trainer = ("cpu",)
    else:
        trainer = tuple(cfg.run.gpu_uuids) or tuple(str(i) for i in range(world_size))
    roll = cfg.rollout
    if not roll.devices:
        return RolloutLayout("colocated", roll.engine, trainer, trainer, 1)
    tp = roll.tensor_parallel_size if roll.engine == "vllm" else 1
    return RolloutLayout("split", roll.engine, tuple(str(d) for d in roll.devices), trainer, tp)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def join(address: str, device: torch.device, process: Any, timeout_s: float) -> Link:
    """Trainer rank 0's end of the :class:`Link` once the rollout process joined. Never waits on a dead
    one: the process exiting first, or not joining within ``timeout_s``, is a SplitError naming it."""
    import threading
    import time

    made: dict[str, Any] = {}

    def connect() -> None:
        try:
            made["link"] = Link(address, 0, device, timeout_s)
        except Exception as exc:  # the store's own timeout or a refused connection; reported below
            made["error"] = exc

    thread = threading.Thread(target=connect, name="rollout-join", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(0.2)
        if process.poll() is not None and thread.is_alive():
            raise SplitError(f"the rollout process exited with {process.returncode} before joining; its log is above")
        if time.monotonic() > deadline:
            process.kill()
            raise SplitError(f"the rollout process did not join within rollout.join_timeout_s = {timeout_s:g} s")
    if "error" in made:
        process.kill()
        raise SplitError(f"the rollout process did not join: {str(made['error'])[:300]}")
    return made["link"]


class SplitRollout:
    """The trainer's engine for ``rollout.devices`` (the :class:`RolloutEngine` protocol) on every
    trainer rank. Rank 0 starts the rollout process, holds the :class:`Link` to it and pushes the
    actor's weights at start and after every update (``sync_weights``: the ranks' weights are equal
    after each synchronised update); each ``generate`` gathers the ranks' rows to rank 0, which sends
    one request for the whole batch, and broadcasts the answer, of which each rank keeps its rows."""

    def __init__(self, cfg: Any, actor: Any, model_dir: str, stop_ids: Sequence[int], pad_id: int) -> None:
        import torch.distributed as dist

        from trainer.distributed import DistInfo

        self.cfg, self.pad_id = cfg, pad_id
        self.device = next(actor.parameters()).device
        # the trainer's own torchrun group (init_distributed has run), or one process
        self.info = DistInfo(dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else DistInfo()
        self.last_logprobs: torch.Tensor | None = None
        self.process: Any = None
        if self.info.rank == 0:
            self._start(model_dir, stop_ids)
        self.sync_weights(actor)  # the engine never samples from the weights on disk

    def _start(self, model_dir: str, stop_ids: Sequence[int]) -> None:
        import subprocess
        import tempfile

        cfg = self.cfg
        self._dir = tempfile.mkdtemp(prefix="warden-rollout-")
        config_path = os.path.join(self._dir, "config.json")
        with open(config_path, "w", encoding="utf-8") as fh:  # our own child reads it; a private directory
            json.dump({"version": 1, **cfg.to_dict()}, fh)
        address = f"127.0.0.1:{_free_port()}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_devices(cfg.rollout.devices)}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        cmd = [sys.executable, "-m", "trainer.rollout_split", "--model-dir", model_dir, "--config", config_path]
        cmd += ["--store", address, "--trainer-world", str(self.info.world_size), "--pad-id", str(self.pad_id)]
        cmd += ["--stop-ids", ",".join(str(i) for i in stop_ids)]
        self.process = subprocess.Popen(cmd, env=env)
        self.client = SplitClient(join(address, self.device, self.process, self.cfg.rollout.join_timeout_s))

    def sync_weights(self, actor: Any) -> None:
        if self.info.rank == 0:
            self.client.push(actor)

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, plan: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from trainer.distributed import all_gather_rows

        rows = prompt_ids.shape[0]
        seed, offset, total, temperature = (
            (plan.seed, plan.offset, plan.total, plan.temperature) if plan else (0, 0, 0, 1.0)
        )
        whole_ids, whole_mask = all_gather_rows(prompt_ids, self.info), all_gather_rows(prompt_mask, self.info)
        first = offset - self.info.rank * rows  # the batch's row offset of trainer rank 0's first row
        if self.info.rank == 0:
            responses, mask, logprobs = self._ask(whole_ids, whole_mask, seed, first, total, temperature)
        else:
            responses, mask, logprobs = None, None, None
        responses, mask, logprobs = self._share(responses, mask, logprobs, whole_ids.shape[0])
        mine = slice(self.info.rank * rows, (self.info.rank + 1) * rows)
        self.last_logprobs = logprobs[mine] if logprobs is not None else None
        return responses[mine], mask[mine]

    def _ask(
        self, ids: torch.Tensor, mask: torch.Tensor, seed: int, offset: int, total: int, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        from trainer.rollout_vllm import prompt_rows

        prompts = tuple(map(tuple, prompt_rows(ids, mask)))
        request = GenerateRequest(prompts, seed, offset, total, temperature, self.client.version)
        result = self.client.generate(request)
        responses, rmask = result.tensors()
        logprobs = torch.tensor(result.logprobs) if result.logprobs else None
        return responses.to(self.device), rmask.to(self.device), logprobs

    def _share(
        self, responses: Any, mask: Any, logprobs: Any, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rank 0's answer on every trainer rank (a broadcast over the trainer group when ``W > 1``)."""
        if self.info.world_size <= 1:
            return responses, mask, logprobs
        import torch.distributed as dist

        width = self.cfg.rollout.max_new_tokens
        flag = torch.tensor([int(logprobs is not None) if self.info.rank == 0 else 0], device=self.device)
        dist.broadcast(flag, src=0)
        shaped = (rows, width)
        responses = responses if responses is not None else torch.empty(shaped, dtype=torch.long, device=self.device)
        mask = mask if mask is not None else torch.empty(shaped, dtype=torch.long, device=self.device)
        dist.broadcast(responses.contiguous(), src=0)
        dist.broadcast(mask.contiguous(), src=0)
        if not int(flag):
            return responses, mask, None
        logprobs = (logprobs if logprobs is not None else torch.empty(shaped)).to(self.device, torch.float32)
        dist.broadcast(logprobs.contiguous(), src=0)
        return responses, mask, logprobs

    def close(self) -> None:
        import shutil

        if self.process is None:
            return
        self.client.stop()
        if self.process.wait(timeout=120) != 0:
            raise SplitError(f"the rollout process exited with {self.process.returncode}")
        shutil.rmtree(self._dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The rollout process: the :class:`Link`'s rank 1; serves until ``stop``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.rollout_split",
        description="Warden's rollout process (started by the trainer for rollout.devices; not run by hand).",
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--store", required=True, help="HOST:PORT of trainer rank 0's link store")
    parser.add_argument("--trainer-world", type=int, default=1, help="the trainer's world size (batch rules)")
    parser.add_argument("--pad-id", type=int, required=True)
    parser.add_argument("--stop-ids", required=True, help="comma-separated token ids")
    args = parser.parse_args(argv)
    from trainer.config import load_config

    os.environ["WORLD_SIZE"] = str(args.trainer_world)  # the config's batch rules are the trainer world's
    cfg = load_config(args.config)
    device = rollout_device(cfg.rollout.devices)
    stop_ids = [int(x) for x in args.stop_ids.split(",")]
    engine, model = build_engine(cfg, args.model_dir, device, stop_ids, args.pad_id)
    link = Link(args.store, 1, device, cfg.rollout.join_timeout_s)  # after the engine: a failure is seen as an exit
    RolloutServer(engine, model, args.pad_id, link, device).serve()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
