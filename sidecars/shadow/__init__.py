"""The ``shadow`` sidecar: ``sidecar`` (the :class:`ShadowSidecar`, following a baseline and a
candidate journal) and ``metrics`` (``warden_shadow_*``). The comparison itself, which
``warden compare`` (sidecars/commands/compare.py) uses too, is :mod:`warden.shadow`.
"""
