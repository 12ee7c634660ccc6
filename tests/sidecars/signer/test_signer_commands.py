"""The `keys` and `checkpoint` click groups, under a stand-in for the root CLI's error mapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sidecars.signer.signer_helpers import CHECKPOINT_FILES, run_cli, write_tree


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    keys_dir = tmp_path / "keys"
    assert run_cli(["keys", "generate", "--out", str(keys_dir)]).exit_code == 0
    ckpt = write_tree(tmp_path / "run" / "checkpoints" / "step-000000050", CHECKPOINT_FILES)
    return keys_dir / "signing.key", keys_dir / "signing.pub", ckpt


def test_generate_sign_verify_round_trip(tmp_path: Path) -> None:
    key, pub, ckpt = _setup(tmp_path)
    signed = run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key), "--run-id", "r1", "--step", "50"])
    assert signed.exit_code == 0, signed.stderr
    assert f"-> {ckpt}.sig" in signed.stdout
    verified = run_cli(["checkpoint", "verify", str(ckpt), "--trust", str(pub)])
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"OK {ckpt}: {len(CHECKPOINT_FILES)} files")
    assert "run_id: r1" in verified.stdout and "step: 50" in verified.stdout


def test_tampered_checkpoint_exits_1_naming_files_and_digests(tmp_path: Path) -> None:
    key, pub, ckpt = _setup(tmp_path)
    assert run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key)]).exit_code == 0
    (ckpt / "critic/model.safetensors").unlink()
    (ckpt / "trainer_state.json").write_bytes(b"{}")
    (ckpt / "new.bin").write_bytes(b"x")
    text = run_cli(["checkpoint", "verify", str(ckpt), "--trust", str(pub)])
    assert text.exit_code == 1
    assert "modified trainer_state.json: signed sha256:" in text.stdout
    assert "missing  critic/model.safetensors: signed sha256:" in text.stdout
    assert "extra    new.bin: found sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881" in (
        text.stdout
    )
    assert "1 modified, 1 missing, 1 extra" in text.stderr
    report = json.loads(run_cli(["checkpoint", "verify", str(ckpt), "--trust", str(pub), "--format", "json"]).stdout)
    assert report["ok"] is False
    assert [p["code"] for p in report["problems"]] == ["files_mismatch"]
    assert report["extra"] == [{"name": "new.bin", "actual": report["extra"][0]["actual"]}]


def test_exit_codes_for_missing_signature_and_loose_key(tmp_path: Path) -> None:
    key, pub, ckpt = _setup(tmp_path)
    missing = run_cli(["checkpoint", "verify", str(ckpt), "--trust", str(pub), "--format", "json"])
    assert missing.exit_code == 3
    assert json.loads(missing.stdout)["error"]["kind"] == "SignatureMissing"
    os.chmod(key, 0o640)
    loose = run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key)])
    assert loose.exit_code == 2 and f"run: chmod 600 {key}" in loose.stderr
    assert not Path(f"{ckpt}.sig").exists()
    assert run_cli(["keys", "generate", "--out", str(key.parent)]).exit_code == 2  # exists, no --force


def test_options_come_from_warden_environment_variables(tmp_path: Path) -> None:
    key, pub, ckpt = _setup(tmp_path)
    env = {"WARDEN_KEY": str(key), "WARDEN_STEP": "50", "WARDEN_FORMAT": "json", "WARDEN_TRUST": str(pub)}
    signed = run_cli(["checkpoint", "sign", str(ckpt)], env=env)
    assert signed.exit_code == 0, signed.stderr
    assert json.loads(signed.stdout)["provenance"] == {"step": 50}
    verified = run_cli(["checkpoint", "verify", str(ckpt)], env=env)
    assert verified.exit_code == 0 and json.loads(verified.stdout)["ok"] is True


def test_symlink_inside_checkpoint_refuses_signing_with_exit_1(tmp_path: Path) -> None:
    key, _, ckpt = _setup(tmp_path)
    os.symlink("/etc/passwd", ckpt / "actor" / "tokenizer.json")
    result = run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key)])
    assert result.exit_code == 1
    assert f"{ckpt}/actor/tokenizer.json is a symlink (-> /etc/passwd)" in result.stderr


def test_bad_parent_digest_is_a_usage_error(tmp_path: Path) -> None:
    key, _, ckpt = _setup(tmp_path)
    result = run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key), "--parent-digest", "xyz"])
    assert result.exit_code == 2 and "64 lowercase hex" in result.stderr


def test_verify_has_no_default_trust_so_a_key_planted_in_the_cwd_is_never_trusted(tmp_path: Path) -> None:
    """Storage writer plants policies/keys/evil.pub where the auditor runs `checkpoint verify`."""
    key, pub, ckpt = _setup(tmp_path)  # the attacker's own key pair signs the checkpoint
    assert run_cli(["checkpoint", "sign", str(ckpt), "--key", str(key)]).exit_code == 0
    workdir = tmp_path / "cwd"
    (workdir / "policies" / "keys").mkdir(parents=True)
    (workdir / "policies" / "keys" / "evil.pub").write_bytes(pub.read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_TRUST"}
    result = subprocess.run(
        [sys.executable, "-m", "sidecars.cli", "checkpoint", "verify", str(ckpt)],
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2 and "--trust" in result.stderr, result.stderr


def test_sign_reads_the_key_from_warden_signing_key(tmp_path: Path) -> None:
    key, pub, ckpt = _setup(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_KEY"}
    env["WARDEN_SIGNING_KEY"] = str(key)
    signed = subprocess.run(
        [sys.executable, "-m", "sidecars.cli", "checkpoint", "sign", str(ckpt)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert signed.returncode == 0, signed.stderr
    assert run_cli(["checkpoint", "verify", str(ckpt), "--trust", str(pub)]).exit_code == 0
