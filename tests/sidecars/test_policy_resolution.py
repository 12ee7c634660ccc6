"""One rule for which policy a command reads (warden.policy.resolve_policy_path), proved over every command.

Each command that reads a policy is run from a directory holding a weakened copy of every policy
(``./policies/<name>.yaml`` and ``./<name>.yaml``) with no ``WARDEN_*`` variable set: it must not
open any of them. The same command with ``WARDEN_POLICY_DIR`` (and with ``--policy-dir``) pointing
there must read it (the planted file is invalid, so it exits 2 naming it): the control that shows
the first half could fail. The table of commands is checked against the CLI itself, so a new
command with a ``--policy`` option fails here until it is listed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sidecars.cli import cli
from sidecars.registry import SIDECARS, sidecar_class
from warden.errors import EXIT_USAGE
from warden.policy import PolicyError, packaged_policy_names, resolve_policy_path
from warden.signing.keys import generate_keypair

# A key no schema has: loading the planted file fails with a PolicyError naming it (exit 2).
WEAKENED = "version: 1\nplanted_by_the_repository: true\n"

# command path -> (policy name, arguments after the command path; {d} is a scratch directory)
POLICY_COMMANDS: dict[tuple[str, ...], tuple[str, list[str]]] = {
    ("scan", "tokenizer"): ("tokenscan", ["{d}/tokenizer"]),
    ("deps", "audit"): ("deps", ["--site-packages", "{d}/site", "--state-dir", "{d}/state", "--check", "drift"]),
    ("audit", "snapshot"): ("archiver", ["--run", "r1", "--step", "1", "--trust", "{d}/keys/signing.pub"]),
    ("audit", "verify-run"): ("archiver", ["--run", "r1", "--trust", "{d}/keys/signing.pub"]),
    ("audit", "list"): ("archiver", ["--run", "r1"]),
    ("paths", "check"): ("paths", []),
    ("compare",): ("shadow", ["{d}/run-a", "{d}/run-b"]),
    ("export",): ("signer", ["--checkpoint", "{d}/run", "--base", "{d}/run-a", "--out", "{d}/exported"]),
}


def _leaves(
    group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None:
            continue
        if isinstance(command, click.Group):
            yield from _leaves(command, ctx, (*prefix, name))
        else:
            yield (*prefix, name), command


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def test_every_command_with_a_policy_option_is_listed_and_has_both_options():
    with click.Context(cli) as ctx:
        leaves = dict(_leaves(cli, ctx))
    with_policy = {path for path, command in leaves.items() if "--policy" in _options(command)}
    assert with_policy == {*POLICY_COMMANDS, ("sidecar", "run")}
    for path in with_policy:
        assert {"--policy", "--policy-dir"} <= _options(leaves[path]), path
        policy_dir = next(p for p in leaves[path].params if "--policy-dir" in getattr(p, "opts", ()))
        with click.Context(leaves[path]) as ctx:
            assert policy_dir.envvar == "WARDEN_POLICY_DIR" and not isinstance(policy_dir.get_default(ctx), str), path


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory holding weakened copies of every policy, and no WARDEN_* variables."""
    cwd = tmp_path / "checkout"
    (cwd / "policies").mkdir(parents=True)
    for name in packaged_policy_names():
        (cwd / "policies" / f"{name}.yaml").write_text(WEAKENED)
        (cwd / f"{name}.yaml").write_text(WEAKENED)
    for sub in ("tokenizer", "site", "run-a", "run-b", "run"):
        (tmp_path / sub).mkdir()
    generate_keypair(tmp_path / "keys")
    for key in list(os.environ):
        if key.startswith("WARDEN_") or key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a closed port: fails at once
    monkeypatch.chdir(cwd)
    return cwd


class _OpenRecorder:
    """Records every file opened under one directory (an audit hook sees builtins.open and os.open)."""

    def __init__(self) -> None:
        self.root: str | None = None
        self.opened: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if event == "open" and self.root is not None and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(self.root):
                self.opened.append(path)


RECORDER = _OpenRecorder()


def _invoke(argv: list[str], root: Path, env: dict[str, str] | None = None):
    RECORDER.root, RECORDER.opened = str(root) + os.sep, []
    try:
        result = CliRunner().invoke(cli, argv, env=env, catch_exceptions=False)
    finally:
        RECORDER.root = None
    return result, list(RECORDER.opened)


def _argv(path: tuple[str, ...], args: list[str], scratch: Path) -> list[str]:
    return [*path, *(a.format(d=scratch) for a in args)]


@pytest.mark.parametrize("path", sorted(POLICY_COMMANDS), ids=" ".join)
def test_a_policy_in_the_current_directory_is_never_read(planted: Path, path: tuple[str, ...]):
    name, args = POLICY_COMMANDS[path]
    argv = _argv(path, args, planted.parent)
    result, opened = _invoke(argv, planted)
    assert opened == [], f"{' '.join(argv)} opened {opened}"
    assert "planted_by_the_repository" not in result.output
    # the control: pointed there explicitly, the command reads the planted file and refuses it
    for extra, env in (([], {"WARDEN_POLICY_DIR": str(planted / "policies")}), (["--policy-dir", "policies"], None)):
        result, opened = _invoke([*path, *extra, *argv[len(path) :]], planted, env)
        assert result.exit_code == EXIT_USAGE, result.output
        assert f"{name}.yaml" in result.output and "planted_by_the_repository" in result.output
        assert str(planted / "policies" / f"{name}.yaml") in opened


@pytest.mark.parametrize("name", sorted(n for n in SIDECARS if sidecar_class(n).policy_schema is not None))
def test_sidecar_run_reads_the_policy_dir_it_is_given_and_never_the_current_directory(planted: Path, name: str):
    assert resolve_policy_path(name) == os.path.join(
        os.path.dirname(os.path.abspath(sys.modules["warden.policy"].__file__ or "")), "defaults", f"{name}.yaml"
    )
    argv = ["sidecar", "run", name, "--once", "--run-dir", str(planted.parent / "run")]
    result, opened = _invoke(argv, planted, {"WARDEN_POLICY_DIR": "policies"})
    assert result.exit_code == EXIT_USAGE, result.output
    assert "planted_by_the_repository" in result.output
    assert opened and all(p.endswith(f"{name}.yaml") for p in opened)


def test_the_rule_by_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deps.yaml").write_text(WEAKENED)
    assert resolve_policy_path("deps", "mine.yaml", str(tmp_path)) == "mine.yaml"
    assert resolve_policy_path("deps", None, str(tmp_path)) == str(tmp_path / "deps.yaml")
    assert not resolve_policy_path("deps").startswith(str(tmp_path))
    with pytest.raises(PolicyError, match=r"no paths\.yaml in the policy directory"):
        resolve_policy_path("paths", None, str(tmp_path))
