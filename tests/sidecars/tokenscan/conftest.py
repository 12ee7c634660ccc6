"""The tokenscan corpus fixtures, shared with the library tests (``tests.warden.tokenscan.corpus``)."""

from tests.warden.tokenscan.corpus import (  # noqa: F401 - fixtures and the malicious_case hook
    fresh_benign,
    pytest_generate_tests,
    tokenscan_corpus,
    tokenscan_policy,
)
