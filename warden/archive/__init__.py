"""Signed, hash-chained reward snapshots in a store: the library the ``archiver`` sidecar and
``warden audit`` share.

Modules, pure logic first and I/O at the edges:

- :mod:`~warden.archive.record`: canonical JSON records, in-toto statements, the chain hash;
- :mod:`~warden.archive.signing`: DSSE bundles of records and heads, and their verification;
- :mod:`~warden.archive.store`: the :class:`~warden.archive.store.Store` interface, S3 and ``file://``;
- :mod:`~warden.archive.spool`: signed records waiting for the store, as atomic files;
- :mod:`~warden.archive.chain`: each run's chain head, persisted, recoverable from the store;
- :mod:`~warden.archive.uploader`: drains the spool in step order with back-off;
- :mod:`~warden.archive.service`: the :class:`~warden.archive.service.Archiver`: what each event does;
- what ``warden audit`` checks: :mod:`~warden.archive.lookup` (one step, the list of steps),
  :mod:`~warden.archive.verify` (the whole run), :mod:`~warden.archive.anchor` (the journal as
  the witness of what was emitted), over :mod:`~warden.archive.findings` (kinds of breaks, head reads);
- :mod:`~warden.archive.policy` (policies/archiver.yaml schema), :mod:`~warden.archive.errors`,
  :mod:`~warden.archive.instruments` (the metrics the library updates, as protocols).

Nothing here imports ``sidecars`` or the trainer; importing this package never imports torch.
"""
