"""The signer sidecar in process: races made deterministic by wrapping the library call."""

from __future__ import annotations

import os

import warden.signer.operations as signer_operations
from sidecars.runner import Runner
from sidecars.runtime import Outcome, SidecarContext
from sidecars.signer.sidecar import SignerSidecar
from warden.policy import policy_from_mapping
from warden.signer.policy import SignerPolicy

REAL_SIGN = signer_operations.sign_checkpoint


def _sidecar(signer_kit, tmp_path, **fields: object) -> tuple[SignerSidecar, SidecarContext]:
    policy = policy_from_mapping(
        {"version": 1, "signing_key": str(signer_kit.key), "stable_seconds": 0, **fields}, SignerPolicy
    )
    ctx = SidecarContext(
        name="signer", state_dir=str(tmp_path / "state"), run_dir=str(signer_kit.run_dir), policy=policy
    )
    return SignerSidecar(ctx, use_watchdog=False), ctx


def test_a_signature_written_as_the_directory_vanished_is_removed(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    path = kit.save_checkpoint(2)

    def sign_then_prune(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = REAL_SIGN(*args, **kwargs)
        kit.announce_pruned(path)  # retention, after the last file was read
        os.rename(path, path.parent / ".del-step-000000002")
        return result

    monkeypatch.setattr(signer_operations, "sign_checkpoint", sign_then_prune)
    sidecar, ctx = _sidecar(kit, tmp_path)
    assert Runner(sidecar).run_once() is Outcome.OK
    assert kit.signatures(kit.checkpoints) == []
    assert ctx.registry.get_sample_value("warden_signer_errors_total", {"kind": "checkpoint_vanished"}) == 1
    assert ctx.registry.get_sample_value("warden_signer_signed_total", {"layout": "warden"}) == 0
    assert ctx.registry.get_sample_value("warden_sidecar_events_processed_total", {"sidecar": "signer"}) == 1


def test_an_hf_checkpoint_changed_while_signed_is_signed_again_later(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    root = tmp_path / "hf"
    directory = kit.write_hf(root, 7)
    calls = []

    def sign_while_writing(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = REAL_SIGN(*args, **kwargs)
        if not calls:
            with open(directory / "optimizer.pt", "ab") as fh:
                fh.write(b"late bytes")
        calls.append(1)
        return result

    monkeypatch.setattr(signer_operations, "sign_checkpoint", sign_while_writing)
    sidecar, ctx = _sidecar(kit, tmp_path, watch=[{"path": str(root), "layout": "hf"}])
    assert sidecar.check() is Outcome.OK
    assert kit.signatures(root) == []
    assert ctx.registry.get_sample_value("warden_signer_errors_total", {"kind": "checkpoint_changed"}) == 1
    assert ctx.registry.get_sample_value("warden_signer_unsigned_checkpoints") == 1
    assert sidecar.check() is Outcome.OK
    assert [p.name for p in kit.signatures(root)] == ["checkpoint-7.sig"]
    assert kit.verify(directory)
    assert ctx.registry.get_sample_value("warden_signer_unsigned_checkpoint_age_seconds") == 0
    sidecar.close()


def test_cancel_during_hashing_keeps_the_event_for_later(signer_kit, tmp_path, monkeypatch):
    kit = signer_kit
    kit.save_checkpoint(2, {"big.bin": 8 << 20, "trainer_state.json": 0})

    def stop_midway(*args, **kwargs):  # type: ignore[no-untyped-def]
        progress = kwargs["progress"]

        def and_stop(done: int, total: int) -> None:
            progress(done, total)
            kwargs["cancel"].set()

        return REAL_SIGN(*args, **{**kwargs, "progress": and_stop})

    monkeypatch.setattr(signer_operations, "sign_checkpoint", stop_midway)
    sidecar, ctx = _sidecar(kit, tmp_path, hash_workers=1)
    runner = Runner(sidecar)
    assert runner.run_once() is Outcome.INCOMPLETE
    assert runner.cursor_store.load().seq == 0
    assert kit.signatures(kit.checkpoints) == []
    assert 0 < ctx.registry.get_sample_value("warden_signer_hashed_bytes_total", {"operation": "sign"}) < 8 << 20
