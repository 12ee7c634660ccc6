"""State directories never default to the current directory (warden.statedir)."""

from __future__ import annotations

import os

from click.testing import CliRunner

from sidecars.cli import cli
from warden.statedir import default_state_dir, resolve_state_dir, user_state_home


def test_the_rule(tmp_path):
    assert default_state_dir("deps", str(tmp_path / "run")) == str(tmp_path / "run" / "state" / "deps")
    assert default_state_dir("deps", environ={"XDG_STATE_HOME": str(tmp_path)}) == str(tmp_path / "warden" / "deps")
    relative = user_state_home({"XDG_STATE_HOME": "relative/dir"})  # not absolute: ignored, as XDG says
    assert relative == os.path.join(os.path.expanduser("~"), ".local", "state")


def test_deps_audit_without_a_state_dir_leaves_nothing_in_the_current_directory(tmp_path, monkeypatch):
    cwd, xdg, site = tmp_path / "checkout", tmp_path / "xdg", tmp_path / "site"
    for directory in (cwd, site):
        directory.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_STATE_HOME", str(xdg))
    monkeypatch.delenv("WARDEN_STATE_DIR", raising=False)
    result = CliRunner().invoke(cli, ["deps", "audit", "--site-packages", str(site), "--check", "drift"])
    assert list(cwd.iterdir()) == []
    assert f"state: {xdg / 'warden' / 'deps'}" in result.output


def test_without_xdg_state_home_it_is_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir("deps") == str(tmp_path / "home" / ".local" / "state" / "warden" / "deps")


def test_a_given_or_configured_directory_wins_and_only_a_default_is_told(tmp_path):
    said: list[str] = []
    assert resolve_state_dir("/var/lib/warden/deps", "deps", say=said.append) == "/var/lib/warden/deps"
    assert said == []
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert resolve_state_dir(None, "paths", say=said.append, environ=env) == str(tmp_path / "warden" / "paths")
    assert resolve_state_dir(None, "bridge", str(tmp_path / "run"), say=said.append) == str(
        tmp_path / "run" / "state" / "bridge"
    )
    assert said == [
        f"state: {tmp_path / 'warden' / 'paths'} (--state-dir to choose)",
        f"state: {tmp_path / 'run' / 'state' / 'bridge'} (--state-dir to choose)",
    ]


def test_a_sidecar_without_run_dir_or_state_dir_writes_to_the_user_state_directory(tmp_path, monkeypatch):
    cwd, home, watched = tmp_path / "checkout", tmp_path / "home", tmp_path / "watched"
    for directory in (cwd, home, watched):
        directory.mkdir()
    policy = tmp_path / "paths.yaml"
    policy.write_text(f"version: 1\npaths:\n  - {{name: w, path: {watched}}}\n", encoding="utf-8")
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("WARDEN_STATE_DIR", raising=False)
    monkeypatch.delenv("WARDEN_RUN_DIR", raising=False)
    monkeypatch.setenv("HOME", str(home))
    result = CliRunner().invoke(cli, ["sidecar", "run", "paths", "--once", "--policy", str(policy), "--port", "0"])
    assert result.exit_code == 0, result.output
    expected = home / ".local" / "state" / "warden" / "paths"
    assert list(cwd.iterdir()) == []
    assert expected.is_dir()
    assert f"state: {expected} (--state-dir to choose)" in result.output


def test_the_local_stack_maps_a_service_state_volume_into_the_run_directory(tmp_path):
    from sidecars.stack.local import StackOptions, map_path

    opts = StackOptions(run_dir=str(tmp_path / "run"), policy_dir=str(tmp_path / "policies"))
    assert map_path("/var/lib/warden/deps/cache", opts) == str(tmp_path / "run" / "state" / "deps" / "cache")
