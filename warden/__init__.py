"""Warden's neutral core: what the trainer and every sidecar share.

Nothing here imports ``trainer`` or ``sidecars``; both import from here (tests/test_architecture.py).
"""

__version__ = "0.1.0"  # the one version source (pyproject reads it)
