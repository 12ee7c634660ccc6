"""Two runs compared step by step (issue 22): the library ``warden compare`` and the ``shadow``
sidecar share.

``align`` turns journal events into per-step series (pure), ``compare`` judges them against
the policy's tolerances and a two-sample Kolmogorov-Smirnov test of the reward snapshots (pure),
``journals`` reads the journals (the I/O edge), ``report`` renders text and JSON, ``plot`` the PNG;
``policy`` is the schema of policies/shadow.yaml, ``errors`` the exit-code bases. scipy and
matplotlib (the ``shadow`` extra) are imported only when a KS test or a plot needs them.
"""
