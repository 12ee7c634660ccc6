"""The ``paths`` sidecar: ``metrics`` (warden_path_*), ``sidecar`` (the Sidecar) and ``commands``
(``warden paths check``). The probe library itself is :mod:`warden.paths`."""
