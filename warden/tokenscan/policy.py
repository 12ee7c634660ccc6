"""Schema of ``policies/tokenscan.yaml`` (frozen dataclasses; defaults = the shipped policy).

Loaded with :func:`warden.policy.load_policy`; a bad value raises PolicyError naming the
file and key. :func:`default_policy` is the same policy without a file (the trainer's
guard uses it when it is given no policy). Sizes take bytes or a unit (``64MiB``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from warden.errors import ConfigError
from warden.policy import load_policy
from warden.tokenscan.findings import Severity

DEFAULT_TOKENIZER_CLASSES = (
    "LlamaTokenizer",
    "LlamaTokenizerFast",
    "Qwen2Tokenizer",
    "Qwen2TokenizerFast",
    "GemmaTokenizer",
    "GemmaTokenizerFast",
    "PreTrainedTokenizerFast",
    "TokenizersBackend",
    "BertTokenizer",
    "BertTokenizerFast",
    "T5Tokenizer",
    "T5TokenizerFast",
)
DEFAULT_MODEL_TYPES = (
    "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "mistral", "mixtral", "phi", "phi3",
    "gpt2", "bert", "t5",
)  # fmt: skip
DEFAULT_EXTENSIONS = (".json", ".txt", ".model", ".jinja", ".safetensors", ".md", ".tiktoken", ".vocab")
DEFAULT_FILE_NAMES = (".gitattributes", ".gitignore", "LICENSE", "NOTICE", "README", "COPYING")
DEFAULT_PRIVATE_KEYS = ("_from_model_config", "_name_or_path", "_commit_hash", "__type", "_attn_implementation_autoset")
DEFAULT_MAX_BYTES: dict[str, Any] = {
    ".json": "64MiB",
    ".txt": "64MiB",
    ".model": "64MiB",
    ".vocab": "64MiB",
    ".tiktoken": "64MiB",
    ".jinja": "256KiB",
    ".md": "4MiB",
}
# What unpickling a torch/numpy state dict needs; everything else imported by a pickle is a finding.
DEFAULT_SAFE_PICKLE_GLOBALS = (
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch.serialization._get_layout",
    "torch.*Storage",
    "torch.storage.UntypedStorage",
    "torch.Size",
    "torch.device",
    "torch.float16",
    "torch.bfloat16",
    "torch.float32",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.core.numeric._frombuffer",
    "numpy._core.numeric._frombuffer",
    "numpy.ndarray",
    "numpy.dtype",
    "_codecs.encode",
    "builtins.set",
    "builtins.frozenset",
    "builtins.slice",
    "builtins.complex",
    "builtins.bytearray",
)

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*\Z", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
_UNITS |= {"KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


def parse_size(value: Any, key: str) -> int:
    """``1048576``, ``"1MiB"``, ``"500KB"`` -> bytes; raises ValueError naming ``key``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{key}: expected bytes or a size like '64MiB', got {value!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])


@dataclass(frozen=True)
class ChatTemplatePolicy:
    """Chat templates: pinned (reviewed) SHA-256 digests pass every template check; the rest
    are analysed statically and rendered in a sandboxed child process with these bounds."""

    approved_sha256: tuple[str, ...] = ()
    render_timeout_seconds: float = 2.0
    max_output_bytes: Any = "1MiB"
    memory_limit_bytes: Any = "1GiB"
    max_loop_depth: int = 3
    max_range: int = 10000
    max_literal_chars: int = 24
    generated_conversations: int = 24  # shapes drawn per template (three renders each), issue 33
    conversation_seed: str = "warden-33"  # the draw (drawn once per process); set your own to keep it unknown

    def __post_init__(self) -> None:
        if not 0 <= self.generated_conversations <= 1000:
            raise ValueError("generated_conversations: must be between 0 and 1000")
        for i, digest in enumerate(self.approved_sha256):
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"approved_sha256[{i}]: expected 64 lowercase hex digits, got {digest!r}")
        if self.render_timeout_seconds <= 0:
            raise ValueError("render_timeout_seconds: must be > 0")
        parse_size(self.max_output_bytes, "max_output_bytes")
        parse_size(self.memory_limit_bytes, "memory_limit_bytes")

    @property
    def output_cap(self) -> int:
        return parse_size(self.max_output_bytes, "max_output_bytes")

    @property
    def memory_cap(self) -> int:
        return parse_size(self.memory_limit_bytes, "memory_limit_bytes")


@dataclass(frozen=True)
class BehaviourPolicy:
    """The behavioural checks: the tokenizer is loaded with ``tokenizers``/``sentencepiece`` in a
    child process (never repository code) and run on a built-in multilingual corpus."""

    enabled: bool = True
    timeout_seconds: float = 20.0
    memory_limit_bytes: Any = "4GiB"
    bpe_ids_follow_merges: bool = True

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            raise ValueError("timeout_seconds: must be > 0")
        parse_size(self.memory_limit_bytes, "memory_limit_bytes")

    @property
    def memory_cap(self) -> int:
        return parse_size(self.memory_limit_bytes, "memory_limit_bytes")


@dataclass(frozen=True)
class SpecialTokensPolicy:
    """Tokens PPO needs: ``required`` among bos/eos/pad/unk (default eos only: Qwen2 has no bos,
    Llama 3.1 no pad, and the trainer pads with eos); ``pad_distinct_from_eos`` asks pad != eos."""

    required: tuple[str, ...] = ("eos",)
    pad_distinct_from_eos: bool = False

    def __post_init__(self) -> None:
        for name in self.required:
            if name not in ("bos", "eos", "pad", "unk"):
                raise ValueError(f"required: {name!r} is not one of bos, eos, pad, unk")


@dataclass(frozen=True)
class TokenscanPolicy:
    """See policies/tokenscan.yaml for the meaning of every field."""

    paths: tuple[str, ...] = ()
    allowed_tokenizer_classes: tuple[str, ...] = DEFAULT_TOKENIZER_CLASSES
    allowed_processor_classes: tuple[str, ...] = ()
    allowed_model_types: tuple[str, ...] = DEFAULT_MODEL_TYPES
    allowed_extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    allowed_file_names: tuple[str, ...] = DEFAULT_FILE_NAMES
    allowed_private_keys: tuple[str, ...] = DEFAULT_PRIVATE_KEYS
    safe_pickle_globals: tuple[str, ...] = DEFAULT_SAFE_PICKLE_GLOBALS
    max_bytes: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_MAX_BYTES))
    max_pickle_bytes: Any = "256MiB"
    allow_hf_cache_blobs: bool = True
    chat_template: ChatTemplatePolicy = field(default_factory=ChatTemplatePolicy)
    special_tokens: SpecialTokensPolicy = field(default_factory=SpecialTokensPolicy)
    behaviour: BehaviourPolicy = field(default_factory=BehaviourPolicy)
    file_budget_seconds: float = 30.0
    scan_budget_seconds: float = 300.0
    pinned_directories: dict[str, str] = field(default_factory=dict)
    pinned_token_ids: dict[str, str] = field(default_factory=dict)
    fail_on: str = "medium"
    unapproved: str = "warn"  # a directory without an approval record: warn (TS1103 low) or block (high)
    check_interval_seconds: float = 1.0
    rescan_interval_seconds: float = 300.0
    watch: bool = True
    max_watched_paths: int = 64

    def __post_init__(self) -> None:
        try:
            Severity.parse(self.fail_on)
        except ValueError as exc:
            raise ValueError(f"fail_on: {exc}") from None
        if self.unapproved not in ("warn", "block"):
            raise ValueError(f"unapproved: expected warn or block, got {self.unapproved!r}")
        for ext in self.allowed_extensions:
            if not ext.startswith("."):
                raise ValueError(f"allowed_extensions: {ext!r} must start with '.'")
        for ext, value in self.max_bytes.items():
            parse_size(value, f"max_bytes.{ext}")
        parse_size(self.max_pickle_bytes, "max_pickle_bytes")
        for key in ("pinned_directories", "pinned_token_ids"):
            for path, digest in getattr(self, key).items():
                if not re.fullmatch(r"[0-9a-f]{64}", digest):
                    raise ValueError(f"{key}.{path}: expected 64 lowercase hex digits")
        for key in ("check_interval_seconds", "rescan_interval_seconds", "file_budget_seconds", "scan_budget_seconds"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}: must be > 0")
        if self.max_watched_paths < 1:
            raise ValueError("max_watched_paths: must be >= 1")

    @property
    def fail_severity(self) -> Severity:
        return Severity.parse(self.fail_on)

    @property
    def pickle_cap(self) -> int:
        return parse_size(self.max_pickle_bytes, "max_pickle_bytes")

    def cap_for(self, name: str) -> int | None:
        """The size cap of a file named ``name`` (by extension), None when uncapped."""
        ext = os.path.splitext(name)[1].lower()
        value = self.max_bytes.get(ext)
        return None if value is None else parse_size(value, f"max_bytes.{ext}")

    def pinned_digest(self, directory: str, table: str = "pinned_directories") -> str | None:
        """The digest pinned for ``directory`` in ``table`` (``pinned_directories``: manifest;
        ``pinned_token_ids``: the ids of the built-in corpus), compared by absolute path."""
        target = os.path.abspath(directory)
        for path, digest in getattr(self, table).items():
            if os.path.abspath(os.path.expanduser(path)) == target:
                return str(digest)
        return None


def default_policy(**overrides: Any) -> TokenscanPolicy:
    """The built-in policy (same as the shipped YAML), with ``overrides`` applied."""
    return replace(TokenscanPolicy(), **overrides)


def load_tokenscan_policy(path: str | os.PathLike[str] | None) -> TokenscanPolicy:
    """The policy at ``path``, or the built-in one for None. Raises PolicyError (exit 2)."""
    return default_policy() if path is None else load_policy(path, TokenscanPolicy)


def with_classes(policy: TokenscanPolicy, classes: tuple[str, ...] | None) -> TokenscanPolicy:
    """``policy`` whose tokenizer-class whitelist is ``classes`` (unchanged for None)."""
    if classes is None:
        return policy
    if not all(isinstance(c, str) and c for c in classes):
        raise ConfigError(f"allowed tokenizer classes must be non-empty strings, got {classes!r}")
    return replace(policy, allowed_tokenizer_classes=tuple(classes))


def coerce_policy(value: TokenscanPolicy | str | os.PathLike[str] | Mapping[str, Any] | None) -> TokenscanPolicy:
    """Accepts a policy object, a YAML path, a parsed mapping (``version: 1``) or None."""
    from warden.policy import policy_from_mapping

    if isinstance(value, TokenscanPolicy):
        return value
    if value is None or isinstance(value, (str, os.PathLike)):
        return load_tokenscan_policy(value)
    return policy_from_mapping(dict(value), TokenscanPolicy)
