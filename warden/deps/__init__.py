"""Python environment audit against a lock: the library the ``deps`` sidecar and ``warden deps`` share.

Checks: lock hygiene, drift (installed vs lock), installed-file integrity (RECORD re-hash,
unowned files, ``.pth`` allow-list, ``.pyc`` vs fresh compile, approved baseline) and known
vulnerabilities from an offline OSV database. One module per concern; ``audit.py`` ties them.
Importing this package never imports torch.
"""
