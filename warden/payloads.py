"""Typed payloads of the journal events other processes act on (docs/design.md section 2).

One frozen dataclass per event type: producers build it and emit ``to_data()``; consumers call
``from_data(event.data)``, which validates every field a consumer acts on and raises
:class:`PayloadError` naming the field. Fields no consumer acts on (the trainer's config, versions,
elastic-restart figures, ...) travel in ``extra``: kept as they are, merged flat into the event
data, so the journal's JSON is unchanged. Unknown fields are kept in ``extra`` too (readers are
forward compatible).

Built on ``warden.journal`` and the signing layer's ``Announced``; the trainer, the integrations,
the bridge and every sidecar import it.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from warden.journal import (
    CHECKPOINT_PRUNED,
    CHECKPOINT_REJECTED,
    CHECKPOINT_SAVED,
    CHECKPOINT_SKIPPED,
    REWARD_SNAPSHOT,
    RUN_RESUMED,
    RUN_STARTED,
)
from warden.runid import valid_genesis_nonce
from warden.signing.manifest import Announced

_HEX = frozenset("0123456789abcdef")
_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


class PayloadError(ValueError):
    """An event's data does not match its payload type; the message names the field."""


def is_hex_digest(value: object) -> bool:
    """True for a lowercase 64-digit hex string (a SHA-256 digest)."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _field_error(name: str, expected: str, value: object) -> PayloadError:
    shown = repr(value)
    return PayloadError(f"data.{name}: expected {expected}, got {shown[:80]}")


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None or isinstance(value, str):
        return value
    raise _field_error(name, "a string", value)


def _opt_int(data: Mapping[str, Any], name: str, minimum: int = 0) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _field_error(name, f"an integer >= {minimum}", value)
    return value


def _opt_number(data: Mapping[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _field_error(name, "a finite number", value)
    return float(value)


def _opt_mapping(data: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    value = data.get(name)
    if value is None or isinstance(value, Mapping):
        return value
    raise _field_error(name, "an object", value)


def _opt_nonce(data: Mapping[str, Any]) -> str | None:
    value = data.get("genesis_nonce")
    if value is None or valid_genesis_nonce(value):
        return value
    raise _field_error("genesis_nonce", "32 lowercase hex digits", value)


class _Payload:
    """``to_data``/``from_data`` shared by the payload dataclasses: typed fields plus ``extra``."""

    TYPE: ClassVar[str]
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset()
    extra: Mapping[str, Any]

    def to_data(self) -> dict[str, Any]:
        """The event's ``data``: ``extra`` merged flat, then every field that is not None (or is in
        ``KEEP_NONE``, written as null); tuples as lists."""
        data: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name not in self.KEEP_NONE):
                continue
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def _extra(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return types.MappingProxyType({k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True)
class CheckpointSaved(_Payload):
    """``checkpoint.saved``: a complete checkpoint directory, with what its bytes hash to.

    ``root_digest``/``file_count`` come together or not at all; ``complete: false`` (an HF rank's
    files never came) is announced so the signer can say why it does not sign from the event.
    """

    TYPE: ClassVar[str] = CHECKPOINT_SAVED
    path: str
    root: str | None = None
    root_digest: str | None = None
    file_count: int | None = None
    source: str | None = None
    layout: str | None = None
    complete: bool | None = None
    waiting_for: tuple[str, ...] | None = None
    world_size: int | None = None
    trainer_version: str | None = None
    serialization: str | None = None
    """``shards`` when the digest is in model_signing's shard serialization (with ``shard_size``);
    None (or ``files``): the per-file sha256 serialization."""
    shard_size: int | None = None
    names_digest: str | None = None
    """Binds the announcement to the file names (``warden.signing.manifest.names_digest``)."""
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self) -> None:
        if self.names_digest is not None and not is_hex_digest(self.names_digest):
            raise PayloadError("data.names_digest is not a lowercase sha256 hex digest")
        if (self.root_digest is None) != (self.file_count is None):
            raise PayloadError("data.root_digest and data.file_count come together or not at all")
        if self.serialization not in (None, "files", "shards"):
            raise PayloadError(f"data.serialization: expected files or shards, got {str(self.serialization)[:40]!r}")
        if (self.serialization == "shards") != (self.shard_size is not None):
            raise PayloadError("data.shard_size comes with serialization shards, and only with it")

    @property
    def announced(self) -> Announced | None:
        if self.root_digest is None or self.file_count is None:
            return None
        return Announced(self.root_digest, self.file_count, self.shard_size, self.names_digest)

    def with_announced(self, announced: Announced | None) -> CheckpointSaved:
        if announced is None:
            return dataclasses.replace(
                self, root_digest=None, file_count=None, serialization=None, shard_size=None, names_digest=None
            )
        sharded = announced.shard_size is not None
        return dataclasses.replace(
            self,
            root_digest=announced.root_digest,
            file_count=announced.file_count,
            serialization="shards" if sharded else None,
            shard_size=announced.shard_size,
            names_digest=announced.names_digest,
        )

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CheckpointSaved:
        path = data.get("path")
        if not isinstance(path, str) or not path:
            raise _field_error("path", "a non-empty string", path)
        digest = data.get("root_digest")
        if digest is not None and not is_hex_digest(digest):
            raise PayloadError("data.root_digest is not a lowercase sha256 hex digest")
        try:
            count = _opt_int(data, "file_count")
        except PayloadError:
            raise PayloadError("data.file_count is not a non-negative integer") from None
        complete = data.get("complete")
        if complete is not None and not isinstance(complete, bool):
            raise _field_error("complete", "true or false", complete)
        waiting = data.get("waiting_for")
        if waiting is not None and not (isinstance(waiting, list) and all(isinstance(w, str) for w in waiting)):
            raise _field_error("waiting_for", "a list of strings", waiting)
        return cls(
            path=path,
            root=_opt_str(data, "root"),
            root_digest=digest,
            file_count=count,
            source=_opt_str(data, "source"),
            layout=_opt_str(data, "layout"),
            complete=complete,
            waiting_for=tuple(waiting) if waiting is not None else None,
            world_size=_opt_int(data, "world_size", 1),
            trainer_version=_opt_str(data, "trainer_version"),
            serialization=_opt_str(data, "serialization"),
            shard_size=_opt_int(data, "shard_size", 1),
            names_digest=_opt_str(data, "names_digest"),
            extra=cls._extra(data),
        )


@dataclass(frozen=True)
class CheckpointPruned(_Payload):
    """``checkpoint.pruned``: a checkpoint retention removes (or, for libraries that rotate on their
    own, removed), with the digest it was announced with; announced before the removal when the
    remover is Warden's trainer."""

    TYPE: ClassVar[str] = CHECKPOINT_PRUNED
    path: str
    step: int
    reason: str
    root_digest: str | None = None
    source: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CheckpointPruned:
        path, reason = data.get("path"), data.get("reason")
        if not isinstance(path, str) or not path:
            raise _field_error("path", "a non-empty string", path)
        if not isinstance(reason, str) or not reason:
            raise _field_error("reason", "a non-empty string", reason)
        step = _opt_int(data, "step")
        if step is None:
            raise _field_error("step", "an integer >= 0", None)
        digest = data.get("root_digest")
        if digest is not None and not is_hex_digest(digest):
            raise _field_error("root_digest", "a lowercase sha256 hex digest", digest)
        return cls(path, step, reason, digest, _opt_str(data, "source"), cls._extra(data))


def _required_str(data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise _field_error(name, "a non-empty string", value)
    return value


@dataclass(frozen=True)
class CheckpointRejection(_Payload):
    """``checkpoint.rejected``: a checkpoint a resume refused, or a save that failed after its
    retries (then with the bytes it needed, the free bytes and the errno behind the failure)."""

    TYPE: ClassVar[str] = CHECKPOINT_REJECTED
    path: str
    why: str
    needed_bytes: int | None = None
    free_bytes: int | None = None
    errno: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CheckpointRejection:
        return cls(
            _required_str(data, "path"),
            _required_str(data, "why"),
            _opt_int(data, "needed_bytes"),
            _opt_int(data, "free_bytes"),
            _opt_str(data, "errno"),
            cls._extra(data),
        )


@dataclass(frozen=True)
class CheckpointSkipped(_Payload):
    """``checkpoint.skipped``: a save not made because it would not fit (``checkpoint.on_no_space``)."""

    TYPE: ClassVar[str] = CHECKPOINT_SKIPPED
    path: str
    reason: str
    needed_bytes: int
    free_bytes: int
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CheckpointSkipped:
        needed, free = _opt_int(data, "needed_bytes"), _opt_int(data, "free_bytes")
        if needed is None or free is None:
            raise _field_error("needed_bytes" if needed is None else "free_bytes", "an integer >= 0", None)
        return cls(_required_str(data, "path"), _required_str(data, "reason"), needed, free, cls._extra(data))


@dataclass(frozen=True)
class RunStarted(_Payload):
    """``run.started``: a new run (its config digest is the archive chain's genesis input)."""

    TYPE: ClassVar[str] = RUN_STARTED
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset({"model_path", "tokenizer_path", "world_size"})
    config_digest: str | None = None
    model_path: str | None = None
    tokenizer_path: str | None = None
    world_size: int | None = None
    versions: Mapping[str, Any] | None = None
    source: str | None = None
    genesis_nonce: str | None = None
    rollout_layout: RolloutLayout | None = None  # where the rollout engine runs (issue 34)
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def to_data(self) -> dict[str, Any]:
        data = super().to_data()
        if self.rollout_layout is not None:
            data["rollout_layout"] = self.rollout_layout.to_data()
        return data

    @property
    def warden_version(self) -> str | None:
        value = (self.versions or {}).get("warden")
        return value if isinstance(value, str) else None

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> RunStarted:
        digest = _opt_str(data, "config_digest")
        return cls(
            config_digest=digest or None,
            model_path=_opt_str(data, "model_path"),
            tokenizer_path=_opt_str(data, "tokenizer_path"),
            world_size=_opt_int(data, "world_size", 1),
            versions=_opt_mapping(data, "versions"),
            source=_opt_str(data, "source"),
            genesis_nonce=_opt_nonce(data),
            rollout_layout=RolloutLayout.from_data(data["rollout_layout"]) if "rollout_layout" in data else None,
            extra=cls._extra(data),
        )


ROLLOUT_MODES = ("colocated", "split")


@dataclass(frozen=True)
class RolloutLayout:
    """``run.started``'s ``rollout_layout``: colocated (the engine on the trainer's devices) or split
    (its own process on ``rollout_devices``), the engine and its tensor-parallel size."""

    mode: str
    engine: str
    rollout_devices: tuple[str, ...]
    trainer_devices: tuple[str, ...]
    tensor_parallel_size: int = 1

    def to_data(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "engine": self.engine,
            "rollout_devices": list(self.rollout_devices),
            "trainer_devices": list(self.trainer_devices),
            "tensor_parallel_size": self.tensor_parallel_size,
        }

    @classmethod
    def from_data(cls, data: Any) -> RolloutLayout:
        if not isinstance(data, Mapping):
            raise _field_error("rollout_layout", "an object", data)
        mode = _required_str(data, "mode")
        if mode not in ROLLOUT_MODES:
            raise _field_error("rollout_layout.mode", "colocated or split", mode)
        lists = {}
        for name in ("rollout_devices", "trainer_devices"):
            value = data.get(name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _field_error(f"rollout_layout.{name}", "a list of strings", value)
            lists[name] = tuple(value)
        tp = _opt_int(data, "tensor_parallel_size", 1)
        return cls(mode, _required_str(data, "engine"), lists["rollout_devices"], lists["trainer_devices"], tp or 1)


@dataclass(frozen=True)
class RunResumed(_Payload):
    """``run.resumed``: a run continues from ``checkpoint`` at ``from_step`` (None: a bridge that
    saw its trainer restart without knowing where it went on from)."""

    TYPE: ClassVar[str] = RUN_RESUMED
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset({"from_step", "checkpoint"})
    from_step: int | None
    checkpoint: str | None = None
    verification: str | None = None
    config_digest: str | None = None
    source: str | None = None
    genesis_nonce: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> RunResumed:
        return cls(
            from_step=_opt_int(data, "from_step"),
            checkpoint=_opt_str(data, "checkpoint"),
            verification=_opt_str(data, "verification"),
            config_digest=_opt_str(data, "config_digest"),
            source=_opt_str(data, "source"),
            genesis_nonce=_opt_nonce(data),
            extra=cls._extra(data),
        )


def top_samples(
    prompts: Sequence[str],
    responses: Sequence[str],
    rewards: Sequence[float],
    top_k: int,
    min_reward: float | None = None,
    max_text_chars: int = 4000,
) -> list[dict[str, Any]]:
    """The samples a ``reward.snapshot`` keeps (Warden's trainer and the HF callback): the best
    ``top_k`` by reward, ties in recorded order, texts cut to ``max_text_chars``.

    Non-finite rewards are left out (the archiver drops them anyway); ``index`` is the
    sample's position in the step's samples.
    """
    if top_k <= 0:
        return []
    order = sorted(
        (i for i in range(len(rewards)) if math.isfinite(rewards[i])),
        key=lambda i: (-rewards[i], i),
    )
    cap = max_text_chars
    return [
        {
            "index": i,
            "prompt": prompts[i][:cap],
            "response": responses[i][:cap],
            "reward": float(rewards[i]),
            "truncated": len(prompts[i]) > cap or len(responses[i]) > cap,
        }
        for i in order
        if min_reward is None or rewards[i] >= min_reward
    ][:top_k]


@dataclass(frozen=True)
class RewardSnapshot(_Payload):
    """``reward.snapshot``: the step's best samples. Each sample is kept as it came and judged by
    the archiver one by one (a malformed sample is a note in the record, not a lost snapshot);
    here only the envelope is typed."""

    TYPE: ClassVar[str] = REWARD_SNAPSHOT
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset({"min_reward"})
    samples: tuple[Mapping[str, Any], ...] | None = None
    k: int | None = None
    min_reward: float | None = None
    source: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> RewardSnapshot:
        samples = data.get("samples")
        if samples is not None and not isinstance(samples, list):
            raise _field_error("samples", "a list", samples)
        return cls(
            samples=tuple(samples) if samples is not None else None,
            k=_opt_int(data, "k"),
            min_reward=_opt_number(data, "min_reward"),
            source=_opt_str(data, "source"),
            extra=cls._extra(data),
        )
