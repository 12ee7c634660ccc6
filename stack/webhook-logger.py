"""The stack's default Alertmanager receiver: logs every webhook notification it gets.

Alertmanager's receivers (alerts/alertmanager.yml) post to http://webhook-logger:9097/<receiver>
(pager, ticket, deadman) until an operator points them at the real integrations (mount
another alertmanager.yml, WARDEN_ALERTMANAGER_CONFIG). Each notification is one JSON line
in $WEBHOOK_LOG (default /var/lib/warden/webhook/notifications.jsonl) and on stdout:

    {"receiver": "pager", "received_at": 1767000000.0, "payload": {...Alertmanager's body...}}

GET /notifications returns them all as a JSON list (what the compose test reads);
GET /healthz answers 200. Standard library only.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
import time

LOG = os.environ.get("WEBHOOK_LOG", "/var/lib/warden/webhook/notifications.jsonl")
MAX_BODY = 4 << 20
lock = threading.Lock()


def read_all() -> list[object]:
    try:
        with open(LOG, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            self.send_error(413 if length > MAX_BODY else 400)
            return
        try:
            payload = json.loads(self.rfile.read(length))
        except ValueError:
            self.send_error(400, "body is not JSON")
            return
        receiver = self.path.strip("/").split("?", 1)[0] or "default"
        line = json.dumps({"receiver": receiver, "received_at": time.time(), "payload": payload}, sort_keys=True)
        with lock, open(LOG, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        alerts = payload.get("alerts") if isinstance(payload, dict) else None
        names = sorted({str(a.get("labels", {}).get("alertname")) for a in alerts or [] if isinstance(a, dict)})
        status = payload.get("status") if isinstance(payload, dict) else None
        print(f"webhook-logger: {receiver}: {status} {','.join(names)}", flush=True)
        self._reply(200, b"ok\n", "text/plain")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        elif path == "/notifications":
            with lock:
                body = json.dumps(read_all()).encode()
            self._reply(200, body, "application/json")
        else:
            self._reply(404, b"POST /<receiver>; GET /notifications or /healthz\n", "text/plain")

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> int:
    listen = os.environ.get("WEBHOOK_LISTEN", "0.0.0.0")
    port = int(os.environ.get("WEBHOOK_PORT", "9097"))
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    server = http.server.ThreadingHTTPServer((listen, port), Handler)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"webhook-logger: listening on {listen}:{port}, logging to {LOG}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
