"""Click command groups of the ``warden`` CLI that belong to no single sidecar."""
