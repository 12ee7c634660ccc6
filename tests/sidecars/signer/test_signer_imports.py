"""The signer sidecar, its commands and the signing library import no torch."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_signer_does_not_import_torch() -> None:
    code = (
        "import sys, sidecars.signer, sidecars.signer.commands, warden.signing.verify;"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
