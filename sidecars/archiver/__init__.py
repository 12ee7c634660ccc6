"""The ``archiver`` sidecar and ``warden audit``: signed, hash-chained reward snapshots in S3.

Modules, pure logic first and I/O at the edges:

- :mod:`~sidecars.archiver.record`: canonical JSON records, in-toto statements, the chain hash;
- :mod:`~sidecars.archiver.signing`: DSSE bundles of records and heads, and their verification;
- :mod:`~sidecars.archiver.store`: the :class:`~sidecars.archiver.store.Store` interface, S3 and ``file://``;
- :mod:`~sidecars.archiver.spool`: signed records waiting for the store, as atomic files;
- :mod:`~sidecars.archiver.chain`: each run's chain head, persisted, recoverable from the store;
- :mod:`~sidecars.archiver.uploader`: drains the spool in step order with back-off;
- :mod:`~sidecars.archiver.sidecar`: the :class:`ArchiverSidecar` the runner drives;
- :mod:`~sidecars.archiver.audit` and :mod:`~sidecars.archiver.commands`: ``warden audit``.
"""
