"""The tokenscan corpus fixtures (``tests.warden.tokenscan.corpus``, shared with the sidecar tests)."""

from tests.warden.tokenscan.corpus import (  # noqa: F401 - fixtures and the malicious_case hook
    fresh_benign,
    pytest_generate_tests,
    tokenscan_corpus,
    tokenscan_policy,
)
