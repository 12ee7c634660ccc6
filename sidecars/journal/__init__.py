"""The ``journal`` sidecar: follows the event journal, indexes it and exports its health."""
