"""``warden deps osv-serve``: the offline database as an OSV-compatible HTTP API.

``POST /v1/query``, ``POST /v1/querybatch`` and ``GET /v1/vulns/<id>``, answered from the
same loaded database and the same matcher as ``warden deps audit``, so that
``pip-audit -s osv --osv-url http://127.0.0.1:PORT/v1/query`` runs fully offline and its
findings can be compared with ours. Only the PyPI ecosystem is served; withdrawn records
are left out of query results (but ``/v1/vulns/<id>`` still returns them).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from packaging.utils import canonicalize_name

from warden.deps.osv.loader import OsvDatabase

MAX_BODY = 1024 * 1024
_PURL = re.compile(r"^pkg:pypi/(?P<name>[^@?#]+)(?:@(?P<version>[^?#]+))?")


class QueryError(ValueError):
    """A query the API answers with 400."""


def _package_version(query: Any) -> tuple[str | None, str | None]:
    """(canonical name or None for another ecosystem, version or None)."""
    if not isinstance(query, dict):
        raise QueryError("a query must be a JSON object")
    if "commit" in query:
        raise QueryError("commit queries are not supported by this offline server")
    pkg = query.get("package") or {}
    if not isinstance(pkg, dict):
        raise QueryError("package must be an object")
    version = query.get("version")
    if "purl" in pkg:
        m = _PURL.match(str(pkg["purl"]))
        if not m:
            return None, None
        return canonicalize_name(unquote(m.group("name"))), version or (
            m.group("version") and unquote(m.group("version"))
        )
    if not isinstance(pkg.get("name"), str):
        raise QueryError("package.name is required")
    if pkg.get("ecosystem") not in ("PyPI", None):
        return None, None
    if version is not None and not isinstance(version, str):
        raise QueryError("version must be a string")
    return canonicalize_name(pkg["name"]), version


def answer_query(db: OsvDatabase, query: Any) -> list[dict[str, Any]]:
    """The raw records a ``/v1/query`` returns. Raises QueryError."""
    name, version = _package_version(query)
    if name is None:
        return []
    candidates = db.by_package.get(name, [])
    if version is None:
        return [dict(r.raw) for r in candidates if not r.withdrawn]
    hits, _ = db.query(name, version)
    return [dict(r.raw) for r in hits]


class OsvServer:
    """Serves ``db`` on ``host:port`` (``port=0``: a free one, see ``.port``) in a daemon thread."""

    def __init__(self, db: OsvDatabase, host: str = "127.0.0.1", port: int = 0) -> None:
        self.db = db
        self._server = ThreadingHTTPServer((host, port), _make_handler(self))
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="osv-http", daemon=True)

    @property
    def query_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1/query"

    def start(self) -> OsvServer:
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _make_handler(owner: OsvServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path.startswith("/v1/vulns/"):
                rec = owner.db.records.get(unquote(path[len("/v1/vulns/") :]))
                if rec is None:
                    self._json(404, {"code": 5, "message": "Bug not found."})
                else:
                    self._json(200, dict(rec.raw))
            elif path in ("/", "/healthz"):
                self._json(
                    200, {"records": len(owner.db.records), "path": owner.db.path, "errors": len(owner.db.errors)}
                )
            else:
                self._json(404, {"code": 5, "message": "Not found: try POST /v1/query"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                body = self._body()
                if path == "/v1/query":
                    vulns = answer_query(owner.db, body)
                    self._json(200, {"vulns": vulns} if vulns else {})
                elif path == "/v1/querybatch":
                    queries = body.get("queries") if isinstance(body, dict) else None
                    if not isinstance(queries, list):
                        raise QueryError("querybatch needs {'queries': [...]}")
                    results = []
                    for q in queries:
                        found = [{"id": v["id"], "modified": v.get("modified")} for v in answer_query(owner.db, q)]
                        results.append({"vulns": found} if found else {})
                    self._json(200, {"results": results})
                else:
                    self._json(404, {"code": 5, "message": "Not found"})
            except QueryError as exc:
                self._json(400, {"code": 3, "message": str(exc)})

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise QueryError(f"request body over {MAX_BODY} bytes")
            try:
                return json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                raise QueryError("request body is not JSON") from None

        def _json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler
