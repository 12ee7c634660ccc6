"""Keys: generation, the 0600 rule, trusted key sets, curve checks, key ids."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from warden.errors import EXIT_USAGE
from warden.signing.errors import InsecureKeyPermissions, KeyExistsError, KeyFileError
from warden.signing.keys import generate_keypair, key_id, load_private_key, load_public_key, load_trusted_keys


def test_generate_writes_pkcs8_private_0600_and_public(tmp_path: Path) -> None:
    files = generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(os.stat(files.private_key).st_mode) == 0o600
    assert Path(files.private_key).read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    public_pem = Path(files.public_key).read_bytes()
    assert public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    assert files.key_id == hashlib.sha256(public_pem).hexdigest()
    assert sorted(os.listdir(tmp_path / "k")) == ["signing.key", "signing.pub"]
    assert key_id(load_private_key(files.private_key).public_key()) == files.key_id


def test_generate_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    first = generate_keypair(tmp_path)
    with pytest.raises(KeyExistsError, match=r"signing.key: already exists; pass --force"):
        generate_keypair(tmp_path)
    assert generate_keypair(tmp_path, force=True).key_id != first.key_id


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610])
def test_private_key_accessible_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    files = generate_keypair(tmp_path)
    os.chmod(files.private_key, mode)
    with pytest.raises(InsecureKeyPermissions) as info:
        load_private_key(files.private_key)
    assert f"(mode {mode:04o}); run: chmod 600 {files.private_key}" in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_owner_only_modes_are_accepted_and_a_symlinked_secret_is_judged_by_its_target(tmp_path: Path) -> None:
    files = generate_keypair(tmp_path / "real")
    os.chmod(files.private_key, 0o400)
    os.symlink(files.private_key, tmp_path / "mounted.key")  # how Kubernetes mounts secrets
    load_private_key(tmp_path / "mounted.key")


def test_key_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"nope.key: private key not found; create one"):
        load_private_key(tmp_path / "nope.key")
    garbage = tmp_path / "garbage.key"
    garbage.write_text("hello")
    garbage.chmod(0o600)
    with pytest.raises(KeyFileError, match=r"garbage.key: not a PEM private key"):
        load_private_key(garbage)


def test_only_p256_keys_are_accepted(tmp_path: Path) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    private = tmp_path / "p384.key"
    private.write_bytes(
        p384.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public = tmp_path / "p384.pub"
    public.write_bytes(
        p384.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFileError, match=r"expected an ECDSA P-256 .* got secp384r1"):
        load_private_key(private)
    with pytest.raises(KeyFileError, match=r"p384.pub: expected an ECDSA P-256"):
        load_public_key(public)


def test_trusted_keys_from_file_or_directory(tmp_path: Path) -> None:
    a, b = generate_keypair(tmp_path / "a"), generate_keypair(tmp_path / "b")
    assert [k.key_id for k in load_trusted_keys(a.public_key)] == [a.key_id]
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "a.pub").write_bytes(Path(a.public_key).read_bytes().replace(b"\n", b"\r\n"))  # CRLF copy
    (trust / "b.pub").write_bytes(Path(b.public_key).read_bytes())
    keys = load_trusted_keys(trust)
    assert {k.key_id for k in keys} == {a.key_id, b.key_id}  # ids do not depend on line endings
    found = keys.get(a.key_id)
    assert found is not None and found.source.endswith("a.pub")


def test_trust_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="trusted key file or directory not found"):
        load_trusted_keys(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match=r"empty: no \*.pub files"):
        load_trusted_keys(tmp_path / "empty")
