"""Dependency audit benchmark (issue 7): full and incremental audits, and pip-audit beside us.

Targets:

* ``own``: this project's environment (``.venv``, with torch).
* ``synthetic``: a generated site-packages of ``--dists`` x ``--modules`` modules with RECORDs
  and byte-compiled ``.pyc`` files (about 25,000 files by default), audited as
  ``--site-packages`` (read only).

Per target, one state directory, in this order (issue 21); the best and median of the repeats
are printed at the end, with the load average before each round (the machine may be shared):

* ``cold``: the first audit ever (empty cache): every RECORD file re-hashed and every loadable
  ``.pyc`` compiled and compared (the cost the content-keyed verdict cache removes later);
* ``full``: the periodic full pass with the cache of the cold run: every file re-hashed (pycs
  too), a pair compiled only if its exact bytes were never verified;
* ``incremental``: stat only; files whose stat identity changed are re-hashed.

Every audit covers the target's import closure (issue 31): the directories on its computed
``sys.path`` beyond the stdlib, site-packages and venv (an editable install's source tree), read
from files, the target never run.
``--repeat`` repeats full and incremental; every figure is printed.

Anchors measured in the same run: ``walk+stat`` (listing and stat-ing every file: the floor
of an incremental audit) and ``read+sha256`` (one thread reading and hashing every file: the
floor of a full re-hash without parallelism). Ratios are audit time / anchor.

Vulnerabilities: a synthetic OSV database (``--records`` records over the target's packages)
is served by ``osv-serve``; ``pip-audit --disable-pip --no-deps -r <installed pins>`` against
it is timed beside our offline matcher over the same packages and the same database.

    python bench/bench_deps.py [--target own|synthetic|both] [--dists 250] [--modules 50] [--records 5000]
                               [--repeat 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import py_compile
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from warden.deps.audit import AuditSettings, run_audit  # noqa: E402
from warden.deps.environment import Target, discover_python, discover_site_packages  # noqa: E402
from warden.deps.installed import scan_distributions  # noqa: E402
from warden.deps.integrity import record_digest, walk_files  # noqa: E402
from warden.deps.osv.loader import load_database  # noqa: E402
from warden.deps.osv.server import OsvServer  # noqa: E402
from warden.deps.pipaudit import run_pip_audit  # noqa: E402
from warden.deps.policy import DepsPolicy, IntegrityRules, VulnRules  # noqa: E402
from warden.deps.vulns import check_vulnerabilities  # noqa: E402

SOURCE = (
    '"""Synthetic module {i} of {dist}."""\n\nimport os\n\n\n'
    "def f_{i}(x):\n    return [x * k for k in range({i})]\n\n\n"
    "class C{i}:\n    value = {i}\n" + "# padding\n" * 40
)


def make_site_packages(root: str, dists: int, modules: int) -> int:
    """Writes ``dists`` distributions of ``modules`` modules each, with RECORD and .pyc files."""
    os.makedirs(root, exist_ok=True)
    files = 0
    for d in range(dists):
        name = f"synth_pkg_{d:04d}"
        pkg = os.path.join(root, name)
        os.makedirs(pkg)
        rows = []
        for i in range(modules):
            path = os.path.join(pkg, f"mod_{i:03d}.py")
            with open(path, "w") as fh:
                fh.write(SOURCE.format(i=i, dist=name))
            pyc = py_compile.compile(path, doraise=True)
            assert pyc is not None  # doraise: a failure raises
            for p in (path, pyc):
                rel = os.path.relpath(p, root)
                rows.append(f"{rel},{record_digest(p, 'sha256')},{os.path.getsize(p)}")
                files += 1
        info = os.path.join(root, f"{name}-1.{d % 7}.0.dist-info")
        os.makedirs(info)
        meta = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.{d % 7}.0\n\n", "INSTALLER": "pip\n"}
        for fname, text in meta.items():
            with open(os.path.join(info, fname), "w") as fh:
                fh.write(text)
            full = os.path.join(info, fname)
            rows.append(f"{os.path.relpath(full, root)},{record_digest(full, 'sha256')},")
        rows.append(f"{os.path.relpath(info, root)}/RECORD,,")
        with open(os.path.join(info, "RECORD"), "w") as fh:
            fh.write("\n".join(rows) + "\n")
        files += 3
    return files


def make_osv(path: str, packages: list[tuple[str, str]], records: int, seed: int = 7) -> None:
    """``records`` OSV records over ``packages``; about one in ten affects the installed version."""
    rng = random.Random(seed)
    with zipfile.ZipFile(path, "w") as zf:
        for n in range(records):
            name, _version = rng.choice(packages)
            hit = rng.random() < 0.1
            events = [{"introduced": "0"}, {"fixed": "99999"}] if hit else [{"introduced": "0"}, {"fixed": "0.0.1"}]
            rec = {
                "id": f"BENCH-{n:06d}",
                "modified": "2026-11-30T00:00:00Z",
                "aliases": [f"CVE-2099-{n:06d}"],
                "affected": [
                    {
                        "package": {"ecosystem": "PyPI", "name": name},
                        "ranges": [{"type": "ECOSYSTEM", "events": events}],
                    }
                ],
                "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:N/A:N"}],
            }
            zf.writestr(f"{rec['id']}.json", json.dumps(rec))


def anchors(target: Target) -> tuple[float, float, int, int]:
    """(walk+stat seconds, single-thread read+sha256 seconds, files, bytes)."""
    start = time.perf_counter()
    walked: dict[str, os.stat_result] = {}
    for root in target.site_packages:
        walked.update(walk_files(root))
    walk = time.perf_counter() - start
    start = time.perf_counter()
    total = 0
    for path, st in walked.items():
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, "sha256")
        total += st.st_size
    return walk, time.perf_counter() - start, len(walked), total


def audit_once(target: Target, state: str, full: bool) -> dict:
    policy = DepsPolicy(integrity=IntegrityRules(workers=0), vulnerabilities=VulnRules(pip_audit_crosscheck=False))
    settings = AuditSettings(policy, None, None, state, None, checks=frozenset({"integrity"}), pip_audit=False)
    cpu = os.times()
    rep = run_audit(AuditSettings(**{**settings.__dict__, "full_pass": full}), target)
    after = os.times()  # this process and the .pyc workers it waited for
    used = sum(after[i] - cpu[i] for i in range(4))
    return {"seconds": rep.duration, "cpu": used, **rep.stats["integrity"], "findings": len(rep.findings)}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} CPUs"


def _summary(label: str, runs: list[dict]) -> str:
    """Best and median wall time (and CPU seconds) of ``runs``: the machine may be shared."""
    walls = sorted(r["seconds"] for r in runs)
    cpus = sorted(r["cpu"] for r in runs)
    mid = len(walls) // 2
    return (
        f"   {label:<18}best {walls[0]:6.2f}s, median {walls[mid]:6.2f}s wall "
        f"(CPU best {cpus[0]:.2f}s, median {cpus[mid]:.2f}s) over {len(runs)} runs"
    )


def _line(label: str, run: dict, anchor: float, anchor_name: str) -> str:
    return (
        f"   {label:<18}{run['seconds']:7.2f}s = {run['seconds'] / anchor:5.2f}x {anchor_name}; "
        f"{run['files_hashed']} hashed, {run['files_cached']} cached; .pyc: {run['pyc_checked']} compiled, "
        f"{run['pyc_verdict_cached']} by verdict, {run['pyc_cached']} by stat; base stdlib: "
        f"{run['stdlib_hashed']} hashed, {run['stdlib_cached']} cached; import closure: "
        f"{run.get('closure_roots', 0)} more roots, {run.get('closure_files', 0)} files; "
        f"{run['dists_cached']} dists judged whole, "
        f"{run['dirs_listed']}/{run['dirs_walked']} dirs listed; CPU {run['cpu']:.2f}s; {run['findings']} findings"
    )


def bench_target(label: str, target: Target, records: int, repeat: int) -> None:
    walk, hashing, files, size = anchors(target)
    print(f"\n== {label}: {target.description}")
    print(
        f"   {files} files, {size / 2**20:.0f} MiB; anchors: walk+stat {walk:.2f}s, "
        f"read+sha256 (1 thread) {hashing:.2f}s"
    )
    fulls: list[dict] = []
    incrs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-deps-") as state:
        cold = audit_once(target, state, True)
        print(_line("cold (no cache)", cold, hashing, "read+sha256"))
        for n in range(repeat):
            print(f"   ({_load()})")
            full = audit_once(target, state, True)
            print(_line(f"full #{n + 1}", full, hashing, "read+sha256"))
            incr = audit_once(target, state, False)
            print(_line(f"incremental #{n + 1}", incr, walk, "walk+stat"))
            fulls.append(full)
            incrs.append(incr)
    if fulls:
        print(_summary("full", fulls))
        print(_summary("incremental", incrs))
    bench_vulns(target, records)


def bench_vulns(target: Target, records: int) -> None:
    dists = [d for root in target.site_packages for d in scan_distributions(root)]
    with tempfile.TemporaryDirectory(prefix="bench-osv-") as tmp:
        db_path = os.path.join(tmp, "all.zip")
        make_osv(db_path, [(d.canonical, d.version) for d in dists], records)
        start = time.perf_counter()
        db = load_database(db_path)
        load = time.perf_counter() - start
        start = time.perf_counter()
        ours, _ = check_vulnerabilities(db, dists)
        match = time.perf_counter() - start
        server = OsvServer(db).start()
        try:
            start = time.perf_counter()
            theirs = run_pip_audit(dists, server.query_url)
            pip_audit = time.perf_counter() - start
        finally:
            server.stop()
    theirs_count = sum(len(v) for v in theirs.vulns.values())
    print(
        f"   vulns: {len(dists)} packages x {records} OSV records: load {load:.2f}s, match {match * 1000:.1f}ms "
        f"({len(ours)} findings); pip-audit --disable-pip via osv-serve {pip_audit:.2f}s ({theirs_count} findings)"
        f" = {pip_audit / max(match, 1e-6):.0f}x our matcher, {pip_audit / (load + match):.1f}x load+match"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=["own", "synthetic", "both"], default="both")
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    parser.add_argument("--dists", type=int, default=250)
    parser.add_argument("--modules", type=int, default=50)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=2, help="full + incremental rounds after the cold audit")
    args = parser.parse_args()
    print(f"bench_deps: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {_load()}")
    if args.target in ("own", "both"):
        bench_target("own environment", discover_python(args.python), args.records, args.repeat)
    if args.target in ("synthetic", "both"):
        tmp = tempfile.mkdtemp(prefix="bench-site-")
        try:
            site = os.path.join(tmp, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
            start = time.perf_counter()
            count = make_site_packages(site, args.dists, args.modules)
            print(f"\n(generated {count} files in {time.perf_counter() - start:.1f}s)")
            subprocess.run(["sync"], check=False)
            bench_target("synthetic site-packages", discover_site_packages(site), args.records, args.repeat)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
