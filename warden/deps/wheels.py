"""Installed files vs the locked wheel (issue 19): ``record_mismatch``, ``wheel_missing``, ``wheel_unusable``.

For each installed distribution whose lock entry lists hashes, the wheel files of its name and
version in ``lock.wheel_dirs`` (a wheelhouse, a ``pip download`` directory) are hashed; one
whose sha256 the lock lists is the locked artifact, and its own ``*.dist-info/RECORD`` must
describe exactly what the installed RECORD lists (the installed files themselves are re-hashed
against the installed RECORD by records.py, and that RECORD against the approved baseline).
This closes the gap the approved baseline leaves: a rebuilt wheel of the locked name and version,
installed from an index before the first approval, has a RECORD of its own, which the baseline
would bless and ``direct_url.json`` (URL installs only) would never show.

Why the wheel's RECORD is enough and its members are not re-hashed here: the lock's sha256
authenticates the wheel file as a whole, and the RECORD is read from the very descriptor that
was hashed (no second open a swap could slip into); members that disagreed with that RECORD
would make pip refuse the install, and what was installed is compared with the installed RECORD
by the re-hash anyway.

Known, legitimate differences between the two RECORDs (nothing else is):

- ``<name>.data/purelib|platlib/X`` is installed as ``X``; ``.data/scripts|headers|data/X``
  lands outside site-packages, in the scheme's own directory of a ``<prefix>/lib/pythonX.Y/
  site-packages`` layout (``../../../bin/X``, ``../../../include/.../X``, ``../../../X``;
  launchers.py), matched by that path and its hash (by the path's tail only for a bare
  site-packages whose prefix is unknown);
- a ``.data/scripts`` file whose first line is ``#!python`` gets the interpreter's shebang: the
  installed script must have the hash its RECORD row names, a shebang naming the environment's own
  ``python*`` with no arguments, and equal the wheel's but for line 1;
- rows the installer adds to the dist-info (``INSTALLER``, ``REQUESTED``, ``direct_url.json``,
  ``RECORD``), ``__pycache__/*.pyc`` rows (bytecode.py compares each with its source), and the
  console/gui-script launchers of the wheel's ``entry_points.txt`` in the scripts directory,
  each read and accepted only as the generated stub calling that entry point (launchers.py).

Hostile wheel files never hang or crash the audit: nothing is followed (a link or FIFO named like
a wheel is a problem, never opened), opens are non-blocking and regular-only with a size cap, and
the zip is read with caps on the member count and on each member read. Incremental: a wheel
whose stat identity is unchanged keeps its sha256, and a (installed RECORD, wheel sha256) pair
verified equal keeps its verdict (cache.py), so a re-audit opens no wheel.
"""

from __future__ import annotations

import configparser
import hashlib
import lzma
import os
import posixpath
import struct
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from warden.deps.cache import IntegrityCache
from warden.deps.drift import normal_hash, same_version
from warden.deps.errors import DepsIncomplete
from warden.deps.installed import InstalledDist, RecordEntry, parse_record
from warden.deps.launchers import InstallLayout, allowed_shebang, install_layout, is_entry_point_launcher
from warden.deps.locks import LockedPackage
from warden.deps.model import Finding
from warden.deps.pyccheck import record_form
from warden.deps.walk import Changed, kind_of, read_small, same_file, settled
from warden.errors import quote_untrusted
from warden.safeio import open_regular_fd, stat_identity

WHEEL_KINDS = ("record_mismatch", "wheel_missing", "wheel_unusable")
MAX_WHEEL_BYTES = 8 * 1024**3  # the largest wheels (CUDA builds of torch) are a few GiB
MAX_MEMBERS = 200_000
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_SMALL_MEMBER = 4 * 1024 * 1024  # entry_points.txt, each .data/scripts file
MAX_SCRIPTS = 2_000
SHOWN = 5  # differing paths named in a message (details keep up to 50)
VERDICT_VERSION = "wheel-record-v2"  # v2: launchers and shebangs checked by content
INSTALLER_ROWS = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})
SIGNATURE_ROWS = frozenset({"RECORD", "RECORD.jws", "RECORD.p7s"})
RELOCATED = ("scripts", "headers", "data")


class WheelUnusable(DepsIncomplete):
    """A wheel file that cannot be read as a wheel within the caps (caught here, reported as a finding)."""


@dataclass(frozen=True)
class WheelOptions:
    """``dirs``: absolute directories holding the locked wheel files (not searched recursively);
    ``require``: a locked distribution without its wheel there fails the audit (else a warning)."""

    dirs: tuple[str, ...] = ()
    require: bool = False
    max_bytes: int = MAX_WHEEL_BYTES


@dataclass(frozen=True)
class Candidate:
    """A file in ``dirs`` named like a wheel of one name and version (``problem``: why it is never opened)."""

    path: str
    st: os.stat_result
    problem: str | None = None


@dataclass(frozen=True)
class WheelContent:
    """What the comparison needs from one wheel file (read from the descriptor that was hashed)."""

    sha256: str
    dist_info: str
    rows: tuple[RecordEntry, ...]
    scripts: Mapping[str, bytes]
    entry_scripts: Mapping[str, str]  # launcher name -> entry point (module:attr)


@dataclass
class WheelStats:
    dists: int = 0
    verified: int = 0
    cached: int = 0
    wheels_read: int = 0
    missing: int = 0
    mismatched: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "notes"}


# ---- pure ------------------------------------------------------------------------------------


def entry_point_scripts(text: str) -> dict[str, str]:
    """``{name: module:attr}`` of the ``[console_scripts]`` and ``[gui_scripts]`` of an
    ``entry_points.txt`` (pure; an unparsable file names none, so its launchers become differences)."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text)
    except configparser.Error:
        return {}
    sections = [parser[s] for s in ("console_scripts", "gui_scripts") if parser.has_section(s)]
    return {name.strip(): section[name].strip() for section in sections for name in section}


def rewritten_script(
    wheel_bytes: bytes,
    installed_bytes: bytes,
    layout: InstallLayout | None = None,
    same_interpreter: Callable[[str], bool] | None = None,
) -> bool:
    """Whether ``installed_bytes`` is ``wheel_bytes`` with its ``#!python`` line replaced by the
    shebang of the environment's interpreter (launchers.allowed_shebang; pure but for the callback)."""
    if not wheel_bytes.startswith(b"#!python"):
        return False
    first, _, body = installed_bytes.partition(b"\n")
    return allowed_shebang(first, layout, same_interpreter) and wheel_bytes.partition(b"\n")[2] == body


def _installer_row(path: str, meta: str) -> bool:
    head, _, name = path.rpartition("/")
    if head == meta and name in INSTALLER_ROWS:
        return True
    return head.endswith("__pycache__") and head.rpartition("/")[2] == "__pycache__" and name.endswith(".pyc")


def _launcher_spec(path: str, entry_scripts: Mapping[str, str], layout: InstallLayout | None) -> str | None:
    """The entry point a launcher row at ``path`` must call, None when the row is no launcher's place."""
    head, _, name = path.rpartition("/")
    if not path.startswith("../") or name not in entry_scripts:
        return None
    if layout is not None and head != layout.scripts:
        return None
    return entry_scripts[name] if layout is not None or head.rpartition("/")[2] in ("bin", "Scripts") else None


def compare_records(
    wheel: WheelContent,
    meta: str,
    installed: Sequence[RecordEntry],
    script_ok: Callable[[str, str | None, bytes], bool],
    launcher_ok: Callable[[str, str | None, str], bool],
    layout: InstallLayout | None = None,
) -> list[str]:
    """Every difference between the locked wheel's RECORD and the installed one, as 'path: why'
    lines, sorted (pure but for the two callbacks, which read an installed file: ``script_ok(path,
    its RECORD digest, wheel bytes)`` for a script whose shebang was rewritten, ``launcher_ok(path,
    digest, entry point)`` for a console-script launcher). ``meta``: the installed dist-info's name;
    ``layout``: where the environment's install schemes are (None: unknown)."""
    diffs: list[str] = []
    if wheel.dist_info != meta:
        diffs.append(f"{meta}: the locked wheel's metadata directory is {wheel.dist_info}")
    ours = {posixpath.normpath(e.path): e.digest for e in installed}
    outside = [p for p in ours if p.startswith("../")]
    matched: set[str] = set()
    data = wheel.dist_info[: -len(".dist-info")] + ".data/"
    for row in wheel.rows:
        path = posixpath.normpath(row.path)
        head, _, name = path.rpartition("/")
        if head == wheel.dist_info and name in SIGNATURE_ROWS:
            continue
        if not path.startswith(data):
            diffs.extend(_same(path, row.digest, ours, matched))
            continue
        scheme, _, rest = path[len(data) :].partition("/")
        if scheme in ("purelib", "platlib"):
            diffs.extend(_same(rest, row.digest, ours, matched))
        elif scheme in RELOCATED and rest:
            places = _scheme_places(scheme, rest, outside, layout)
            diffs.extend(_relocated(path, row.digest, ours, places, matched, wheel.scripts, script_ok))
        else:
            diffs.append(f"{path}: in the locked wheel under an unknown install scheme")
    for path in ours:
        if path in matched or _installer_row(path, meta):
            continue
        spec = _launcher_spec(path, wheel.entry_scripts, layout)
        if spec is None:
            diffs.append(f"{path}: in the installed RECORD, not in the locked wheel")
        elif not launcher_ok(path, ours[path], spec):
            diffs.append(f"{path}: a launcher of {spec} that is not the generated stub calling it")
    return sorted(diffs)


def _scheme_places(scheme: str, rest: str, outside: Sequence[str], layout: InstallLayout | None) -> list[str]:
    """Installed rows where ``.data/<scheme>/<rest>`` may have landed: the scheme's own path when
    the layout is known (headers: any folder under include ending in ``rest``), else any row
    outside site-packages with that tail."""
    if layout is None:
        return [p for p in outside if p.endswith("/" + rest)]
    if scheme == "headers":
        return [p for p in outside if p.startswith(layout.headers + "/") and p.endswith("/" + rest)]
    exact = posixpath.normpath(f"{layout.scripts if scheme == 'scripts' else layout.data}/{rest}")
    return [p for p in outside if p == exact]


def _same(path: str, digest: str | None, ours: Mapping[str, str | None], matched: set[str]) -> list[str]:
    if path not in ours:
        return [f"{path}: in the locked wheel, not in the installed RECORD"]
    matched.add(path)
    if ours[path] != digest:
        return [f"{path}: the installed RECORD's hash is not the locked wheel's"]
    return []


def _relocated(
    path: str,
    digest: str | None,
    ours: Mapping[str, str | None],
    places: Sequence[str],
    matched: set[str],
    scripts: Mapping[str, bytes],
    script_ok: Callable[[str, str | None, bytes], bool],
) -> list[str]:
    """A ``.data/scripts|headers|data`` file: one of ``places`` with its hash (a script: or rewritten)."""
    found = [p for p in places if p not in matched]
    for candidate in found:
        if ours[candidate] == digest and digest:
            matched.add(candidate)
            return []
    if path in scripts:
        for candidate in found:
            if script_ok(candidate, ours[candidate], scripts[path]):
                matched.add(candidate)
                return []
    if not found:
        return [f"{path}: in the locked wheel, not in the installed RECORD"]
    matched.add(found[0])  # one difference, not a second one for the installed row
    return [f"{path}: installed as {found[0]} with a hash that is not the locked wheel's"]


def verdict_key(dist: InstalledDist, wheel_sha256: str) -> str:
    """Key of a verified-equal (installed RECORD, locked wheel) pair (pure)."""
    text = "\0".join((VERDICT_VERSION, os.path.basename(dist.meta_dir), dist.record_sha256 or "", wheel_sha256))
    return hashlib.sha256(text.encode()).hexdigest()


def index_candidates(entries: Iterable[Candidate]) -> dict[tuple[str, Version], list[Candidate]]:
    """Candidates by (canonical name, version) as their file names say (pure; bad names are skipped)."""
    out: dict[tuple[str, Version], list[Candidate]] = {}
    for cand in entries:
        try:
            name, version, _build, _tags = parse_wheel_filename(os.path.basename(cand.path))
        except (InvalidWheelFilename, InvalidVersion):
            continue
        out.setdefault((str(name), version), []).append(cand)
    return out


# ---- I/O edges -------------------------------------------------------------------------------


def list_candidates(dirs: Sequence[str]) -> tuple[list[Candidate], list[str]]:
    """Every ``*.whl`` entry directly in ``dirs`` with its lstat (nothing followed), and 'dir: why'
    lines for directories that cannot be listed."""
    out: list[Candidate] = []
    problems: list[str] = []
    for directory in dirs:
        try:
            with os.scandir(directory) as it:
                entries = [e for e in it if e.name.endswith(".whl")]
        except OSError as exc:
            problems.append(f"{directory}: cannot list lock.wheel_dirs entry ({exc.strerror or exc})")
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                problems.append(f"{entry.path}: cannot stat ({exc.strerror or exc})")
                continue
            kind = kind_of(st.st_mode)
            problem = None if kind == "file" else f"a {kind}, never opened"
            out.append(Candidate(entry.path, st, problem))
    return sorted(out, key=lambda c: c.path), problems


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> bytes:
    """One member, refused above ``cap`` bytes whatever its header claims (a zip bomb stops at the cap)."""
    if info.file_size > cap:
        raise WheelUnusable(f"{info.filename}: {info.file_size} bytes, over the {cap}-byte cap")
    with zf.open(info) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise WheelUnusable(f"{info.filename}: more than the {cap}-byte cap")
    return data


def _content(sha256: str, zf: zipfile.ZipFile) -> WheelContent:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise WheelUnusable(f"{len(infos)} members, over the {MAX_MEMBERS} cap")
    records = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise WheelUnusable(f"{len(records)} top-level *.dist-info/RECORD members (a wheel has exactly one)")
    dist_info = records[0].filename.partition("/")[0]
    try:
        rows = parse_record(_member(zf, records[0], MAX_RECORD_BYTES))
    except ValueError as exc:
        raise WheelUnusable(f"{records[0].filename}: {exc}") from None
    data = dist_info[: -len(".dist-info")] + ".data/scripts/"
    script_infos = [i for i in infos if i.filename.startswith(data) and not i.is_dir()]
    if len(script_infos) > MAX_SCRIPTS:
        raise WheelUnusable(f"{len(script_infos)} scripts, over the {MAX_SCRIPTS} cap")
    scripts = {i.filename: _member(zf, i, MAX_SMALL_MEMBER) for i in script_infos}
    entry = [i for i in infos if i.filename == f"{dist_info}/entry_points.txt"]
    text = _member(zf, entry[0], MAX_SMALL_MEMBER).decode("utf-8", "replace") if entry else ""
    return WheelContent(sha256, dist_info, rows, scripts, entry_point_scripts(text))


def read_wheel(
    path: str,
    max_bytes: int = MAX_WHEEL_BYTES,
    locked: frozenset[str] | None = None,
    expect: os.stat_result | None = None,
) -> WheelContent:
    """The sha256 of the regular file ``path`` and, when it is one of ``locked`` (``sha256:hex``; None:
    any), its RECORD, scripts and entry points read from the same descriptor. Raises OSError (a
    link, FIFO, a file over ``max_bytes``: warden.safeio; walk.Changed when the descriptor is not
    the file of stat ``expect``, before or after hashing) or WheelUnusable; returns rows=() when
    the hash is not locked (the zip is then never parsed)."""
    fd = open_regular_fd(path, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as fh:
        if expect is not None and not same_file(os.fstat(fd), expect):
            raise Changed(path)
        sha = hashlib.file_digest(fh, "sha256").hexdigest()
        if expect is not None and not same_file(os.fstat(fd), expect):
            raise Changed(path)  # written while hashed: the sha is of no stat identity
        if locked is not None and f"sha256:{sha}" not in locked:
            return WheelContent(sha, "", (), {}, {})
        fh.seek(0)
        try:
            with zipfile.ZipFile(fh) as zf:
                return _content(sha, zf)
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            NotImplementedError,
            EOFError,
            RuntimeError,
            zlib.error,  # a corrupt deflate stream in a member
            lzma.LZMAError,
            struct.error,
            ValueError,
        ) as exc:
            raise WheelUnusable(f"not a readable zip ({quote_untrusted(str(exc), 160)})") from None


def _read_installed(site_packages: str, rel: str, digest: str | None) -> bytes | None:
    """The installed file ``rel`` (read without following links, capped) when its content has the
    sha256 its RECORD row names; None otherwise (so the bytes judged are the bytes recorded)."""
    if not digest or not digest.startswith("sha256="):
        return None
    try:
        data = read_small(os.path.normpath(os.path.join(site_packages, rel)), MAX_SMALL_MEMBER)
    except OSError:
        return None
    return data if record_form(data) == digest else None


def _installed_checks(
    site_packages: str, layout: InstallLayout | None
) -> tuple[Callable[[str, str | None, bytes], bool], Callable[[str, str | None, str], bool]]:
    """``script_ok`` and ``launcher_ok`` for compare_records, reading the installed files."""
    own = os.path.realpath(os.path.join(layout.scripts_dir, "python")) if layout is not None else None

    def same_interpreter(path: str) -> bool:
        # The environment's own interpreter under another name (a venv copied from a template).
        return own is not None and os.path.exists(own) and os.path.realpath(path) == own

    def script_ok(rel: str, digest: str | None, wheel_bytes: bytes) -> bool:
        data = _read_installed(site_packages, rel, digest)
        return data is not None and rewritten_script(wheel_bytes, data, layout, same_interpreter)

    def launcher_ok(rel: str, digest: str | None, spec: str) -> bool:
        data = _read_installed(site_packages, rel, digest)
        return data is not None and is_entry_point_launcher(data, spec, layout, same_interpreter)

    return script_ok, launcher_ok


def _finding(kind: str, dist: InstalledDist, message: str, blocking: bool, **details: object) -> Finding:
    return Finding("integrity", kind, dist.canonical, message, blocking, {"dist": dist.canonical, **details})


def _wheel_sha(cand: Candidate, cache: IntegrityCache) -> str | None:
    return cache.wheel_sha(cand.path, stat_identity(cand.st))


def _check_dist(
    dist: InstalledDist,
    pin: LockedPackage,
    candidates: Sequence[Candidate],
    options: WheelOptions,
    cache: IntegrityCache,
    stats: WheelStats,
) -> list[Finding]:
    locked = frozenset(normal_hash(h) for h in pin.hashes)
    usable = [c for c in candidates if c.problem is None]
    for cand in usable:  # fast path: a known wheel and a verified pair, nothing opened
        sha = _wheel_sha(cand, cache)
        if sha and f"sha256:{sha}" in locked and cache.wheel_ok(verdict_key(dist, sha)):
            stats.cached += 1
            return []
    problems = [f"{os.path.basename(c.path)}: {c.problem}" for c in candidates if c.problem]
    mismatches: list[tuple[str, list[str]]] = []
    for cand in usable:
        sha = _wheel_sha(cand, cache)
        if sha and f"sha256:{sha}" not in locked:
            continue  # another build of this version, known by its stat identity
        started = time.time_ns()
        try:
            content = read_wheel(cand.path, options.max_bytes, locked, expect=cand.st)
        except (OSError, WheelUnusable) as exc:
            problems.append(f"{os.path.basename(cand.path)}: {quote_untrusted(str(exc), 200)}")
            continue
        stats.wheels_read += 1
        cacheable = settled(cand.st, started)  # the sha (and the verdict) belong to cand.st's identity
        if cacheable:
            cache.put_wheel_sha(cand.path, stat_identity(cand.st), content.sha256)
        if f"sha256:{content.sha256}" not in locked:
            continue
        layout = install_layout(dist.site_packages)
        script_ok, launcher_ok = _installed_checks(dist.site_packages, layout)
        meta = os.path.basename(dist.meta_dir)
        diffs = compare_records(content, meta, dist.record or (), script_ok, launcher_ok, layout)
        if not diffs:
            if cacheable:
                cache.put_wheel_ok(verdict_key(dist, content.sha256))
            stats.verified += 1
            return []
        mismatches.append((cand.path, diffs))
    if mismatches:
        stats.mismatched += 1
        path, diffs = min(mismatches, key=lambda m: len(m[1]))
        shown = "; ".join(diffs[:SHOWN]) + (f"; and {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else "")
        message = (
            f"{dist.name} {dist.version}: the installed RECORD is not the locked wheel's "
            f"({os.path.basename(path)}, whose sha256 {pin.where} lists): {quote_untrusted(shown, 600)}"
        )
        return [_finding("record_mismatch", dist, message, True, wheel=path, paths=diffs[:50], differences=len(diffs))]
    stats.missing += 1
    where = ", ".join(options.dirs)
    if problems:
        message = (
            f"{dist.name} {dist.version}: no locked wheel in lock.wheel_dirs ({where}) could be read: "
            f"{quote_untrusted('; '.join(problems[:SHOWN]), 600)}; its installed files are not compared with the lock"
        )
        return [_finding("wheel_unusable", dist, message, options.require, problems=problems[:50])]
    message = (
        f"{dist.name} {dist.version}: no wheel in lock.wheel_dirs ({where}) has a sha256 {pin.where} lists "
        f"({len(usable)} of this name and version there); its installed files are not compared with the lock"
    )
    return [_finding("wheel_missing", dist, message, options.require)]


def check_wheels(
    dists: Sequence[InstalledDist],
    locked: Mapping[str, LockedPackage],
    options: WheelOptions,
    cache: IntegrityCache,
) -> tuple[list[Finding], WheelStats]:
    """Findings for every installed dist-info distribution whose lock entry (``locked``, by
    canonical name) pins its version with hashes. Updates ``cache``."""
    stats = WheelStats()
    if not options.dirs:
        return [], stats
    candidates, problems = list_candidates(options.dirs)
    stats.notes.extend(problems)
    index = index_candidates(candidates)
    findings: list[Finding] = []
    for dist in dists:
        pin = locked.get(dist.canonical)
        if pin is None or not pin.hashes or pin.version is None or dist.record is None:
            continue
        if dist.meta_dir.endswith(".egg-info") or not same_version(dist.version, pin.version):
            continue  # egg_info / wrong_version are findings of their own
        try:
            key = (dist.canonical, Version(dist.version))
        except InvalidVersion:
            continue
        stats.dists += 1
        findings.extend(_check_dist(dist, pin, index.get(key, []), options, cache, stats))
    cache.prune_wheels({c.path for c in candidates})
    return findings, stats
