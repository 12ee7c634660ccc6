"""YAML policy files -> frozen dataclasses.

Every policy file has ``version: 1``. Unknown keys, missing required keys and values of
the wrong type raise :class:`PolicyError`, whose message names the file and the dotted
key, e.g. ``policies/paths.yaml: paths[2].deadline_seconds: expected a number, got 'x'``.

Supported field types: str, int, float, bool, None-able variants, ``list[T]``,
``tuple[T, ...]``, ``dict[str, T]`` and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

import yaml

from warden.errors import ConfigError

POLICY_VERSION = 1
T = TypeVar("T")

# The shipped default policies (package data: links to policies/*.yaml in a checkout, copies
# in an installed wheel). Commands default to these, never to a path under the current
# directory, so `warden` works from anywhere and a planted ./policies/ is never read.
DEFAULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "defaults")


def default_policy_path(name: str) -> str:
    """The packaged default policy file of sidecar or command ``name`` (``<name>.yaml``)."""
    return os.path.join(DEFAULTS_DIR, f"{name}.yaml")


POLICY_DIR_ENV = "WARDEN_POLICY_DIR"


def resolve_policy_path(name: str, explicit: str | None = None, policy_dir: str | None = None) -> str:
    """The one rule for which policy file a command or sidecar reads, by precedence:

    1. ``explicit``: the file passed with ``--policy`` (or ``WARDEN_POLICY``);
    2. ``<policy_dir>/<name>.yaml``: the directory passed with ``--policy-dir`` (or ``WARDEN_POLICY_DIR``);
       a directory without that file is an error, never a silent fallback to something weaker;
    3. the packaged default (:func:`default_policy_path`).

    Never a path under the current directory: a repository or home directory that holds its own
    ``policies/`` does not change what a command enforces. Raises PolicyError (exit 2).
    """
    if explicit:
        return explicit
    if policy_dir:
        path = os.path.join(policy_dir, f"{name}.yaml")
        if not os.path.isfile(path):
            raise PolicyError(
                f"{path}: no {name}.yaml in the policy directory (--policy-dir / {POLICY_DIR_ENV}); pass "
                "--policy FILE, or write editable copies of the defaults with `warden init DIR`"
            )
        return path
    return default_policy_path(name)


def packaged_policy_names() -> list[str]:
    """Names of every packaged default policy, sorted."""
    return sorted(n[: -len(".yaml")] for n in os.listdir(DEFAULTS_DIR) if n.endswith(".yaml"))


class PolicyError(ConfigError):
    """A policy file is missing, unparsable or does not match its schema."""


def load_policy(path: str | os.PathLike[str], schema: type[T]) -> T:
    """Reads ``path`` and returns an instance of the dataclass ``schema``.

    Raises PolicyError (exit code 2) naming the file and key.
    """
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise PolicyError(f"{where}: policy file not found; pass --policy FILE or create it") from None
    except OSError as exc:
        raise PolicyError(f"{where}: cannot read policy: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{where}: not valid YAML: {exc}") from None
    return policy_from_mapping(raw, schema, where)


def policy_from_mapping(raw: Any, schema: type[T], where: str = "<policy>") -> T:
    """Validates an already-parsed mapping; see :func:`load_policy`."""
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: the top level must be a mapping with 'version: {POLICY_VERSION}'")
    version = raw.get("version")
    if version != POLICY_VERSION:
        raise PolicyError(f"{where}: version: must be {POLICY_VERSION}, got {version!r}")
    body = {k: v for k, v in raw.items() if k != "version"}
    return typing.cast(T, _convert(body, schema, where, ""))


def _fail(where: str, key: str, message: str) -> PolicyError:
    return PolicyError(f"{where}: {key or '<top>'}: {message}")


def _convert(value: Any, tp: Any, where: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, typing.cast(type, tp), where, key)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(value, inner[0], where, key)
        raise _fail(where, key, f"unsupported union type {tp}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _fail(where, key, f"expected a list, got {type(value).__name__}")
        item_tp = typing.get_args(tp)[0]
        items = [_convert(v, item_tp, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(where, key, f"expected a mapping, got {type(value).__name__}")
        val_tp = typing.get_args(tp)[1]
        return types.MappingProxyType({str(k): _convert(v, val_tp, where, f"{key}.{k}") for k, v in value.items()})
    return _convert_scalar(value, tp, where, key)


def _convert_scalar(value: Any, tp: Any, where: str, key: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(where, key, f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(where, key, f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(where, key, f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(where, key, f"expected a string, got {value!r}")
    raise _fail(where, key, f"unsupported field type {tp}")


def _convert_dataclass(value: Any, cls: type, where: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(where, key, f"expected a mapping, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prefix = f"{key}." if key else ""
    for unknown in sorted(set(map(str, value)) - set(fields)):
        raise _fail(where, prefix + unknown, f"unknown key; expected one of {', '.join(sorted(fields))}")
    kwargs = {}
    for name, fld in fields.items():
        if name in value:
            kwargs[name] = _convert(value[name], hints[name], where, prefix + name)
        elif fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
            raise _fail(where, prefix + name, "required key is missing")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        # __post_init__ validation: its message starts with the field name.
        raise _fail(where, key, str(exc)) from None
