"""Checkpoint signing: hashing -> manifest -> DSSE/Sigstore bundle, and verification.

Layers import only downwards: :mod:`.hashing` (files -> digests) <- :mod:`.manifest`
(digests -> model_signing manifest and in-toto Statement) <- :mod:`.dsse` (Statement ->
signed bundle beside the checkpoint) <- :mod:`.verify`; :mod:`.keys` stands alone and
:mod:`.commands` holds the click groups. Importing this package never imports torch.

The API other parts of Warden call::

    key = load_private_key("keys/signing.key")                 # refuses mode & 0o077
    res = sign_checkpoint("run/checkpoints/step-000000050", key,
                          Provenance(run_id="r", step=50, parent_root_digest=prev))
    trusted = load_trusted_keys("policies/keys")
    result = verify_checkpoint("run/checkpoints/step-000000050", trusted)
    result.ok, result.report(), result.raise_for_problems()
"""

from warden.signing.dsse import SignResult, sign_checkpoint, signature_path_for
from warden.signing.errors import (
    CheckpointChanged,
    CheckpointUnreadable,
    CheckpointVanished,
    HashingCancelled,
    SignatureMissing,
    SignerError,
    UnsafePathError,
    UnsupportedSignature,
    VerificationFailed,
)
from warden.signing.keys import (
    TrustedKeys,
    generate_keypair,
    key_id,
    load_private_key,
    load_trusted_keys,
    trusted_keys_from,
)
from warden.signing.manifest import Provenance
from warden.signing.verify import VerifyResult, read_signed_statement, verify_checkpoint

__all__ = [
    "CheckpointChanged",
    "CheckpointUnreadable",
    "CheckpointVanished",
    "HashingCancelled",
    "Provenance",
    "SignResult",
    "SignatureMissing",
    "SignerError",
    "TrustedKeys",
    "UnsafePathError",
    "UnsupportedSignature",
    "VerificationFailed",
    "VerifyResult",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_trusted_keys",
    "read_signed_statement",
    "sign_checkpoint",
    "signature_path_for",
    "trusted_keys_from",
    "verify_checkpoint",
]
