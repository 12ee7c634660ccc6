"""Hashed ``requirements.txt`` locks, as written by pip-tools (``--generate-hashes``) and ``uv export``.

Grammar handled: ``\\`` continuations, ``#`` comments, ``name[extras]==version ; marker``
with ``--hash=algo:hex`` options, ``name @ url``, bare URLs and paths, ``-e``/``--editable``,
and the global options pip accepts in such files (index URLs, ``--require-hashes``...).
``-r``/``-c`` includes are reported, not followed: a lock must be one file.
"""

from __future__ import annotations

import hashlib
import os
import re
import string

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from warden.deps.locks import Lock, LockedPackage, LockOption, LockProblem, LockSource

_COMMENT = re.compile(r"(^|\s+)#.*$")
_HASH = re.compile(r"(?:^|\s)--hash(?:=|\s+)(\S+)")
_INDEX_OPTIONS = {
    "-i": "--index-url",
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "-f": "--find-links",
    "--find-links": "--find-links",
    "--trusted-host": "--trusted-host",
}
_GLOBAL_WITH_VALUE = {*_INDEX_OPTIONS, "--no-binary", "--only-binary"}
_GLOBAL_FLAGS = {"--no-index", "--require-hashes", "--pre", "--prefer-binary"}
_INCLUDES = {"-r", "--requirement", "-c", "--constraint"}
_VCS = ("git+", "hg+", "svn+", "bzr+")
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line: continuations joined, comments cut."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw)
        if not buf:
            start = number
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        joined = " ".join(part.strip() for part in buf).strip()
        buf = []
        if joined:
            out.append((start, joined))
    if buf and " ".join(buf).strip():
        out.append((start, " ".join(part.strip() for part in buf).strip()))
    return out


def _check_hash(value: str) -> str | None:
    """An error message for a malformed ``algo:hex`` value, else None."""
    algo, sep, digest = value.partition(":")
    if not sep or not digest:
        return f"--hash={value}: expected ALGO:HEXDIGEST (e.g. sha256:...)"
    if algo not in hashlib.algorithms_guaranteed:
        return f"--hash={value}: unknown hash algorithm {algo!r}"
    if set(digest) - set(string.hexdigits) or len(digest) != 2 * hashlib.new(algo).digest_size:
        return f"--hash={value}: not a {algo} hex digest"
    return None


class RequirementsSource(LockSource):
    format = "requirements"

    @classmethod
    def handles(cls, path: str) -> bool:
        base = os.path.basename(path)
        return base.endswith((".txt", ".in")) or base.startswith("requirements")

    def parse(self, text: str, path: str) -> Lock:
        packages: list[LockedPackage] = []
        problems: list[LockProblem] = []
        options: list[LockOption] = []
        for number, line in logical_lines(text):
            where = f"{path}:{number}"
            result = self._parse_line(line, where)
            if isinstance(result, LockProblem):
                problems.append(result)
            elif isinstance(result, LockOption):
                options.append(result)
            elif result is not None:
                packages.append(result)
        return Lock(
            path=path, format=self.format, packages=tuple(packages), problems=tuple(problems), options=tuple(options)
        )

    def _parse_line(self, line: str, where: str) -> LockedPackage | LockProblem | LockOption | None:
        first = line.split(None, 1)[0]
        option = first.split("=", 1)[0]
        if option in _INDEX_OPTIONS:
            value = first.partition("=")[2] or (line.split(None, 1)[1].strip() if " " in line else None)
            return LockOption(where, _INDEX_OPTIONS[option], value)
        if option in _INCLUDES:
            return LockProblem(where, "unsupported_include", f"{where}: {option} is not followed; a lock is one file")
        if option in _GLOBAL_FLAGS or option in _GLOBAL_WITH_VALUE:
            return None
        if option in ("-e", "--editable"):
            target = line.split(None, 1)[1] if " " in line else line.partition("=")[2]
            return self._editable(target.strip(), where)
        if first.startswith("-"):
            return LockProblem(where, "malformed", f"{where}: unknown option {option!r}")
        hashes = _HASH.findall(line)
        rest = _HASH.sub(" ", line).strip()
        for value in hashes:
            error = _check_hash(value)
            if error:
                return LockProblem(where, "malformed", f"{where}: {error}")
        if re.search(r"(^|\s)--?[A-Za-z]", rest):
            return LockProblem(where, "malformed", f"{where}: unexpected option in {rest!r}; only --hash may follow")
        return self._requirement(rest, tuple(hashes), where)

    def _editable(self, target: str, where: str) -> LockedPackage:
        egg = _EGG.search(target)
        name = egg.group(1) if egg else os.path.basename(target.rstrip("/")) or target
        return LockedPackage(
            name=name,
            canonical=canonicalize_name(name),
            version=None,
            spec=f"-e {target}",
            where=where,
            source="editable",
            url=target,
        )

    def _requirement(self, text: str, hashes: tuple[str, ...], where: str) -> LockedPackage | LockProblem:
        if text.startswith(_VCS) or "://" in text.split(" ", 1)[0] or text.startswith((".", "/")):
            egg = _EGG.search(text)
            name = egg.group(1) if egg else text
            source = "vcs" if text.startswith(_VCS) else ("url" if "://" in text else "directory")
            canonical = canonicalize_name(name) if egg else name
            complete = any(h.startswith("sha256:") for h in hashes)
            return LockedPackage(
                name, canonical, None, text, where, hashes=hashes, source=source, url=text, sha256_complete=complete
            )
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            first = str(exc).splitlines()[0]
            return LockProblem(where, "malformed", f"{where}: cannot parse {text!r}: {first}")
        source, url = "registry", req.url
        if url:
            source = "vcs" if url.startswith(_VCS) else ("directory" if url.startswith("file:") else "url")
        specs = list(req.specifier)
        version = None
        if len(specs) == 1 and specs[0].operator == "==" and not specs[0].version.endswith(".*") and not url:
            version = specs[0].version
        return LockedPackage(
            name=req.name,
            canonical=canonicalize_name(req.name),
            version=version,
            spec=str(req.specifier) or (f"@ {url}" if url else ""),
            where=where,
            marker=str(req.marker) if req.marker else None,
            extras=tuple(sorted(req.extras)),
            hashes=hashes,
            source=source,
            url=url,
            sha256_complete=any(h.startswith("sha256:") for h in hashes),
        )
