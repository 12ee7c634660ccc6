"""The ``archiver`` sidecar and ``warden audit``: ``sidecar`` (the :class:`ArchiverSidecar` the
runner drives), ``commands`` (``warden audit``) and ``metrics`` (``warden_archiver_*``). The
library itself (records, signing, store, spool, chain, uploader, audit) is :mod:`warden.archive`.
"""
