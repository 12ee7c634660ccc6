"""The ``shadow`` sidecar and ``warden compare``: two runs compared step by step (issue 22).

``align`` turns journal events into per-step series (pure), ``compare`` judges them against
the policy's tolerances and a two-sample Kolmogorov-Smirnov test of the reward snapshots (pure),
``journals`` reads the journals (the I/O edge), ``report`` renders text and JSON, ``plot`` the PNG.
"""
