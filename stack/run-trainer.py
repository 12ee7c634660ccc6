"""The compose trainer: ``warden ARGS`` (``train ...``), and after a run that ended well, a quiet target.

A training run ends; its container should not page. Prometheus scrapes ``trainer:9460``
and ``WardenTargetDown`` pages when that stops answering, so a plain one-shot trainer
pages at every normal end of run. This wrapper:

- runs ``warden ARGS`` (the service's command, ``train --config ...``) and forwards SIGTERM/SIGINT to it;
- exit status != 0 (a crash, an OOM, a refused resume): exits with it, so the bounded
  ``restart: on-failure:N`` retries (``--resume auto``) and then the target goes down and pages;
- exit status 0: keeps answering on the same port with ``warden_trainer_run_finished 1``
  (and no step/checkpoint timestamps, so no progress alert can fire) until stopped.

Environment: WARDEN_METRICS_LISTEN (default 0.0.0.0) and WARDEN_METRICS_PORT (default 9460),
the address and port the trainer's own /metrics used.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import time


def serve_finished(listen: str, port: int, finished_at: float) -> None:
    body = (
        "# HELP warden_trainer_run_finished 1: the run in this container ended normally and the trainer exited.\n"
        "# TYPE warden_trainer_run_finished gauge\n"
        "warden_trainer_run_finished 1\n"
        "# HELP warden_trainer_run_finished_timestamp_seconds When the trainer exited (Unix time).\n"
        "# TYPE warden_trainer_run_finished_timestamp_seconds gauge\n"
        f"warden_trainer_run_finished_timestamp_seconds {finished_at:.3f}\n"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/healthz"):
                payload = body if path == "/metrics" else b"run finished\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            else:
                self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
            pass

    deadline = time.monotonic() + 30
    while True:  # the trainer's own server may still hold the port for a moment
        try:
            server = http.server.ThreadingHTTPServer((listen, port), Handler)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"run-trainer: the run ended; serving warden_trainer_run_finished on {listen}:{port}", flush=True)
    server.serve_forever()


def main(argv: list[str]) -> int:
    child = subprocess.Popen(["warden", *argv])

    stopping = []

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    if code != 0:
        print(f"run-trainer: warden {' '.join(argv[:1])} exited with {code}", file=sys.stderr, flush=True)
        return code if code > 0 else 128 - code
    if stopping:  # stopped from outside: the container ends with the trainer
        return 0
    listen = os.environ.get("WARDEN_METRICS_LISTEN", "0.0.0.0")
    serve_finished(listen, int(os.environ.get("WARDEN_METRICS_PORT", "9460")), time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
