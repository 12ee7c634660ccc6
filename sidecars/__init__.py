"""Warden sidecars: the runtime they share, the ``warden`` CLI root, one subpackage each.

Importing anything here must never import torch or transformers.
"""

from warden import __version__ as __version__  # the one source is warden/__init__.py
