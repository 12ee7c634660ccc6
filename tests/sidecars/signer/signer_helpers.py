"""Shared helpers for the signer tests: the CLI, and (re-exported from
``tests.warden.signing.signing_helpers``, where the library tests get them) checkpoint
builders, keys and model_signing.

Imported as a plain module (pytest puts this directory on sys.path; the tests tree has
no __init__ files), hence the unique name.
"""

from __future__ import annotations

from dataclasses import dataclass

import click
from click.testing import CliRunner

from sidecars.signer.commands import checkpoint_group, keys_group
from tests.warden.signing.signing_helpers import (  # noqa: F401 - the signer tests import them from here
    CHECKPOINT_FILES,
    Keys,
    copy_checkpoint,
    make_keys,
    model_signing_cli,
    random_tree,
    run_model_signing,
    write_tree,
)
from warden.errors import WardenError


@dataclass(frozen=True)
class CliResult:
    """What the root CLI would do: exit code from the WardenError, stdout, stderr."""

    exit_code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], env: dict[str, str] | None = None) -> CliResult:
    """Runs our groups under a stand-in root that maps WardenError to its exit code and message."""
    root = click.Group("warden", commands={"keys": keys_group, "checkpoint": checkpoint_group})
    result = CliRunner().invoke(root, args, env=env)
    stderr = result.stderr
    if isinstance(result.exception, WardenError):
        return CliResult(result.exception.exit_code, result.stdout, stderr + str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, stderr)
