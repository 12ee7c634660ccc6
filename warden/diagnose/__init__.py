"""``warden diagnose``: why the rollout is slow now, from a run's journal and ``/metrics``.

:mod:`warden.diagnose.causes` holds the one table of causes (pure); :mod:`warden.diagnose.facts`
reads the facts (I/O).
"""
