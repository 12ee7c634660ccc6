"""The ``deps`` sidecar: ``metrics`` (warden_deps_*), ``sidecar`` (the Sidecar) and ``commands``
(``warden deps``). The audit library itself is :mod:`warden.deps`."""
