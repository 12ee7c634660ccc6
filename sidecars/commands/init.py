"""``warden init DIR``: editable copies of the shipped policies."""

from __future__ import annotations

import os
import shutil

import click

from warden.cliutil import echo
from warden.errors import ConfigError
from warden.policy import DEFAULTS_DIR, packaged_policy_names


def files_to_write(directory: str, names: list[str], force: bool) -> list[str]:
    """The file names ``init`` writes into ``directory`` (pure, given what exists there).

    Raises ConfigError naming every file that exists when ``force`` is not set, so a
    tuned policy is never overwritten by accident.
    """
    wanted = [f"{n}.yaml" for n in names] + ["README.md"]
    existing = [f for f in wanted if os.path.lexists(os.path.join(directory, f))]
    if existing and not force:
        raise ConfigError(f"{directory}: {', '.join(existing)} already exist; pass --force to overwrite them")
    return wanted


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite policy files that already exist in DIRECTORY.")
def init(directory: str, force: bool) -> None:
    """Write editable copies of every shipped policy (and their field reference) into DIRECTORY.

    Then point the sidecars at them: `warden sidecar run NAME --policy-dir DIRECTORY`
    (or WARDEN_POLICY_DIR=DIRECTORY). Without --policy-dir every command uses the
    shipped defaults, wherever it runs.
    """
    names = packaged_policy_names()
    os.makedirs(directory, exist_ok=True)
    for name in files_to_write(directory, names, force):
        target = os.path.join(directory, name)
        if os.path.islink(target):
            os.unlink(target)  # never write through a link someone left there
        shutil.copyfile(os.path.join(DEFAULTS_DIR, name), target)  # follows the package's own links
    echo(f"wrote {len(names)} policies and README.md to {directory}")
    echo(f"use them: warden sidecar run NAME --policy-dir {directory}   (or WARDEN_POLICY_DIR={directory})")
