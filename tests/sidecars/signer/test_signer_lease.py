"""The signer's lease check sits right before the ``.sig`` write (multi-node, warden/lease.py).

A signer that held the run's lease when it started hashing, and finds the lease file naming another
holder when the signature is ready, writes nothing, pages (``stolen``) and leaves the event to be
handled again (RetryLater): by then it stands by, so the holder signs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecars.runtime import RetryLater, SidecarContext
from sidecars.signer.sidecar import SignerSidecar
from warden.journal import JournalReader
from warden.lease import LeaseFile, LeaseRecord, LeaseSettings
from warden.signer.policy import SignerPolicy

LEASE = LeaseSettings(
    enabled=True, duration_seconds=60.0, renew_seconds=20.0, max_clock_skew_seconds=1.0, act_margin_seconds=1.0
)


def test_a_lease_taken_while_hashing_stops_the_sig_write_and_pages(signer_kit, tmp_path):
    kit = signer_kit
    policy = SignerPolicy(signing_key=str(kit.key), stable_seconds=0.5, reverify_interval_seconds=0, lease=LEASE)
    ctx = SidecarContext(name="signer", state_dir=str(tmp_path / "state"), run_dir=str(kit.run_dir), policy=policy)
    sidecar = SignerSidecar(ctx, use_watchdog=False)
    try:
        assert sidecar.lease is not None and sidecar.lease.held() == 1
        first = kit.save_checkpoint(2)
        second = kit.save_checkpoint(4)
        events = [e for e, _ in JournalReader(str(kit.run_dir / "events.jsonl")).read_available()]
        assert sidecar.handle(events[0]).name == "OK"
        assert kit.verify(first)

        # another node takes the lease as this one starts hashing (after its own view said it held
        # the lease): only the look at the lease file right before the write can stop it
        real_hash = sidecar.state.metrics.progress

        def progress(operation: str):  # type: ignore[no-untyped-def]
            io = LeaseFile(str(kit.run_dir), "signer")
            record = io.read().record
            assert record is not None
            io.write(LeaseRecord("signer", "intruder:1", record.token + 1, record.acquired_at, record.expires_at))
            return real_hash(operation)

        sidecar.state.metrics.progress = progress  # type: ignore[method-assign]
        with pytest.raises(RetryLater, match="not holding the run's lease"):
            sidecar.handle(events[1])
        assert not Path(f"{second}.sig").exists()
        assert ctx.registry.get_sample_value("warden_signer_lease_alarms_total", {"reason": "stolen"}) == 1
        assert sidecar.lease.held() is None
        sidecar.state.metrics.progress = real_hash  # type: ignore[method-assign]
        assert sidecar.handle(events[1]).name == "OK"  # retried: standing by now, nothing written
        assert not Path(f"{second}.sig").exists()
    finally:
        sidecar.close()
