"""Bridges: Warden events from trainers that know nothing about Warden.

``warden bridge verl`` follows an unmodified verl run (its file logger, rollout dumps and
checkpoints) and appends the events the sidecars act on to ``<run-dir>/events.jsonl``.

Modules, pure logic first and I/O at the edges: :mod:`~warden.metric_names` (metric
names -> Prometheus-safe names, the documented table), :mod:`~sidecars.bridge.verl_log`
(tailing the file logger, restart detection), :mod:`~sidecars.bridge.rollouts` (dump
completeness, top-k), :mod:`~warden.layouts` (the tracker, tree
fingerprints), :mod:`~warden.stability`, :mod:`~sidecars.bridge.state` (markers,
reconciliation, the atomic state file), :mod:`~sidecars.bridge.metrics`,
:mod:`~sidecars.bridge.verl` (the pass) and :mod:`~sidecars.bridge.commands` (the CLI).
Importing this package never imports torch or transformers.
"""
