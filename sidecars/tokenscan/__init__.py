"""The ``tokenscan`` sidecar: ``sidecar`` (watches tokenizer directories, rescans on change),
``metrics``, ``watch`` and ``commands`` (``warden scan tokenizer``). The scanner library itself
(checks, sniffing, pickle analysis, sandboxed template and tokenizer runs, reports) is
:mod:`warden.tokenscan`, shared with the trainer's tokenizer guard."""
