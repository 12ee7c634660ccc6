"""The ``signer`` sidecar: signs announced checkpoints and audits the checkpoint roots.

The signing library itself (hashing -> manifest -> DSSE bundle, verification, keys) is
:mod:`warden.signing`, in the neutral core, so that the trainer, the archiver and the
bridge use it without importing this sidecar.
"""
