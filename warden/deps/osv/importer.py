"""``warden deps osv-import``: puts an OSV export where the audit reads it, with its download time.

The export (``https://`` URL, e.g. ``https://osv-vulnerabilities.storage.googleapis.com/PyPI/all.zip``,
or a local zip) is written atomically to ``dest``, then ``<dest>.meta.json`` (loader.py: the format)
with ``downloaded_at``: the server's ``Date`` header of the download; without one, or for a local
file, the ``--date`` given (e.g. the ``Date`` curl recorded with ``-D``), else this machine's clock.
Since the audit takes the older of that time and the export's newest record, a wrong clock here can
only make the data look older.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import time
import urllib.request
from collections.abc import Callable, Mapping

from warden.deps.errors import DepsConfigError
from warden.deps.osv.loader import build_meta, meta_path
from warden.safeio import atomic_write_bytes, read_regular

MAX_EXPORT_BYTES = 2 * 1024 * 1024 * 1024


def server_date(headers: Mapping[str, str]) -> float | None:
    """The ``Date`` header as a timestamp (pure); None when absent or unparsable."""
    value = next((v for k, v in headers.items() if k.lower() == "date"), None)
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _download(url: str, timeout: float) -> tuple[bytes, dict[str, str]]:
    if not url.startswith("https://"):
        raise DepsConfigError(f"{url}: only https:// downloads (or a local file)")
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data = resp.read(MAX_EXPORT_BYTES + 1)
        headers = dict(resp.headers.items())
    if len(data) > MAX_EXPORT_BYTES:
        raise DepsConfigError(f"{url}: larger than {MAX_EXPORT_BYTES} bytes")
    return data, headers


def import_export(
    source: str,
    dest: str,
    date: float | None = None,
    clock: Callable[[], float] = time.time,
    fetch: Callable[[str, float], tuple[bytes, dict[str, str]]] = _download,
    timeout: float = 600.0,
) -> bytes:
    """Writes the export and its metadata; returns the metadata document."""
    if "://" in source:
        data, headers = fetch(source, timeout)
        when, how = server_date(headers), "server-date"
    else:
        try:
            data, headers = read_regular(source, MAX_EXPORT_BYTES), {}
        except OSError as exc:
            raise DepsConfigError(f"{source}: not a readable regular file ({exc.strerror or exc})") from None
        when, how = None, "server-date"
    if when is None:
        when, how = (date, "given") if date is not None else (clock(), "local-clock")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    atomic_write_bytes(dest, data)
    meta = build_meta(source, when, how, hashlib.sha256(data).hexdigest())
    atomic_write_bytes(meta_path(dest), meta)
    return meta
