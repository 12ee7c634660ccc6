"""Warden for trainers that are not Warden's own: HF Trainer / TRL callbacks.

Import-light on purpose: importing this package imports nothing heavy. The callback lives
in :mod:`trainer.integrations.hf` (it needs ``transformers``) and is also reachable as
``trainer.integrations.WardenCallback``, imported on first use. verl needs no code
change at all: ``warden bridge verl`` (:mod:`sidecars.bridge`) follows what it writes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WardenCallback"]


def __getattr__(name: str) -> Any:
    if name == "WardenCallback":
        from trainer.integrations.hf import WardenCallback

        return WardenCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
