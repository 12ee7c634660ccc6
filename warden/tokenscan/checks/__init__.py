"""The checks, one small pure function each: ``check(snapshot, policy) -> list[Finding]``.

:data:`CHECKS` is the one table the scanner runs, in order. A check never reads files: the
scanner has put everything it may need into the :class:`~warden.tokenscan.snapshot.Snapshot`.
"""

from __future__ import annotations

from collections.abc import Callable

from warden.tokenscan.checks.automap import check_auto_map
from warden.tokenscan.checks.behaviour import check_tokenizer_behaviour
from warden.tokenscan.checks.classes import check_model_type, check_tokenizer_class
from warden.tokenscan.checks.content import check_content
from warden.tokenscan.checks.files import check_files
from warden.tokenscan.checks.keys import check_dangerous_keys
from warden.tokenscan.checks.links import check_links
from warden.tokenscan.checks.pathkeys import check_path_keys
from warden.tokenscan.checks.pinned import check_pinned_directory, check_pinned_token_ids
from warden.tokenscan.checks.pipeline import check_generation_config, check_loader_files, check_pipeline
from warden.tokenscan.checks.special_tokens import check_special_tokens
from warden.tokenscan.checks.templates import check_chat_templates
from warden.tokenscan.findings import Finding
from warden.tokenscan.policy import TokenscanPolicy
from warden.tokenscan.snapshot import Snapshot

Check = Callable[[Snapshot, TokenscanPolicy], list[Finding]]

CHECKS: tuple[tuple[str, Check], ...] = (
    ("auto_map", check_auto_map),
    ("files", check_files),
    ("tokenizer_class", check_tokenizer_class),
    ("model_type", check_model_type),
    ("path_keys", check_path_keys),
    ("links", check_links),
    ("dangerous_keys", check_dangerous_keys),
    ("chat_templates", check_chat_templates),
    ("content", check_content),
    ("special_tokens", check_special_tokens),
    ("tokenizer_behaviour", check_tokenizer_behaviour),
    ("pipeline", check_pipeline),
    ("generation_config", check_generation_config),
    ("loader_files", check_loader_files),
    ("pinned_directory", check_pinned_directory),
    ("pinned_token_ids", check_pinned_token_ids),
)
