"""Helpers every command module uses: options with ``WARDEN_<OPTION>`` variables, output formats."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from warden.errors import escape_untrusted
from warden.policy import resolve_policy_path


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


def echo(message: object = "", err: bool = False, nl: bool = True) -> None:
    """The one way a command prints: ``click.echo`` of :func:`warden.errors.escape_untrusted` text."""
    click.echo(escape_untrusted(str(message)), err=err, nl=nl)


def echo_json(obj: Any) -> None:
    """JSON output (ASCII-escaped by json.dumps: nothing a terminal acts on)."""
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def trust_option() -> Callable[[Any], Any]:
    """``--trust FILE_OR_DIR`` (or ``WARDEN_TRUST``): required, never a default path.

    What a verification trusts must be named by the person running it: a default such as
    ``policies/keys`` would resolve against the current directory, where whoever can write
    the storage being checked could have planted a key (docs/threat-model.md, G5).
    """
    return option(
        "--trust",
        required=True,
        type=click.Path(),
        metavar="FILE_OR_DIR",
        help="Trusted public key (a PEM .pub file) or a directory whose *.pub files are all trusted. "
        "Required: there is no default location.",
    )


def run_dir_option(
    help_text: str = "Run directory holding events.jsonl.", *, required: bool = True
) -> Callable[[Any], Any]:
    """``--run-dir DIR`` (or ``WARDEN_RUN_DIR``): the run directory a command reads or writes."""
    return option("--run-dir", required=required, type=click.Path(file_okay=False), help=help_text)


def policy_options(name: str | None = None) -> Callable[[Any], Any]:
    """``--policy FILE`` and ``--policy-dir DIR`` (``WARDEN_POLICY`` / ``WARDEN_POLICY_DIR``), unset by
    default, resolved by :func:`warden.policy.resolve_policy_path`: the one rule every command follows
    (never the current directory).

    With ``name`` the command receives ``policy``: the resolved path. Without (``sidecar run``, whose
    name is an argument) it receives both values and resolves them itself with the same function.
    """
    subject = name or "<name>"

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        target = func
        if name is not None:

            @functools.wraps(func)
            def resolved(*args: Any, policy: str | None, policy_dir: str | None, **kwargs: Any) -> Any:
                return func(*args, policy=resolve_policy_path(name, policy, policy_dir), **kwargs)

            target = resolved
        target = option(
            "--policy-dir",
            type=click.Path(file_okay=False),
            help=f"Directory of policy files; {subject}.yaml is read from it (`warden init DIR` writes "
            "editable copies). Default: the policies shipped with warden.",
        )(target)
        return option(
            "--policy",
            type=click.Path(dir_okay=False),
            help=f"Policy file. Default: <policy-dir>/{subject}.yaml, else the {subject}.yaml shipped with warden.",
        )(target)

    return decorate
