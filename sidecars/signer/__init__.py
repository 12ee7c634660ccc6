"""The ``signer`` sidecar: signs announced checkpoints and audits the checkpoint roots.

A thin adapter: ``sidecar`` wires the services of :mod:`warden.signer` to the runtime,
``metrics`` registers the ``warden_signer_*`` families and ``commands`` holds the ``keys``
and ``checkpoint`` click groups. The signing library itself (hashing -> manifest -> DSSE
bundle, verification, keys) is :mod:`warden.signing`, in the neutral core, so that the
trainer, the archiver and the bridge use it without importing this sidecar.
"""
