"""State directories never default to the current directory (warden.statedir)."""

from __future__ import annotations

import os

from click.testing import CliRunner

from sidecars.cli import cli
from warden.statedir import default_state_dir, user_state_home


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
