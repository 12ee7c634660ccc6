"""Container healthcheck that probes what Prometheus scrapes: the service's port on the
container's own network address (not loopback), so a server bound to 127.0.0.1 is unhealthy.

    python /opt/warden/stack/healthcheck.py PORT [PATH ...]     (default paths: /metrics)

Exit 0 when every path answers 200 within the timeout, 1 otherwise (one line on stderr).
"""

from __future__ import annotations

import socket
import sys
import urllib.request


def own_address() -> str:
    """The address the compose network gives this container (what `<service>:PORT` resolves to)."""
    name = socket.gethostname()
    try:
        for family, _, _, _, sockaddr in socket.getaddrinfo(name, None, socket.AF_INET):
            if family == socket.AF_INET and not str(sockaddr[0]).startswith("127."):
                return str(sockaddr[0])
    except OSError:
        pass
    # /etc/hosts may map the hostname to loopback only: take the address of the default route.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        return str(sock.getsockname()[0])


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: healthcheck.py PORT [PATH ...]", file=sys.stderr)
        return 2
    port, paths = int(argv[0]), argv[1:] or ["/metrics"]
    host = own_address()
    for path in paths:
        url = f"http://{host}:{port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=4) as resp:
                resp.read(1 << 20)
                if resp.status != 200:
                    print(f"{url}: HTTP {resp.status}", file=sys.stderr)
                    return 1
        except Exception as exc:  # any failure is "unhealthy", said in one line
            print(f"{url}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
