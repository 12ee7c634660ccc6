"""Entrypoint of the services that sign (signer, archiver): a private copy of the key, then warden.

Compose file secrets are bind mounts that keep the host file's owner and mode (podman and
Docker alike ignore ``uid``/``mode`` for them outside swarm), so a 0600 key owned by the
operator is unreadable by the service user (uid 10001). Started as root, this:

1. refuses a secret that group or others may access (the same rule as the key check);
2. copies it into ``$WARDEN_KEY_DIR`` (a tmpfs: the key never lands on disk), the directory
   0700 and the file 0600, both owned by the service user;
3. drops to the service user (no supplementary groups; root's capabilities are gone after
   setuid) and execs ``warden ARGS`` with ``WARDEN_SIGNING_KEY`` naming the copy.

The signer's own key check (owner = euid, mode 0600, directory not writable by others)
then runs unchanged on the copy. Started as a non-root user it only execs warden.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys

SECRET_ENV = "WARDEN_KEY_SECRET"  # the mounted secret, e.g. /run/secrets/signing_key
DIR_ENV = "WARDEN_KEY_DIR"  # where the private copy goes (a tmpfs)
USER_ENV = "WARDEN_USER"


def fail(message: str) -> None:
    print(f"key-entrypoint: {message}", file=sys.stderr)
    sys.exit(2)  # a configuration error, like the key check's own refusal


def copy_key(secret: str, key_dir: str, uid: int, gid: int) -> str:
    try:
        fd = os.open(secret, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        fail(f"{secret}: cannot read the signing key secret: {exc.strerror}")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            fail(f"{secret}: the signing key secret is not a regular file")
        if st.st_mode & 0o077:
            fail(
                f"{secret}: private key is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                "run on the host: chmod 600 on the file the secret names"
            )
        data = fh.read()
    os.makedirs(key_dir, mode=0o700, exist_ok=True)
    dst = os.path.join(key_dir, "signing.key")
    tmp = dst + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, 0o600)  # before the chown: afterwards root is no longer the owner (no CAP_FOWNER)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    os.replace(tmp, dst)
    os.chmod(key_dir, 0o700)
    os.chown(key_dir, uid, gid)
    return dst


def main(argv: list[str]) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam(os.environ.get(USER_ENV, "warden"))
        secret = os.environ.get(SECRET_ENV)
        if secret:
            key = copy_key(secret, os.environ.get(DIR_ENV, "/run/warden-key"), user.pw_uid, user.pw_gid)
            os.environ["WARDEN_SIGNING_KEY"] = key
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            fail("could not drop root")
        os.environ.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    os.execvp("warden", ["warden", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
