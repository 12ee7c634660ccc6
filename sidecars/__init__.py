"""Warden sidecars: the runtime they share, the ``warden`` CLI root, one subpackage each.

Importing anything here must never import torch or transformers.
"""

__version__ = "0.1.0"
