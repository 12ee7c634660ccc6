"""Helpers every command module uses: options with ``WARDEN_<OPTION>`` variables, output formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click


def option(*decls: str, **kwargs: Any) -> Callable[[Any], Any]:
    """``click.option`` whose environment variable is ``WARDEN_<LONG_NAME>``."""
    longest = max((d for d in decls if d.startswith("--")), key=len, default=decls[0])
    name = longest.lstrip("-").split("/")[0].replace("-", "_").upper()
    kwargs.setdefault("envvar", f"WARDEN_{name}")
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


def format_option(*choices: str) -> Callable[[Any], Any]:
    """The ``--format`` option of commands that report findings."""
    values = choices or ("text", "json")
    return option(
        "--format", "output_format", type=click.Choice(values), default="text", show_default=True, help="Output format."
    )


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
