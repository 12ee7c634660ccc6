"""Path watcher benchmark: fault detection latency and probe cost (issue 8).

Detection latency is measured end to end: fault injected -> ``/metrics`` of a running
``warden sidecar run paths`` shows ``warden_path_failure{reason}`` = 1 (scraped every
10 ms). Faults, with a 1 s deadline and a 0.25 s probe interval:

* stuck: a FUSE request that never returns (``tests/sidecars/paths/paths_faultfs.py``)
* ESTALE: the same FUSE filesystem answering ESTALE
* EROFS: a tmpfs remounted read-only (kernel EROFS)
* ENOSPC: a tiny tmpfs filled up (kernel ENOSPC)

Goal: detection within deadline + 0.5 s. The anchor is the deadline itself (a stuck probe
cannot be reported before it); ratios are latency / deadline.

Probe cost per healthy path per round: ``PathWatcher.run_round`` over N healthy paths,
wall and CPU (parent + children) per path; anchors measured side by side: the same probe
run in-process (what the child does, without a process), and starting a bare
``python -I -S -c pass`` (the floor of a fresh child).

The script re-executes itself under ``unshare -m`` (root) so its mounts stay private.

    python bench/bench_paths.py [--trials 3] [--paths 20] [--poll-interval 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from warden.paths import probe  # noqa: E402
from warden.paths.policy import PathSpec  # noqa: E402
from warden.paths.scheduler import PathWatcher  # noqa: E402

FAULTFS = os.path.join(ROOT, "tests", "sidecars", "paths", "paths_faultfs.py")
DEADLINE = 1.0
INTERVAL = 0.25
NS_MARK = "WARDEN_BENCH_PATHS_NS"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return resp.read().decode()


def shows(body: str, name: str, reason: str) -> bool:
    return f'warden_path_failure{{path="{name}",reason="{reason}"}} 1.0' in body


def wait_until(port: int, test: object, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            body = scrape(port)
        except OSError:  # not listening yet
            body = ""
        if body and test(body):  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.01)
    raise RuntimeError(f"condition not met within {timeout}s")


class Lab:
    """The fault fixtures: a FUSE fault filesystem and two tmpfs, in this mount namespace."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.fuse_mnt = os.path.join(base, "fuse")
        self.control = os.path.join(base, "control.json")
        self.ro = os.path.join(base, "ro")
        self.full = os.path.join(base, "full")
        for d in (self.fuse_mnt, self.ro, self.full):
            os.makedirs(d)
        self.fuse_mode("ok")
        self.fuse = subprocess.Popen([sys.executable, FAULTFS, self.fuse_mnt, self.control], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._mounted():
            if time.monotonic() > deadline or self.fuse.poll() is not None:
                raise RuntimeError("faultfs did not mount (needs /dev/fuse, fuse3 and mfusepy)")
            time.sleep(0.02)
        sh("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", self.ro)
        sh("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", self.full)

    def _mounted(self) -> bool:
        with open("/proc/self/mountinfo") as fh:
            return any(line.split(" ")[4] == self.fuse_mnt for line in fh)

    def fuse_mode(self, mode: str) -> None:
        with open(self.control + ".tmp", "w") as fh:
            json.dump({"mode": mode}, fh)
        os.replace(self.control + ".tmp", self.control)

    def set_read_only(self, on: bool) -> None:
        sh("mount", "-o", f"remount,{'ro' if on else 'rw'}", self.ro)

    def set_full(self, on: bool) -> None:
        fill = os.path.join(self.full, "fill")
        if on:
            subprocess.run(["dd", "if=/dev/zero", f"of={fill}", "bs=4k", "count=100"], capture_output=True)
        elif os.path.exists(fill):
            os.unlink(fill)

    def close(self) -> None:
        self.fuse_mode("ok")
        time.sleep(0.1)
        subprocess.run(["fusermount3", "-u", "-z", self.fuse_mnt], capture_output=True)
        if self.fuse.poll() is None:
            self.fuse.terminate()
            self.fuse.wait(5)
        for d in (self.ro, self.full):
            subprocess.run(["umount", "-l", d], capture_output=True)


def detection(trials: int, poll_interval: float) -> dict[str, list[float]]:
    base = tempfile.mkdtemp(prefix="warden-bench-paths-")
    lab = Lab(base)
    common = {"interval_seconds": INTERVAL, "deadline_seconds": DEADLINE}
    policy = {
        "version": 1,
        "check_interval_seconds": 0.2,
        "paths": [
            {"name": "fuse", "path": os.path.join(lab.fuse_mnt, "data"), "writable": True, **common},
            {"name": "ro", "path": lab.ro, "writable": True, **common},
            {"name": "full", "path": lab.full, "writable": True, **common},
        ],
    }
    policy_path = os.path.join(base, "paths.json")  # JSON is YAML
    with open(policy_path, "w") as fh:
        json.dump(policy, fh)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sidecars.cli",
        "sidecar",
        "run",
        "paths",
        "--policy",
        policy_path,
        "--port",
        str(port),
    ]
    cmd += ["--poll-interval", str(poll_interval), "--state-dir", os.path.join(base, "state")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
    faults = {
        "stuck (FUSE hang)": ("fuse", "stuck", lambda on: lab.fuse_mode("hang" if on else "ok")),
        "ESTALE (FUSE)": ("fuse", "stale_handle", lambda on: lab.fuse_mode("estale" if on else "ok")),
        "EROFS (tmpfs ro)": ("ro", "read_only", lab.set_read_only),
        "ENOSPC (tmpfs full)": ("full", "full", lab.set_full),
    }
    results: dict[str, list[float]] = {k: [] for k in faults}
    try:
        healthy = (
            'warden_path_up{path="fuse"} 1.0',
            'warden_path_up{path="ro"} 1.0',
            'warden_path_up{path="full"} 1.0',
        )
        wait_until(port, lambda b: all(h in b for h in healthy), 20)
        for _ in range(trials):
            for label, (name, reason, inject) in faults.items():
                time.sleep(0.13)  # decorrelate injection from the probe schedule
                inject(True)
                results[label].append(wait_until(port, lambda b, n=name, r=reason: shows(b, n, r), 10))
                inject(False)
                wait_until(port, lambda b, n=name: f'warden_path_up{{path="{n}"}} 1.0' in b, 10)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        lab.close()
        shutil.rmtree(base, ignore_errors=True)
    return results


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def probe_cost(n_paths: int, rounds: int) -> dict[str, float]:
    """Seconds per path per round (wall, CPU of parent + child) and the anchors' costs."""
    base = tempfile.mkdtemp(prefix="warden-bench-cost-")
    out: dict[str, float] = {}
    try:
        specs = []
        for i in range(n_paths):
            d = os.path.join(base, f"p{i}")
            os.makedirs(d)
            with open(os.path.join(d, "small.txt"), "w") as fh:
                fh.write("x" * 100)
            specs.append(PathSpec(name=f"p{i}", path=d, writable=True, min_free_bytes="1MiB"))
        watcher = PathWatcher(specs)
        watcher.run_round()  # warm-up
        t0, c0 = time.perf_counter(), cpu_seconds()
        for _ in range(rounds):
            states = watcher.run_round(poll_seconds=0.002)
            assert all(s.healthy for s in states.values()), [s.message for s in states.values()]
        out["wall"] = (time.perf_counter() - t0) / rounds / n_paths
        out["cpu"] = (cpu_seconds() - c0) / rounds / n_paths
        watcher.close()
        spec = specs[0].probe_spec()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(200):
            probe.run_probe(spec)
        out["inproc_wall"] = (time.perf_counter() - t0) / 200
        out["inproc_cpu"] = (time.process_time() - c0) / 200
        t0, c0 = time.perf_counter(), cpu_seconds()
        for _ in range(20):
            subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        out["spawn_wall"] = (time.perf_counter() - t0) / 20
        out["spawn_cpu"] = (cpu_seconds() - c0) / 20
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def row(label: str, ours: float, anchor: float, note: str) -> str:
    return f"{label:<30}{ours * 1e3:>9.2f} ms{anchor * 1e3:>9.2f} ms{ours / anchor:>8.2f}  {note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--paths", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=0.2, help="the runner's --poll-interval")
    args = parser.parse_args()
    if os.environ.get(NS_MARK) != "1":
        unshare = shutil.which("unshare")
        if os.geteuid() != 0 or unshare is None:
            sys.exit("bench_paths needs root and unshare (it mounts tmpfs and FUSE in a private namespace)")
        os.environ[NS_MARK] = "1"
        os.execv(unshare, [unshare, "-m", "--propagation", "private", sys.executable, *sys.argv])
    latencies = detection(args.trials, args.poll_interval)
    cost = probe_cost(args.paths, args.rounds)
    goal = DEADLINE + 0.5
    print(f"detection: deadline {DEADLINE:g}s, interval {INTERVAL:g}s, check 0.2s, runner poll {args.poll_interval:g}s")
    print(f"{'fault':<22}{'median':>9}{'max':>9}{'/deadline':>11}  goal <= {goal:g}s")
    for label, values in latencies.items():
        med, worst = statistics.median(values), max(values)
        verdict = "met" if worst <= goal else "MISSED"
        print(f"{label:<22}{med:>8.3f}s{worst:>8.3f}s{worst / DEADLINE:>11.2f}  {verdict}")
    print()
    print(f"probe cost per healthy path per round ({args.paths} paths probed concurrently, {args.rounds} rounds)")
    print(f"{'measure':<30}{'ours':>12}{'anchor':>12}{'ratio':>8}  anchor")
    print(row("wall", cost["wall"], cost["spawn_wall"], "bare `python -I -S -c pass`, one at a time"))
    print(row("CPU, parent + child", cost["cpu"], cost["spawn_cpu"], "CPU of a bare `python -I -S -c pass`"))
    print(row("CPU, parent + child", cost["cpu"], cost["inproc_cpu"], "the same probe in-process (no child)"))


if __name__ == "__main__":
    main()
