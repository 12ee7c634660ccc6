"""Lock sources behind one interface: PEP 751 ``pylock.toml`` and hashed ``requirements.txt``.

A source turns a file into a :class:`Lock`: every entry it could parse as a
:class:`LockedPackage` (pinned or not: hygiene judges that), and every entry it could not
as a :class:`LockProblem`. A source raises :class:`LockError` only when the file as a whole
is unusable (missing, unreadable, not TOML); a bad line never stops the audit.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from warden.errors import ConfigError


class LockError(ConfigError):
    """A lock file is missing, unreadable or not in any supported format (exit 2)."""


@dataclass(frozen=True)
class LockedPackage:
    """One entry of a lock.

    ``version`` is the exact pinned version, or None when the entry is not an exact ``==``
    pin (``spec`` then holds what was written). ``hashes`` are ``algo:hexdigest`` strings.
    ``source`` is ``registry``, ``url``, ``vcs``, ``editable`` or ``directory``.
    ``where`` names the file and line (or TOML key) for messages. ``sha256_complete``: every
    file the entry may install is covered by a sha256 hash.
    """

    name: str
    canonical: str
    version: str | None
    spec: str
    where: str
    marker: str | None = None
    extras: tuple[str, ...] = ()
    hashes: tuple[str, ...] = ()
    source: str = "registry"
    url: str | None = None
    sha256_complete: bool = False
    urls: tuple[str, ...] = ()  # every artifact or index URL the entry names (pylock)
    # The sdist (its name, URL or path) when the entry pins an sdist and no wheel: what is installed
    # was built locally from it (pylock; a requirements lock does not say which artifact a hash is of).
    sdist_only: str | None = None


@dataclass(frozen=True)
class LockProblem:
    """An entry that could not be parsed; ``kind`` is a hygiene finding kind."""

    where: str
    kind: str
    message: str


@dataclass(frozen=True)
class LockOption:
    """A global option of a requirements lock that changes where pip looks (``--index-url``...)."""

    where: str
    option: str
    value: str | None


@dataclass(frozen=True)
class Lock:
    path: str
    format: str
    packages: tuple[LockedPackage, ...]
    problems: tuple[LockProblem, ...] = ()
    environments: tuple[str, ...] = ()
    requires_python: str | None = None
    options: tuple[LockOption, ...] = ()


class LockSource(ABC):
    """Parses one lock format. Subclasses are stateless."""

    format: ClassVar[str]

    @classmethod
    @abstractmethod
    def handles(cls, path: str) -> bool:
        """Whether ``path`` (by its name) is in this source's format."""

    @abstractmethod
    def parse(self, text: str, path: str) -> Lock:
        """Parses ``text`` read from ``path``. Raises LockError if the file is unusable."""

    def load(self, path: str) -> Lock:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise LockError(f"{path}: lock file not found; set lock.path in the policy or pass --lock FILE") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LockError(f"{path}: cannot read lock file: {exc}") from None
        return self.parse(text, path)


def source_for(path: str) -> LockSource:
    """The source for ``path``: ``pylock.toml``/``pylock.*.toml`` or a requirements file."""
    from warden.deps.locks.pylock import PylockSource
    from warden.deps.locks.requirements import RequirementsSource

    for cls in (PylockSource, RequirementsSource):
        if cls.handles(path):
            return cls()
    raise LockError(
        f"{path}: unknown lock format; expected pylock.toml / pylock.<name>.toml (PEP 751) "
        "or a hashed requirements file (*.txt)"
    )


def load_lock(path: str) -> Lock:
    """Reads the lock at ``path`` with the source its name selects."""
    return source_for(os.fspath(path)).load(os.fspath(path))
