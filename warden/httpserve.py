"""A tiny HTTP server for ``/metrics`` and ``/healthz`` that never blocks on the sidecar.

Scrapes render the registry from in-memory values only, so a sidecar whose own work is
stuck on a hung filesystem still answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MetricsServer:
    """Serves ``registry`` on ``host:port`` in a daemon thread.

    ``health`` returns (ok, message); ``/healthz`` answers 200 or 503 with the message.
    ``port=0`` picks a free port; read it back from ``.port``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        health: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
    ) -> None:
        handler = _make_handler(registry, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _make_handler(registry: CollectorRegistry, health: Callable[[], tuple[bool, str]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, message = health()
                self._reply(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._reply(404, b"try /metrics or /healthz\n", "text/plain; charset=utf-8")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes every few seconds would drown the JSON log

    return Handler
