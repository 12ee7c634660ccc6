"""Shipped default policies: every command finds its policy without a checkout, `warden init`."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
from support import ROOT, run_warden

from sidecars.registry import SIDECARS, sidecar_class
from warden.policy import DEFAULTS_DIR, load_policy, packaged_policy_names


def test_every_sidecar_has_a_packaged_policy_equal_to_the_repository_one():
    assert set(SIDECARS) <= set(packaged_policy_names())
    for name in SIDECARS:
        packaged, repo = os.path.join(DEFAULTS_DIR, f"{name}.yaml"), os.path.join(ROOT, "policies", f"{name}.yaml")
        with open(packaged, "rb") as got, open(repo, "rb") as want:
            assert got.read() == want.read(), name
        load_policy(os.path.join(DEFAULTS_DIR, f"{name}.yaml"), sidecar_class(name).policy_schema)


def test_sidecar_runs_from_an_empty_directory_and_ignores_a_planted_policies_dir(tmp_path, journal):
    """A ./policies/ in the working directory is never read unless named (--policy-dir)."""
    journal.emit("run.started", {})
    cwd = tmp_path / "elsewhere"
    (cwd / "policies").mkdir(parents=True)
    (cwd / "policies" / "journal.yaml").write_text("version: 1\nnot_a_field: planted\n")
    run_dir = os.path.dirname(journal.path)
    result = run_warden("sidecar", "run", "journal", "--run-dir", run_dir, "--once", cwd=str(cwd))
    assert result.returncode == 0, result.stderr
    named = run_warden(
        "sidecar", "run", "journal", "--run-dir", run_dir, "--once", "--policy-dir", "policies", cwd=str(cwd)
    )
    assert named.returncode == 2 and "not_a_field" in named.stderr


def test_init_writes_editable_copies_and_never_overwrites_silently(tmp_path):
    target = tmp_path / "my-policies"
    first = run_warden("init", str(target))
    assert first.returncode == 0, first.stderr
    for name in SIDECARS:
        load_policy(target / f"{name}.yaml", sidecar_class(name).policy_schema)
        assert not (target / f"{name}.yaml").is_symlink()
    assert (target / "README.md").read_text().startswith("#")
    (target / "signer.yaml").write_text("version: 1\nstable_seconds: 5\n")
    again = run_warden("init", str(target))
    assert again.returncode == 2 and "signer.yaml" in again.stderr and "--force" in again.stderr
    assert "stable_seconds: 5" in (target / "signer.yaml").read_text()
    assert run_warden("init", str(target), "--force").returncode == 0
    assert "stable_seconds: 5" not in (target / "signer.yaml").read_text()


@pytest.mark.slow
def test_a_built_wheel_carries_the_policies_and_runs_outside_the_checkout(tmp_path):
    """pip-installed warden: the wheel holds real policy files, and a sidecar finds them from anywhere."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), ROOT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("warden-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in SIDECARS:
            member = f"warden/defaults/{name}.yaml"
            assert member in names
            with open(os.path.join(ROOT, "policies", f"{name}.yaml"), "rb") as repo:
                assert archive.read(member) == repo.read(), member  # the file itself, not a link
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c", "import sidecars, sys; print(sidecars.__file__)"],
        capture_output=True,
        text=True,
        cwd=empty,
        env=env,
        timeout=60,
    )
    assert probe.stdout.startswith(str(site)), probe.stdout  # really the wheel's copy, not the checkout
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("")
    ran = subprocess.run(
        [sys.executable, "-m", "sidecars.cli", "sidecar", "run", "journal", "--run-dir", str(run_dir), "--once"],
        capture_output=True,
        text=True,
        cwd=empty,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr  # found the packaged journal.yaml, not a checkout's
