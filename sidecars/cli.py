"""The ``warden`` command. Exit codes: 0 clean, 1 violation, 2 usage, 3 incomplete.

Expected failures (WardenError, OSError) print one ``error:`` line naming the file,
key or step, and never a traceback. Anything else is a bug or an input nobody foresaw:
it prints one ``internal error:`` line and exits 3 ("could not be completed"), never 1,
because 1 is the promise that a violation was found. ``WARDEN_DEBUG=1`` shows the
traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from warden import __version__
from warden.cliutil import echo
from warden.errors import EXIT_INCOMPLETE, ConfigError, WardenError, quote_untrusted

# Command groups that live in other modules: name -> "module:attribute". Imported lazily
# so `warden --help` does not import every sidecar.
LAZY_COMMANDS: dict[str, str] = {
    "sidecar": "sidecars.commands.sidecar:sidecar",
    "events": "sidecars.commands.events:events",
    "bridge": "sidecars.bridge.commands:bridge",
    "paths": "sidecars.paths.commands:paths",
    "keys": "sidecars.signer.commands:keys_group",
    "checkpoint": "sidecars.signer.commands:checkpoint_group",
    "audit": "sidecars.archiver.commands:audit",
    "scan": "sidecars.tokenscan.commands:scan",
    "deps": "sidecars.deps.commands:deps",
    "train": "trainer.cli:train",
    "export": "trainer.export:export",
    "demo": "sidecars.stack.commands:demo",
    "stack": "sidecars.stack.commands:stack",
    "init": "sidecars.commands.init:init",
    "compare": "sidecars.commands.compare:compare",
    "diagnose": "sidecars.commands.diagnose:diagnose_command",
}


class WardenGroup(click.Group):
    """A click group that maps expected errors to exit codes and loads subcommands lazily."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, _, attr = self.lazy[cmd_name].partition(":")
            try:
                command = getattr(importlib.import_module(module_name), attr)
            except ImportError as exc:
                return _unavailable(cmd_name, exc)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WardenError as exc:
            echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            echo(f"error: {where}{exc.strerror or exc}", err=True)
            ctx.exit(EXIT_INCOMPLETE)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except (SystemExit, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:  # the one place that turns a bug (even a native panic) into exit 3
            if os.environ.get("WARDEN_DEBUG"):
                raise
            echo(f"internal error: {type(exc).__name__}: {quote_untrusted(str(exc))}", err=True)
            ctx.exit(EXIT_INCOMPLETE)


def _unavailable(name: str, exc: ImportError) -> click.Command:
    """Stands in for a command whose module cannot be imported (a missing extra)."""
    hint = "pip install 'warden[train]'" if exc.name in ("torch", "transformers", "safetensors") else "reinstall warden"
    message = f"`warden {name}` is unavailable here: {exc} ({hint})"

    def fail() -> None:
        raise ConfigError(message)

    return click.Command(name, callback=fail, help=message, short_help="(unavailable: missing dependency)")


@click.group(
    cls=WardenGroup,
    lazy=LAZY_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="warden")
def cli() -> None:
    """Warden: ops and compliance sidecars for RL (PPO) post-training.

    The trainer appends events to <run_dir>/events.jsonl; sidecars follow that journal,
    act on it (sign checkpoints, archive reward snapshots, scan tokenizers, audit
    dependencies, watch paths) and export Prometheus metrics.

    Exit codes: 0 clean, 1 a policy violation was found, 2 usage or configuration
    error, 3 the check could not be completed. Every option can also be set with an
    environment variable WARDEN_<OPTION> (shown in each command's --help).
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="warden")


if __name__ == "__main__":
    main()
