"""One-shot of the compose stack: wait for SeaweedFS' S3, create the archive bucket with Object Lock.

Environment: AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, WARDEN_BUCKET
(default warden-archive). Exit 0 when the bucket exists (created now or before).
"""

from __future__ import annotations

import os
import sys

from sidecars.stack.s3 import ensure_bucket


def main() -> int:
    bucket = os.environ.get("WARDEN_BUCKET", "warden-archive")
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    ensure_bucket(
        endpoint,
        bucket,
        os.environ["AWS_ACCESS_KEY_ID"],
        os.environ["AWS_SECRET_ACCESS_KEY"],
        object_lock=True,
        timeout=float(os.environ.get("WARDEN_BUCKET_TIMEOUT", "120")),
    )
    print(f"init-bucket: s3://{bucket} at {endpoint} is ready (Object Lock)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
