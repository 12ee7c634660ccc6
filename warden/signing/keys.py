"""Keys: ECDSA P-256 key pairs, the private key's permissions, trusted public keys.

Contracts:
- the key id of a public key is the hex SHA-256 of its SubjectPublicKeyInfo PEM as
  ``cryptography`` writes it: the ``verificationMaterial.publicKey.hint`` of a bundle,
  computed the same way as ``model_signing`` (so a key file's line endings don't matter);
- :func:`generate_keypair` writes ``signing.key`` (PKCS#8 PEM, unencrypted, mode 0600)
  and ``signing.pub`` atomically, and refuses to overwrite without ``force``;
- :func:`load_private_key` refuses a file whose mode gives group or others any access or
  that another uid owns, checked on the opened file (so a symlinked secret is judged by
  its target), and a file in a directory that group/others may write or that another
  user (not root) owns: whoever writes the directory can swap the key;
- only P-256 keys are accepted, for signing and for trust.
No key material is ever put in an error message.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from warden.safeio import atomic_write_bytes
from warden.signing.errors import InsecureKeyPermissions, KeyExistsError, KeyFileError

PRIVATE_KEY_NAME = "signing.key"
PUBLIC_KEY_NAME = "signing.pub"
PUBLIC_KEY_SUFFIX = ".pub"


def public_pem(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM of ``public_key``."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """Hex SHA-256 of the public key's PEM text: the bundle's ``publicKey.hint``."""
    return hashlib.sha256(public_pem(public_key)).hexdigest()


def _require_p256(key: object, where: str) -> None:
    """Raises KeyFileError unless ``key`` is an EC key on NIST P-256."""
    curve = getattr(key, "curve", None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) or not isinstance(
        curve, ec.SECP256R1
    ):
        kind = getattr(curve, "name", type(key).__name__)
        raise KeyFileError(f"{where}: expected an ECDSA P-256 (secp256r1) key, got {kind}")


@dataclass(frozen=True)
class KeyPairFiles:
    """Where :func:`generate_keypair` wrote the pair, and the key id."""

    private_key: str
    public_key: str
    key_id: str


def generate_keypair(out_dir: str | os.PathLike[str], *, force: bool = False) -> KeyPairFiles:
    """Writes a new P-256 pair as ``out_dir/signing.key`` (0600) and ``out_dir/signing.pub``.

    Creates ``out_dir`` (mode 0700) if needed. Raises KeyExistsError if either file
    exists and ``force`` is false.
    """
    directory = os.fspath(out_dir)
    private_path = os.path.join(directory, PRIVATE_KEY_NAME)
    public_path = os.path.join(directory, PUBLIC_KEY_NAME)
    existing = [p for p in (private_path, public_path) if os.path.lexists(p)]
    if existing and not force:
        raise KeyExistsError(f"{existing[0]}: already exists; pass --force to replace the key pair")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        private_key = ec.generate_private_key(ec.SECP256R1())
        pem = private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        atomic_write_bytes(private_path, pem, mode=0o600)
        atomic_write_bytes(public_path, public_pem(private_key.public_key()), mode=0o644)
    except OSError as exc:
        raise KeyFileError(f"{directory}: cannot write the key pair: {exc.strerror}") from None
    return KeyPairFiles(private_path, public_path, key_id(private_key.public_key()))


def _check_key_file(path: str, st: os.stat_result, euid: int) -> None:
    """Refuses a key file others may read or that another user owns (and so may rewrite)."""
    if st.st_mode & 0o077:
        raise InsecureKeyPermissions(
            f"{path}: private key is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run: chmod 600 {path}"
        )
    if st.st_uid != euid:
        raise InsecureKeyPermissions(
            f"{path}: private key is owned by uid {st.st_uid}, but the signer runs as uid {euid}; "
            f"run: chown {euid} {path}"
        )


def key_directories(path: str) -> list[str]:
    """The directories whose owner can replace the key: the named one and, through links, the target's."""
    named = os.path.dirname(os.path.abspath(path))
    target = os.path.dirname(os.path.realpath(path))
    return [named] if named == target else [named, target]


def _check_key_directory(directory: str, euid: int) -> None:
    """Refuses a key directory writable by group or others, or owned by a user other than us or root.

    Whoever may write the directory may swap the key file for their own (and sign with it).
    Root may do anything anyway, so a root-owned directory (``/run/secrets``) is accepted.
    """
    try:
        st = os.stat(directory)
    except OSError as exc:
        raise KeyFileError(f"{directory}: cannot check the private key's directory: {exc.strerror}") from None
    if st.st_mode & 0o022:
        raise InsecureKeyPermissions(
            f"{directory}: the private key's directory is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod go-w {directory}"
        )
    if st.st_uid not in (euid, 0):
        raise InsecureKeyPermissions(
            f"{directory}: the private key's directory is owned by uid {st.st_uid}, not by the signer "
            f"(uid {euid}) or root; run: chown {euid} {directory}"
        )


def _read_private_key_file(path: str) -> bytes:
    """Reads ``path`` after checking, on the open file, that only its owner (us) can access it."""
    euid = os.geteuid()
    try:
        with open(path, "rb") as fh:
            _check_key_file(path, os.fstat(fh.fileno()), euid)
            for directory in key_directories(path):
                _check_key_directory(directory, euid)
            return fh.read()
    except FileNotFoundError:
        raise KeyFileError(f"{path}: private key not found; create one with `warden keys generate --out DIR`") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read private key: {exc.strerror}") from None


def load_private_key(path: str | os.PathLike[str]) -> ec.EllipticCurvePrivateKey:
    """Loads an unencrypted PEM (PKCS#8 or SEC1) P-256 private key; refuses loose permissions.

    Refused with InsecureKeyPermissions (a ConfigError, exit 2, naming the file and the
    chmod/chown fix): a file group/other may access or owned by another uid than the
    effective one; a containing directory (the named one and a link target's) writable by
    group/other or owned by another uid than ours or root's.
    """
    where = os.fspath(path)
    data = _read_private_key_file(where)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(f"{where}: the private key is encrypted; Warden needs an unencrypted one") from None
    except ValueError:
        raise KeyFileError(f"{where}: not a PEM private key") from None
    _require_p256(key, where)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def load_public_key(path: str | os.PathLike[str]) -> ec.EllipticCurvePublicKey:
    """Loads a PEM P-256 public key."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise KeyFileError(f"{where}: public key not found") from None
    except OSError as exc:
        raise KeyFileError(f"{where}: cannot read public key: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(f"{where}: not a PEM public key") from None
    _require_p256(key, where)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


@dataclass(frozen=True)
class TrustedKey:
    """A public key allowed to sign checkpoints, with its id and where it came from."""

    key_id: str
    public_key: ec.EllipticCurvePublicKey
    source: str


@dataclass(frozen=True)
class TrustedKeys:
    """The set of trusted keys, by key id; ``source`` names the file or directory for messages."""

    by_id: Mapping[str, TrustedKey]
    source: str

    def get(self, hint: str) -> TrustedKey | None:
        """The trusted key with this id, if any."""
        return self.by_id.get(hint)

    def __iter__(self) -> Iterator[TrustedKey]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)


def trusted_keys_from(keys: Iterable[ec.EllipticCurvePublicKey], source: str = "<memory>") -> TrustedKeys:
    """Builds a trust set from in-memory public keys (e.g. the signer's own)."""
    entries = {key_id(k): TrustedKey(key_id(k), k, source) for k in keys}
    return TrustedKeys(entries, source)


def load_trusted_keys(path: str | os.PathLike[str]) -> TrustedKeys:
    """Loads one public key file, or every ``*.pub`` in a directory (sorted).

    Raises KeyFileError if the path does not exist, a file is not a P-256 public key,
    or a directory holds no ``*.pub``.
    """
    where = os.fspath(path)
    if os.path.isdir(where):
        files = sorted(glob.glob(os.path.join(glob.escape(where), "*" + PUBLIC_KEY_SUFFIX)))
        if not files:
            raise KeyFileError(f"{where}: no *{PUBLIC_KEY_SUFFIX} files; add the signer's public key there")
    elif os.path.exists(where):
        files = [where]
    else:
        raise KeyFileError(f"{where}: trusted key file or directory not found; pass --trust FILE_OR_DIR")
    entries: dict[str, TrustedKey] = {}
    for file in files:
        key = load_public_key(file)
        entries.setdefault(key_id(key), TrustedKey(key_id(key), key, file))
    return TrustedKeys(entries, where)
